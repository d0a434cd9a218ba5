"""The JoinBolt's window buffer: count and time windows, tumbling and sliding, processing and
event time, late records; the same results as the original rescanning buffer on random input;
state as entries a batch writes only where it changed them, restored exactly."""

from __future__ import annotations

import itertools
import json
import math
import random
from typing import Any

import pytest
from rescanning_window_buffer import RescanningWindowBuffer

from stream_ops.errors import StateError
from stream_ops.operators.join_bolt import JoinBolt
from stream_ops.operators.window_buffer import META, PREFIX, SNAPSHOT_KEY, WindowBuffer
from stream_ops.state.keys import as_key
from stream_ops.topology.windows import Records, Sliding, Tumbling, WindowDef


def _add(buffer: WindowBuffer, stream: str, n: int, now: float):
    return buffer.add([(stream, {"n": n})], now).windows


def test_count_window_closes_after_n_records_of_all_streams():
    buffer = WindowBuffer(WindowDef.build(Tumbling(Records.of(3))), now=0.0)
    assert _add(buffer, "a", 1, 0.0) == []
    assert _add(buffer, "b", 2, 100.0) == []  # time plays no part
    assert _add(buffer, "a", 3, 200.0) == [[("a", {"n": 1}), ("b", {"n": 2}), ("a", {"n": 3})]]
    assert buffer.pending == 0
    assert _add(buffer, "a", 4, 300.0) == []
    assert buffer.flush(now=10_000.0) == []
    assert buffer.flush(now=10_000.0, force=True) == [[("a", {"n": 4})]]
    assert buffer.flush(now=10_000.0, force=True) == []


def test_sliding_count_window_emits_the_last_length_every_slide():
    buffer = WindowBuffer(WindowDef.build(Sliding(Records.of(3), Records.of(2))), now=0.0)
    out = buffer.add([("a", {"n": i}) for i in range(1, 6)], now=0.0).windows
    assert [[r["n"] for _, r in w] for w in out] == [[1, 2], [2, 3, 4]]
    assert [[r["n"] for _, r in w] for w in buffer.add([("a", {"n": 6})], now=0.0).windows] == [[4, 5, 6]]


def test_time_window_is_aligned_and_closes_when_now_reaches_its_end():
    buffer = WindowBuffer(WindowDef.build(Tumbling(10)), now=0.0)
    assert _add(buffer, "a", 1, 13.0) == []  # window [10, 20)
    assert _add(buffer, "b", 2, 19.999) == []
    assert buffer.flush(now=19.999) == []
    assert _add(buffer, "a", 3, 20.0) == [[("a", {"n": 1}), ("b", {"n": 2})]]  # opens [20, 30)
    assert buffer.flush(now=29.0) == []
    assert buffer.flush(now=30.0) == [[("a", {"n": 3})]]
    assert buffer.flush(now=40.0) == []  # empty windows are never returned


def test_time_window_after_a_gap_starts_at_the_new_time():
    buffer = WindowBuffer(WindowDef.build(Tumbling(10)), now=0.0)
    _add(buffer, "a", 1, 5.0)
    assert _add(buffer, "a", 2, 35.0) == [[("a", {"n": 1})]]
    assert buffer.flush(now=39.0) == []
    assert buffer.flush(now=40.0) == [[("a", {"n": 2})]]


def test_sliding_time_windows_share_records():
    buffer = WindowBuffer(WindowDef.build(Sliding(10, 5)), now=0.0)
    out = _add(buffer, "a", 1, 3.0) + _add(buffer, "a", 2, 8.0) + _add(buffer, "a", 3, 12.0) + buffer.flush(now=20.0)
    # [-5, 5) closes at 8, [0, 10) at 12, [5, 15) and [10, 20) at 20
    assert [[r["n"] for _, r in w] for w in out] == [[1], [1, 2], [2, 3], [3]]


def test_event_time_windows_follow_the_watermark_and_set_late_records_aside():
    """The upstream task (channel 0/0) reports the largest event time it sent with each batch."""
    window = WindowDef.build(Tumbling(10), time="event", timestamp_field="ts", lag=2, idle_timeout=None)
    buffer = WindowBuffer(window, now=0.0, channels=["0/0"])
    out = buffer.add([("a", {"ts": 3}), ("b", {"ts": 9}), ("a", {"ts": 11})], now=0.0, progress=[("0/0", 11.0)])
    assert out.windows == []  # watermark 9
    items = [("b", {"ts": 4}), ("a", {"ts": 12}), ("b", {"ts": 2}), ("a", {"ts": 13})]
    out = buffer.add(items, now=1.0, progress=[("0/0", 13.0)])
    assert out.late == [("b", {"ts": 4}), ("b", {"ts": 2})]
    assert out.windows == [[("a", {"ts": 3}), ("b", {"ts": 9})]]  # watermark 11
    out = buffer.add([("a", {"ts": "soon"})], now=2.0)
    assert out.dead[0]["error"] == "no usable event time in field 'ts'"


