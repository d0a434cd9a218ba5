"""The JoinBolt's window buffer: count and time windows, tumbling and sliding, processing and
event time, late records, and checkpoint round trips."""

from __future__ import annotations

import json

import pytest

from stream_ops.errors import StateError
from stream_ops.operators.window_buffer import WindowBuffer
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
def test_state_restore_round_trip_continues_exactly(window):
    items = [("a", {"n": i, "ts": i * 3, "nested": {"x": [i]}}, float(i * 3)) for i in range(12)]

    def run(split: int | None) -> list:
        buffer = WindowBuffer(window, now=0.0, channels=["0/0"])
        out = []
        for i, (stream, record, now) in enumerate(items):
            if i == split:
                snapshot = json.loads(json.dumps(buffer.state(now)))
                buffer = WindowBuffer(window, now=now, channels=["0/0"])
                buffer.restore(snapshot, now)
            out.append(buffer.add([(stream, record)], now, progress=[("0/0", float(record["ts"]))]).windows)
        return out

    assert run(5) == run(None)


def test_restore_refuses_another_window_or_garbage():
    buffer = WindowBuffer(WindowDef.build(Tumbling(Records.of(2))), now=0.0)
    _add(buffer, "a", 1, 0.0)
    with pytest.raises(StateError, match="taken with tumbling 2 records"):
        WindowBuffer(WindowDef.build(Tumbling(Records.of(3))), now=0.0).restore(buffer.state(0.0), 0.0)
    with pytest.raises(StateError, match="not a window buffer snapshot"):
        WindowBuffer(WindowDef.build(Tumbling(Records.of(2))), now=0.0).restore({"version": 2}, 0.0)


def test_restore_refuses_a_snapshot_without_the_current_format():
    unversioned = {"count": 3, "start": None, "records": [["a", {"n": 1}], ["b", {"n": 2}]]}
    with pytest.raises(StateError, match="not a window buffer snapshot of format 2"):
        WindowBuffer(WindowDef.build(Tumbling(Records.of(3))), now=0.0).restore(unversioned, now=0.0)


def test_state_refuses_records_json_cannot_hold():
    buffer = WindowBuffer(WindowDef.build(Tumbling(Records.of(5))), now=0.0)
    buffer.add([("a", {"when": object()})], now=0.0)
    with pytest.raises(StateError, match="not JSON-able"):
        buffer.state(0.0)
