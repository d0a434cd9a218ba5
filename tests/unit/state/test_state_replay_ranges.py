"""The key-range partitioned replay: the same rows as one unpartitioned pass, in the same order.

The reference is :func:`last_per_key` over all rows (and, for whole replays, ``replay_changes``
and the generic restore). Small ``_RANGE_ROWS`` make tiny queues take the partitioned path.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from state_store_bytes import raw_items

from stream_ops.errors import ReplayError
from stream_ops.state import (
    OpaqueValue,
    RocksDBBackingMap,
    StateTopicQueue,
    TransactionalValue,
    rebuild_store,
    snapshot,
    state_topic,
    write_snapshot,
)
from stream_ops.state.snapshot import open_restore_source
from stream_ops.state.state_batch_arrow import (
    key_pivots,
    key_ranges,
    last_per_key,
    last_per_key_of,
    range_ids,
    range_rows,
    read_ahead,
)
from stream_ops.state.state_topic import replay_arrow_changes, replay_changes
from stream_ops.topics.file_topic import FileTopic


def partitioned(keys: pa.Array, pivots: pa.Array) -> np.ndarray:
    """The winners of every range of ``keys`` cut at ``pivots``, ranges in order."""
    parts = [last_per_key_of(keys, rows) for rows in key_ranges(keys, pivots)]
    return np.concatenate(parts) if parts else np.array([], np.int64)


def unpartitioned(keys: pa.Array) -> list[int]:
    return last_per_key(keys).to_pylist()


KEY_SETS: list[list[str]] = [
    [],
    ['["a"]'],
    ['["a"]'] * 7,  # all keys equal
    ['["b"]', '["a"]', '["b"]', '["c"]', '["a"]', '["a"]'],
    [f'["k{i % 13}"]' for i in range(100)],
    ['["a"]', '["a\\u0000"]', '["ab"]', '["a"]', '["\u00e4"]', '["z"]', '["ab"]'],  # prefixes and non-ASCII bytes
]


@pytest.mark.parametrize("texts", KEY_SETS)
@pytest.mark.parametrize("ranges", [1, 2, 3, 8, 50])
def test_ranges_from_sampled_pivots_give_the_unpartitioned_winners(texts: list[str], ranges: int) -> None:
    keys = pa.array(texts, pa.string())
    pivots = key_pivots(keys, ranges)
    assert len(pivots) <= max(0, ranges - 1)
    assert pivots.to_pylist() == sorted(set(pivots.to_pylist()))  # ascending, distinct
    assert partitioned(keys, pivots).tolist() == unpartitioned(keys)


@pytest.mark.parametrize("seed", range(6))
def test_ranges_cut_at_any_pivots_give_the_unpartitioned_winners(seed: int) -> None:
    rng = random.Random(seed)
    words = [f'["w{rng.randrange(40)}"]' for _ in range(300)]
    keys = pa.array(words, pa.string())
    # pivots equal to keys, between keys, below and above them all
    candidates = sorted({*rng.sample(words, 5), '["w1x"]', '["v"]', '["zz"]', '["a"]'})
    pivots = pa.array(sorted(rng.sample(candidates, rng.randrange(1, len(candidates)))), pa.string())
    assert partitioned(keys, pivots).tolist() == unpartitioned(keys)

    bounds = [None, *pivots.to_pylist(), None]
    seen: list[int] = []
    for number, rows in enumerate(key_ranges(keys, pivots)):
        assert rows.tolist() == sorted(rows.tolist())  # offset order within a range
        low, high = bounds[number], bounds[number + 1]
        for row in rows.tolist():
            assert (low is None or words[row].encode() >= low.encode()) and (high is None or words[row].encode() < high.encode())
        seen.extend(rows.tolist())
    assert sorted(seen) == list(range(len(words)))  # every row in exactly one range


def test_range_ids_of_slices_are_those_of_the_whole() -> None:
    keys = pa.array([f'["k{i % 17}"]' for i in range(200)], pa.string())
    pivots = key_pivots(keys, 4)
    whole = range_ids(keys, pivots)
    sliced = np.concatenate([range_ids(keys.slice(start, 64), pivots) for start in range(0, 200, 64)])
    assert whole.tolist() == sliced.tolist()
    assert range_rows(whole, 0).tolist() == [row for row, number in enumerate(whole.tolist()) if number == 0]


# --- replay_arrow_changes in ranges ---------------------------------------------------------


@pytest.fixture
def queue(tmp_path: Path) -> StateTopicQueue:
    return StateTopicQueue(FileTopic(tmp_path / "state", queues=1), queue=0)


@pytest.fixture
def small_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cut replays of more than 10 entries into ranges of about 5."""
    monkeypatch.setattr(state_topic, "_RANGE_ROWS", 5)


def history(queue: StateTopicQueue, rng: random.Random, txids: int) -> None:
    """Batches over a few keys with updates and deletions."""
    pool = [(f"k{i:02d}",) for i in range(30)]
    for txid in range(1, txids + 1):
        items: list[tuple[Any, Any]] = []
        for _ in range(rng.randrange(1, 12)):
            roll = rng.random()
            value: Any = (
                None if roll < 0.25 else TransactionalValue(txid, rng.randrange(9)) if roll < 0.6 else OpaqueValue(txid, 1, None)
            )
            items.append((rng.choice(pool), value))
        queue.append(3, txid, 1, items)


def reference(queue: StateTopicQueue, after: int, committed: int, monkeypatch: pytest.MonkeyPatch) -> pa.Table:
    """The unpartitioned replay's table."""
    with monkeypatch.context() as patch:
        patch.setattr(state_topic, "_RANGE_ROWS", 10**9)
        changes = replay_arrow_changes(queue, after_txid=after, committed_txid=committed)
    assert len(changes.ranges) == 1
    return changes.table