# --- the same results as the rescanning buffer --------------------------------------------------

CHANNELS = ["0/0", "1/0"]
WINDOWS = {
    "tumbling-time": WindowDef.build(Tumbling(10)),
    "sliding-time": WindowDef.build(Sliding(10, 5)),
    "sliding-uneven": WindowDef.build(Sliding(10, 4)),
    "sliding-fractional": WindowDef.build(Sliding(1, 0.3)),
    "tumbling-event": WindowDef.build(Tumbling(10), time="event", timestamp_field="ts", lag=2),
    "sliding-event": WindowDef.build(Sliding(10, 3), time="event", timestamp_field="ts", lag=4),
    "sliding-event-idle": WindowDef.build(Sliding(6, 2), time="event", timestamp_field="ts", lag=1, idle_timeout=5),
    "tumbling-event-ms": WindowDef.build(Tumbling(2.5), time="event", timestamp_field="ts", timestamp_unit="ms", lag=0.5),
    "tumbling-count": WindowDef.build(Tumbling(Records.of(7))),
    "sliding-count": WindowDef.build(Sliding(Records.of(7), Records.of(3))),
}


class Store:
    """A task's store as the buffer sees it: entries through JSON, as RocksDB and the state topic keep them."""

    def __init__(self) -> None:
        self.entries: dict[tuple, Any] = {}

    def apply(self, buffer: WindowBuffer, now: float) -> tuple[list, list]:
        puts, deletes = buffer.changes(now)
        assert not {key for key, _ in puts} & set(deletes)
        for key in deletes:
            assert key in self.entries, f"deleting {key!r}, which was never written"
            del self.entries[key]
        for key, value in puts:
            self.entries[as_key(json.loads(json.dumps(list(key))))] = json.loads(json.dumps(value))
        return puts, deletes

    def restored(self, window: WindowDef, now: float, channels: list[str] = CHANNELS) -> WindowBuffer:
        buffer = WindowBuffer(window, now=now, channels=channels)
        buffer.restore(list(self.entries.items()), now)
        return buffer


def _random_batch(rng: random.Random, window: WindowDef, clock: float, ids: itertools.count, order: str) -> list:
    items = []
    for _ in range(rng.choice([0, 1, 3, 8, 20])):
        if order == "ordered":
            ts = clock + rng.uniform(-1.0, 1.0)
        else:
            ts = clock + rng.uniform(-15.0, 5.0)  # late ones among them
        record: dict[str, Any] = {
            "id": next(ids),
            "k": rng.randrange(4),
            "ts": ts * 1000 if window.timestamp_unit == "ms" else ts,
        }
        if rng.random() < 0.04:
            del record["ts"]  # no event time: a dead letter
        items.append((rng.choice("ab"), record))
    return items


def _drive(window: WindowDef, seed: int, order: str, steps: int = 160) -> None:
    """Feed the new and the rescanning buffer the same random batches, ticks, clocks going
    back, changes taken now and then and moves (a restore from the entries), comparing everything."""
    rng = random.Random(seed)
    new = WindowBuffer(window, now=0.0, channels=CHANNELS)
    old = RescanningWindowBuffer(window, now=0.0, channels=CHANNELS)
    store = Store()
    ids = itertools.count()
    clock = now = 0.0
    accepted_since_changes = 0
    for step in range(steps):
        clock += rng.uniform(0.0, 2.5)
        now = now + rng.uniform(0.0, 2.0) if rng.random() > 0.08 else now - rng.uniform(0.0, 15.0)  # a clock that goes back
        if rng.random() < 0.2:
            assert new.flush(now) == old.flush(now), f"tick at step {step}"
        else:
            items = _random_batch(rng, window, clock, ids, order)
            progress = [(c, clock + rng.uniform(-3.0, 0.0)) for c in CHANNELS if rng.random() < 0.8]
            got, want = new.add(items, now, progress=progress), old.add(items, now, progress=progress)
            assert (got.windows, got.late, got.dead) == (want.windows, want.late, want.dead), f"batch at step {step}"
            accepted_since_changes += len(items) - len(got.late) - len(got.dead)
        assert new.pending == old.pending
        if rng.random() < 0.7:
            puts, _ = store.apply(new, now)
            written = sum(len(value) for key, value in puts if key != META)
            assert written <= accepted_since_changes  # only what arrived since: never the whole buffer again
            accepted_since_changes = 0
            if rng.random() < 0.15:  # the task moves: a new owner rebuilds the buffer from the entries
                new = store.restored(window, now)
                if old.watermark is not None:
                    old.watermark.restore(json.loads(json.dumps(old.watermark.state(now))), now)
                assert new.pending == old.pending, f"restored at step {step}"
    assert new.flush(now, force=True) == old.flush(now, force=True)
    store.apply(new, now)
    assert [key for key in store.entries if key != META] == []


@pytest.mark.parametrize("name", list(WINDOWS))
@pytest.mark.parametrize("order", ["ordered", "shuffled"])
@pytest.mark.parametrize("seed", range(4))
def test_windows_match_the_rescanning_buffer_on_random_input(name, order, seed):
    _drive(WINDOWS[name], seed, order)


@pytest.mark.parametrize("how", ["join", "left_join", "right_join", "outer_join"])
@pytest.mark.parametrize("name", ["sliding-event", "tumbling-event", "sliding-count"])
def test_joins_over_the_buffer_match_the_rescanning_buffer(how, name):
    window = WINDOWS[name]
    bolt = getattr(JoinBolt("a", "k"), how)("b", "k", "a").select("k, a:id, b:id as b_id")
    rng = random.Random(f"{how}-{name}")
    new = WindowBuffer(window, now=0.0, channels=CHANNELS)
    old = RescanningWindowBuffer(window, now=0.0, channels=CHANNELS)
    ids = itertools.count()
    rows_new: list = []
    rows_old: list = []
    clock = 0.0
    for _ in range(120):
        clock += rng.uniform(0.0, 2.0)
        items = _random_batch(rng, window, clock, ids, "shuffled")
        progress = [(c, clock) for c in CHANNELS]
        rows_new += [bolt.execute(w) for w in new.add(items, clock, progress=progress).windows]
        rows_old += [bolt.execute(w) for w in old.add(items, clock, progress=progress).windows]
    rows_new += [bolt.execute(w) for w in new.flush(clock, force=True)]
    rows_old += [bolt.execute(w) for w in old.flush(clock, force=True)]
    assert rows_new == rows_old
    assert sum(map(len, rows_new)) > 50  # the windows did join something


# --- state as entries -----------------------------------------------------------------------------


def _event_buffer() -> WindowBuffer:
    window = WindowDef.build(Tumbling(10), time="event", timestamp_field="ts", lag=2)
    return WindowBuffer(window, now=0.0, channels=["0/0"])


def test_a_batch_writes_the_records_it_added_by_pane_and_deletes_the_panes_that_closed():
    buffer = _event_buffer()
    batch = buffer.add([("a", {"ts": 3}), ("b", {"ts": 12}), ("a", {"ts": 5})], now=0.0, progress=[("0/0", 11.0)])
    assert batch.windows == []  # watermark 9
    puts, deletes = buffer.changes(0.0)
    assert puts[:2] == [
        ((PREFIX, "t", 0, 0), [[0, 3.0, "a", {"ts": 3}], [2, 5.0, "a", {"ts": 5}]]),
        ((PREFIX, "t", 0, 1), [[1, 12.0, "b", {"ts": 12}]]),
    ]
    assert puts[2][0] == META and puts[2][1]["seq"] == 3 and deletes == []

    batch = buffer.add([("b", {"ts": 15})], now=1.0, progress=[("0/0", 14.0)])
    assert batch.windows == [[("a", {"ts": 3}), ("a", {"ts": 5})]]  # watermark 12 closes [0, 10)
    puts, deletes = buffer.changes(1.0)
    assert [key for key, _ in puts] == [(PREFIX, "t", 3, 1), META]
    assert puts[0][1] == [[3, 15.0, "b", {"ts": 15}]]
    assert deletes == [(PREFIX, "t", 0, 0)]

    buffer.add([], now=2.0)  # a tick that changes nothing writes nothing
    assert buffer.changes(2.0) == ([], [])


def test_records_of_a_window_that_closes_in_the_batch_they_came_in_are_never_written():
    buffer = _event_buffer()
    batch = buffer.add([("a", {"ts": 3}), ("b", {"ts": 4}), ("a", {"ts": 21})], now=0.0, progress=[("0/0", 21.0)])
    assert batch.windows == [[("a", {"ts": 3}), ("b", {"ts": 4})]]
    puts, deletes = buffer.changes(0.0)
    assert [key for key, _ in puts] == [(PREFIX, "t", 0, 2), META] and deletes == []


def test_a_count_window_entry_is_deleted_once_its_records_all_left_the_window():
    buffer = WindowBuffer(WindowDef.build(Sliding(Records.of(3), Records.of(1))), now=0.0)
    buffer.add([("a", {"n": 1}), ("a", {"n": 2})], now=0.0)
    first, _ = buffer.changes(0.0)
    assert first[0] == ((PREFIX, "c", 0), [[0, 0.0, "a", {"n": 1}], [1, 0.0, "a", {"n": 2}]])
    buffer.add([("a", {"n": 3})], now=0.0)
    assert buffer.changes(0.0)[1] == []  # the window is 1, 2, 3
    buffer.add([("a", {"n": 4})], now=0.0)
    assert buffer.changes(0.0)[1] == []  # 2, 3, 4: record 2 of the first entry is still in it
    buffer.add([("a", {"n": 5})], now=0.0)
    puts, deletes = buffer.changes(0.0)
    assert deletes == [(PREFIX, "c", 0)]
    assert [key for key, _ in puts] == [(PREFIX, "c", 4), META]