@pytest.mark.usefixtures("small_ranges")
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_a_partitioned_replay_equals_the_unpartitioned_one(
    queue: StateTopicQueue, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    history(queue, random.Random(seed), 25)
    for after, committed in [(-1, 25), (-1, 9), (6, 25), (24, 25)]:
        changes = replay_arrow_changes(queue, after_txid=after, committed_txid=committed)
        expected = reference(queue, after, committed, monkeypatch)
        if changes.entries >= 10:
            assert len(changes.ranges) > 1
        assert changes.table.to_pylist() == expected.to_pylist()  # deleted keys included, in key order
        plain = replay_changes(queue, after_txid=after, committed_txid=committed)
        assert (changes.top_epochs, changes.files, changes.entries) == (plain.top_epochs, plain.files, plain.entries)
        live = [pair for keys, values in changes.encoded_live_chunks(rows=4) for pair in zip(keys, values, strict=True)]
        assert live == [(row["key"].encode(), row["value"].encode()) for row in expected.to_pylist() if row["value"] is not None]
        assert changes.live_at_most >= len(live)


@pytest.mark.usefixtures("small_ranges")
def test_deleted_keys_at_range_borders_stay_deleted(queue: StateTopicQueue, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = [(f"k{i:02d}",) for i in range(40)]
    queue.append(3, 1, 1, [(key, TransactionalValue(1, i)) for i, key in enumerate(keys)])
    queue.append(3, 2, 1, [(key, None) for key in keys[::2]])  # every other key deleted, pivots or not
    queue.append(3, 3, 1, [(keys[0], TransactionalValue(3, 0)), (keys[-1], None)])
    changes = replay_arrow_changes(queue, after_txid=-1, committed_txid=3)
    assert len(changes.ranges) > 1
    assert changes.table.to_pylist() == reference(queue, -1, 3, monkeypatch).to_pylist()
    live = [key for chunk, _ in changes.encoded_live_chunks() for key in chunk]
    assert live == [f'["{key[0]}"]'.encode() for i, key in enumerate(keys) if (i % 2 or i == 0) and i != 39]


@pytest.mark.usefixtures("small_ranges")
def test_all_entries_of_one_key_make_one_live_row(queue: StateTopicQueue) -> None:
    for txid in range(1, 6):
        queue.append(3, txid, 1, [(("same",), TransactionalValue(txid, txid))] * 3)
    changes = replay_arrow_changes(queue, after_txid=-1, committed_txid=5)
    assert changes.table.to_pylist() == [{"key": '["same"]', "value": '{"k":"tx","txid":5,"val":5}'}]


@pytest.mark.usefixtures("small_ranges")
def test_an_empty_replay_has_one_empty_range(queue: StateTopicQueue) -> None:
    queue.append(3, 1, 1, [])
    changes = replay_arrow_changes(queue, after_txid=-1, committed_txid=1)
    assert changes.table.num_rows == 0 and changes.live_at_most == 0
    assert list(changes.encoded_live_chunks()) == []


@pytest.mark.usefixtures("small_ranges")
def test_a_partitioned_rebuild_leaves_the_bytes_of_the_generic_restore(queue: StateTopicQueue, tmp_path: Path) -> None:
    history(queue, random.Random(9), 30)
    with RocksDBBackingMap(tmp_path / "generic") as store:
        store.restore(queue.replay(30).items(), 30, 1)
    with RocksDBBackingMap(tmp_path / "fast") as store:
        count = rebuild_store(store, queue, committed_txid=30, committed_epoch=1)
    assert count == len([value for value in queue.replay(30).values() if value is not None])
    assert raw_items(tmp_path / "fast") == raw_items(tmp_path / "generic")


# --- read_ahead -----------------------------------------------------------------------------


def test_read_ahead_yields_every_item_in_order_computed_in_another_thread() -> None:
    threads: set[int] = set()

    def items() -> Iterator[int]:
        for i in range(10):
            threads.add(threading.get_ident())
            yield i

    assert list(read_ahead(items(), depth=3)) == list(range(10))
    assert threads and threading.get_ident() not in threads
    assert list(read_ahead(iter([]))) == []


def test_read_ahead_raises_the_producer_error_after_the_items_before_it() -> None:
    def items() -> Iterator[int]:
        yield 1
        yield 2
        raise ReplayError("bad batch")

    got: list[int] = []
    with pytest.raises(ReplayError, match="bad batch"):
        for item in read_ahead(items()):
            got.append(item)
    assert got == [1, 2]


def test_read_ahead_stops_producing_when_the_consumer_stops() -> None:
    produced: list[int] = []

    def items() -> Iterator[int]:
        for i in range(100):
            produced.append(i)
            yield i

    reader = read_ahead(items(), depth=2)
    assert next(reader) == 0
    reader.close()
    assert len(produced) <= 4


def test_closing_a_restore_source_midway_stops_its_read_ahead_first(
    queue: StateTopicQueue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(snapshot, "_ROW_GROUP_ROWS", 10)  # many small row groups to read ahead
    queue.append(3, 1, 1, [((f"k{i:03d}",), TransactionalValue(1, i)) for i in range(200)])
    write_snapshot(queue, tmp_path / "snaps", 1)
    threads = threading.active_count()
    source = open_restore_source(queue, 1, snapshot_dir=tmp_path / "snaps", encoded=True)
    run = next(source.sorted_runs())
    keys, _ = next(run)
    assert keys[0] == b'["k000"]' and len(keys) == 10
    source.close()  # as after a load that failed midway: the reader stops, then the file closes
    assert threading.active_count() == threads
    assert list(run) == []