@pytest.mark.parametrize(
    "window",
    [
        WindowDef.build(Tumbling(Records.of(3))),
        WindowDef.build(Sliding(Records.of(3), Records.of(2))),
        WindowDef.build(Tumbling(10)),
        WindowDef.build(Sliding(10, 4)),
        WindowDef.build(Sliding(10, 5), time="event", timestamp_field="ts", lag=3, idle_timeout=None),
    ],
    ids=["count", "sliding-count", "time", "sliding-time", "event"],
)
def test_restore_from_the_entries_continues_exactly(window):
    items = [("a", {"n": i, "ts": i * 3, "nested": {"x": [i]}}, float(i * 3)) for i in range(12)]

    def run(split: int | None) -> list:
        buffer = WindowBuffer(window, now=0.0, channels=["0/0"])
        store = Store()
        out = []
        for i, (stream, record, now) in enumerate(items):
            if i == split:
                buffer = store.restored(window, now, ["0/0"])
            out.append(buffer.add([(stream, record)], now, progress=[("0/0", float(record["ts"]))]).windows)
            store.apply(buffer, now)
        return out

    assert run(5) == run(None)


def test_restore_reads_a_format_2_snapshot_and_the_next_change_replaces_it_with_entries():
    window = WindowDef.build(Tumbling(10), time="event", timestamp_field="ts", lag=2)
    snapshot = {
        "version": 2,
        "window": window.to_spec(),
        "items": [[3.0, "a", {"ts": 3}], [12.0, "b", {"ts": 12}]],
        "since_emit": 0,
        "next_end": None,
        "watermark": {"floor": 9.0, "channels": {"0/0": 11.0}},
    }
    buffer = WindowBuffer(window, now=0.0, channels=["0/0"])
    assert buffer.restore([(SNAPSHOT_KEY, snapshot), (("other", "key"), 1)], now=5.0) == 1
    assert buffer.pending == 2
    puts, deletes = buffer.changes(5.0)
    assert deletes == [SNAPSHOT_KEY]
    assert puts[:2] == [((PREFIX, "t", 0, 0), [[0, 3.0, "a", {"ts": 3}]]), ((PREFIX, "t", 0, 1), [[1, 12.0, "b", {"ts": 12}]])]
    assert buffer.add([], now=6.0, progress=[("0/0", 12.5)]).windows == [[("a", {"ts": 3})]]


def test_restore_refuses_another_window_or_garbage():
    store = Store()
    buffer = WindowBuffer(WindowDef.build(Tumbling(Records.of(2))), now=0.0)
    _add(buffer, "a", 1, 0.0)
    store.apply(buffer, 0.0)
    with pytest.raises(StateError, match="taken with tumbling 2 records"):
        store.restored(WindowDef.build(Tumbling(Records.of(3))), 0.0)
    with pytest.raises(StateError, match="not a window buffer state"):
        WindowBuffer(WindowDef.build(Tumbling(Records.of(2))), now=0.0).restore([(META, {"version": 3})], 0.0)
    with pytest.raises(StateError, match="without their meta entry"):
        WindowBuffer(WindowDef.build(Tumbling(Records.of(2))), now=0.0).restore([((PREFIX, "c", 0), [])], 0.0)
    with pytest.raises(StateError, match="are not of a tumbling 10"):
        WindowBuffer(WindowDef.build(Tumbling(10)), now=0.0).restore(
            [(META, {**store.entries[META], "window": WindowDef.build(Tumbling(10)).to_spec()}), ((PREFIX, "c", 0), [])], 0.0
        )


def test_restore_refuses_a_snapshot_without_the_current_format():
    unversioned = {"count": 3, "start": None, "records": [["a", {"n": 1}], ["b", {"n": 2}]]}
    with pytest.raises(StateError, match="not a window buffer state of format 2"):
        WindowBuffer(WindowDef.build(Tumbling(Records.of(3))), now=0.0).restore([(SNAPSHOT_KEY, unversioned)], now=0.0)


@pytest.mark.parametrize("value", [object(), math.nan], ids=["object", "nan"])
def test_changes_refuse_records_json_cannot_hold(value):
    buffer = WindowBuffer(WindowDef.build(Tumbling(Records.of(5))), now=0.0)
    buffer.add([("a", {"when": value})], now=0.0)
    with pytest.raises(StateError, match="not JSON-able"):
        buffer.changes(0.0)
