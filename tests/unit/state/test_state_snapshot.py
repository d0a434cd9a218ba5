"""Compacted snapshots of a state-topic queue, and rebuilding a store from snapshot + tail."""

from __future__ import annotations

import json
import logging
import random
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stream_ops.errors import ReplayError, StateError
from stream_ops.hashing import encode_key
from stream_ops.state import (
    OpaqueValue,
    RocksDBBackingMap,
    StateTopicQueue,
    TransactionalValue,
    compact_queue,
    encode_stored,
    latest_snapshot,
    read_snapshot,
    rebuild_store,
    replay_changes,
    replay_state_topic,
    write_snapshot,
)
from stream_ops.state.snapshot import (
    COMPACTED_MARKER,
    list_snapshots,
    open_restore_source,
    read_compaction_marker,
    snapshot_file_name,
    snapshot_sst,
)
from stream_ops.topics.file_topic import FileTopic, batch_file_name


@pytest.fixture
def queue(tmp_path: Path) -> StateTopicQueue:
    return StateTopicQueue(FileTopic(tmp_path / "state", queues=2), queue=1)


@pytest.fixture
def snaps(tmp_path: Path) -> Path:
    return tmp_path / "snapshots" / "queue-00001"


def snapshot_state(path: Path) -> dict[Any, Any]:
    return dict(read_snapshot(path))


def store_state(path: Path) -> dict[Any, Any]:
    with RocksDBBackingMap(path) as store:
        return dict(store.items())


def random_history(queue: StateTopicQueue, rng: random.Random, txids: int, *, keys: int = 30) -> None:
    """Batches 1..txids: values, tombstones, a lower-epoch 'zombie' file now and then, a replayed txid."""
    epoch = 1
    for txid in range(1, txids + 1):
        if rng.random() < 0.2:  # the task moved: the old owner's file for this txid stays behind
            queue.append(3, txid, epoch, [((f"k{rng.randrange(keys)}",), f"zombie-{txid}") for _ in range(3)])
            epoch += 1
        items: list[tuple[Any, Any]] = []
        for _ in range(rng.randrange(0, 8)):
            key = (f"k{rng.randrange(keys)}",)
            roll = rng.random()
            if roll < 0.15:
                items.append((key, None))
            elif roll < 0.6:
                items.append((key, OpaqueValue(txid, rng.randrange(100), rng.randrange(100))))
            else:
                items.append((key, TransactionalValue(txid, [txid, rng.randrange(9)])))
        queue.append(3, txid, epoch, items)


# --- write_snapshot -------------------------------------------------------------------------


def test_a_snapshot_holds_exactly_what_replay_gives(queue: StateTopicQueue, snaps: Path) -> None:
    random_history(queue, random.Random(1), txids=20)
    queue.append(3, 21, 9, [(("k1",), "not committed")])

    info = write_snapshot(queue, snaps, committed_txid=20)

    assert snapshot_state(info.path) == queue.replay(committed_txid=20)
    assert (info.path.name, info.txid, info.keys) == (snapshot_file_name(20), 20, len(queue.replay(20)))
    assert info.bytes == info.path.stat().st_size and info.seconds >= 0
    assert latest_snapshot(snaps) == info


def test_the_snapshot_equals_replay_state_topic_over_the_raw_entries(queue: StateTopicQueue, snaps: Path) -> None:
    random_history(queue, random.Random(2), txids=15)
    epochs: dict[int, int] = {}
    for file_id, _ in queue.batch_files():  # the epoch that counts: the highest that wrote a file
        epochs[file_id.txid] = max(file_id.epoch, epochs.get(file_id.txid, 0))
    expected = replay_state_topic(queue.entries(), committed_txid=12, epochs=epochs)
    info = write_snapshot(queue, snaps, committed_txid=12)
    table = pq.read_table(info.path)
    got = {tuple(json.loads(k)): json.loads(v) for k, v in zip(table["key"].to_pylist(), table["value"].to_pylist())}
    assert got == expected


def test_incremental_compaction_equals_a_full_replay_and_reads_only_new_files(queue: StateTopicQueue, snaps: Path) -> None:
    rng = random.Random(3)
    random_history(queue, rng, txids=10)
    first = write_snapshot(queue, snaps, committed_txid=10)
    for path in queue.path.iterdir():  # the covered files are not read again: make them unreadable
        if path.name.endswith(".arrow"):
            shutil.copy(path, path.with_suffix(".bak"))
            path.write_text("{corrupt\n")
    for txid in range(11, 16):
        queue.append(3, txid, 7, [((f"k{rng.randrange(30)}",), TransactionalValue(txid, txid)), (("k0",), None)])

    second = write_snapshot(queue, snaps, committed_txid=15)

    for path in queue.path.glob("*.bak"):
        path.replace(path.with_suffix(".arrow"))
    assert snapshot_state(second.path) == queue.replay(committed_txid=15)
    assert ("k0",) not in snapshot_state(second.path)
    assert list_snapshots(snaps) == [second]  # the older snapshot was removed
    assert not first.path.exists()
    meta = json.loads(pq.read_metadata(second.path).metadata[b"stream_ops.snapshot"])
    assert (meta["base_txid"], meta["tail_files"], meta["epoch"]) == (10, 5, 7)


def test_tombstones_delete_snapshot_keys_and_a_later_value_revives_them(queue: StateTopicQueue, snaps: Path) -> None:
    queue.append(3, 1, 1, [(("a",), 1), (("b",), 1), (("c",), 1)])
    write_snapshot(queue, snaps, committed_txid=1)
    queue.append(3, 2, 1, [(("a",), None), (("b",), None), (("gone",), None)])
    queue.append(3, 3, 1, [(("b",), 3)])

    assert snapshot_state(write_snapshot(queue, snaps, committed_txid=2).path) == {("c",): 1}
    assert snapshot_state(write_snapshot(queue, snaps, committed_txid=3).path) == {("b",): 3, ("c",): 1}


def test_the_highest_epoch_wins_across_the_snapshot_boundary(queue: StateTopicQueue, snaps: Path) -> None:
    queue.append(3, 1, 1, [(("a",), "one"), (("b",), "one")])
    queue.append(3, 2, 1, [(("a",), "dead owner"), (("z",), "dead owner")])  # never committed
    write_snapshot(queue, snaps, committed_txid=1)
    queue.append(3, 2, 2, [(("b",), "new owner")])  # the new owner re-runs txid 2
    queue.append(3, 3, 2, [(("c",), "three")])

    info = write_snapshot(queue, snaps, committed_txid=3)

    assert (
        snapshot_state(info.path)
        == queue.replay(committed_txid=3)
        == {
            ("a",): "one",
            ("b",): "new owner",
            ("c",): "three",
        }
    )
    assert info.epoch == 2


def test_an_empty_file_of_the_committing_epoch_hides_a_crashed_lower_epoch(queue: StateTopicQueue, snaps: Path) -> None:
    # epoch 1 wrote txid 2 and crashed before its commit; epoch 2 committed txid 2 with no
    # change. The committing epoch's (empty) file is the one that counts: 99 was never committed.
    queue.append(3, 1, 1, [(("a",), 1)])
    queue.append(3, 2, 1, [(("a",), 99)])
    queue.append(3, 2, 2, [])
    assert replay_changes(queue, after_txid=-1, committed_txid=2).changes == {("a",): {"k": "raw", "val": 1}}
    assert snapshot_state(write_snapshot(queue, snaps, committed_txid=2).path) == queue.replay(2) == {("a",): 1}


def test_a_snapshot_at_the_same_txid_is_reused_and_a_newer_one_is_an_error(queue: StateTopicQueue, snaps: Path) -> None:
    queue.append(3, 1, 1, [(("a",), 1)])
    queue.append(3, 2, 1, [(("a",), 2)])
    info = write_snapshot(queue, snaps, committed_txid=2)
    assert write_snapshot(queue, snaps, committed_txid=2) == info
    with pytest.raises(ReplayError, match="already holds a snapshot at txid 2"):
        write_snapshot(queue, snaps, committed_txid=1)


def test_an_empty_queue_gives_an_empty_snapshot(queue: StateTopicQueue, snaps: Path) -> None:
    info = write_snapshot(queue, snaps, committed_txid=0)
    assert info.keys == 0 and snapshot_state(info.path) == {}


# --- the Parquet file -----------------------------------------------------------------------


def test_the_parquet_has_plain_sorted_columns_with_the_bytes_rocksdb_stores(queue: StateTopicQueue, snaps: Path) -> None:
    values = {
        ("pear", 2): OpaqueValue(1, 3, None),
        ("äpfel",): TransactionalValue(1, {"n": 1}),
        ("apple",): 7,
        ("line\u2028sep",): "x",
    }
    queue.append(3, 1, 1, list(values.items()))
    info = write_snapshot(queue, snaps, committed_txid=1)

    table = pq.read_table(info.path)
    assert table.schema.names == ["key", "value"]
    assert [field.type for field in table.schema] == [pa.string(), pa.string()]
    keys = table["key"].to_pylist()
    assert keys == sorted(encode_key(key) for key in values)
    assert dict(zip(keys, table["value"].to_pylist())) == {
        encode_key(key): encode_stored(value).decode("utf-8") for key, value in values.items()
    }
    meta = json.loads(pq.read_metadata(info.path).metadata[b"stream_ops.snapshot"])
    assert {k: meta[k] for k in ("format", "txid", "epoch", "keys")} == {"format": 1, "txid": 1, "epoch": 1, "keys": 4}
    assert meta["created_at"].endswith("+00:00")
    assert snapshot_state(info.path) == queue.replay(committed_txid=1) == values


def test_a_failed_write_leaves_no_visible_file_and_keeps_the_previous_snapshot(
    queue: StateTopicQueue, snaps: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue.append(3, 1, 1, [(("a",), 1)])
    first = write_snapshot(queue, snaps, committed_txid=1)
    queue.append(3, 2, 1, [(("a",), 2)])

    def broken_write(self: pq.ParquetWriter, table: pa.Table, row_group_size: int | None = None) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", broken_write)
    with pytest.raises(StateError, match="disk full"):
        write_snapshot(queue, snaps, committed_txid=2)
    monkeypatch.undo()

    assert sorted(p.name for p in snaps.iterdir()) == [first.path.name, snapshot_sst(first.path).name]
    assert latest_snapshot(snaps) == first


def test_temporary_and_foreign_files_are_not_snapshots(queue: StateTopicQueue, snaps: Path) -> None:
    queue.append(3, 1, 1, [(("a",), 1)])
    info = write_snapshot(queue, snaps, committed_txid=1)
    (snaps / f".{snapshot_file_name(9)}.0123.tmp").write_bytes(b"PAR1 half written")
    (snaps / "notes.txt").write_text("hello")
    assert list_snapshots(snaps) == [info]


def test_a_file_named_like_a_snapshot_but_foreign_is_a_replay_error(snaps: Path) -> None:
    snaps.mkdir(parents=True)
    pq.write_table(pa.table({"key": ["[1]"], "value": ["{}"]}), snaps / snapshot_file_name(3))
    with pytest.raises(ReplayError, match="not a stream_ops snapshot"):
        latest_snapshot(snaps)


# --- compact_queue --------------------------------------------------------------------------


def test_compaction_deletes_only_covered_files_and_keeps_the_tail(queue: StateTopicQueue, snaps: Path) -> None:
    random_history(queue, random.Random(4), txids=12)
    expected_at = {txid: queue.replay(txid) for txid in (8, 12)}
    (queue.path / "notes.txt").write_text("not a batch file\n")

    result = compact_queue(queue, snaps, committed_txid=8)

    remaining = {file_id.txid for file_id, _ in queue.batch_files()}
    assert remaining == {9, 10, 11, 12}
    assert result.deleted_files > 0 and result.deleted_bytes > 0
    assert result.kept_files == len(queue.batch_files())
    assert (queue.path / "notes.txt").exists()
    marker = read_compaction_marker(queue)
    assert marker is not None and marker.txid == 8 and marker.snapshot_dir == snaps.resolve()
    assert COMPACTED_MARKER not in [p.name for p in FileTopic(queue.path.parent, 2).files(1)]  # hidden from readers
    assert snapshot_state(result.snapshot.path) == expected_at[8]

    assert snapshot_state(compact_queue(queue, snaps, committed_txid=12).snapshot.path) == expected_at[12]
    assert queue.batch_files() == []


def test_compaction_without_deleting_leaves_every_file(queue: StateTopicQueue, snaps: Path) -> None:
    random_history(queue, random.Random(5), txids=5)
    before = queue.batch_files()
    result = compact_queue(queue, snaps, committed_txid=5, delete_covered=False)
    assert queue.batch_files() == before and result.deleted_files == 0
    assert read_compaction_marker(queue) is None


def test_compacting_into_another_directory_after_deleting_is_a_replay_error(
    queue: StateTopicQueue, snaps: Path, tmp_path: Path
) -> None:
    queue.append(3, 1, 1, [(("a",), 1)])
    queue.append(3, 2, 1, [(("b",), 1)])
    compact_queue(queue, snaps, committed_txid=1)
    with pytest.raises(ReplayError, match="compacted at txid 1"):
        write_snapshot(queue, tmp_path / "elsewhere", committed_txid=2)


# --- rebuild_store --------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [6, 7, 8])
def test_rebuild_from_snapshot_and_tail_equals_a_full_replay(
    queue: StateTopicQueue, snaps: Path, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    random_history(queue, rng, txids=25)
    committed = 22
    with RocksDBBackingMap(tmp_path / "full") as store:
        full_count = rebuild_store(store, queue, committed, committed_epoch=4)
    compact_queue(queue, snaps, committed_txid=9)
    compact_queue(queue, snaps, committed_txid=17)

    with RocksDBBackingMap(tmp_path / "fast") as store:
        count = rebuild_store(store, queue, committed, committed_epoch=4, snapshot_dir=snaps)
        assert store.applied_marker() == (committed, 4)

    assert count == full_count
    assert store_state(tmp_path / "fast") == store_state(tmp_path / "full")


def test_rebuild_follows_the_compaction_marker_when_no_snapshot_dir_is_given(
    queue: StateTopicQueue, snaps: Path, tmp_path: Path
) -> None:
    queue.append(3, 1, 1, [(("a",), TransactionalValue(1, 1)), (("b",), TransactionalValue(1, 1))])
    queue.append(3, 2, 1, [(("a",), TransactionalValue(2, 2))])
    queue.append(3, 3, 1, [(("b",), None), (("c",), TransactionalValue(3, 3))])
    expected = queue.replay(committed_txid=3)
    compact_queue(queue, snaps, committed_txid=2)

    with RocksDBBackingMap(tmp_path / "db") as store:
        assert rebuild_store(store, queue, committed_txid=3, committed_epoch=1) == 2
    assert store_state(tmp_path / "db") == expected


def test_rebuild_at_the_snapshot_txid_needs_no_tail(queue: StateTopicQueue, snaps: Path, tmp_path: Path) -> None:
    queue.append(3, 1, 1, [(("a",), 1), (("b",), 2)])
    compact_queue(queue, snaps, committed_txid=1)
    with RocksDBBackingMap(tmp_path / "db") as store:
        assert rebuild_store(store, queue, committed_txid=1, committed_epoch=1, snapshot_dir=snaps) == 2
    assert store_state(tmp_path / "db") == {("a",): 1, ("b",): 2}


def test_rebuild_below_the_only_snapshot_is_a_replay_error(queue: StateTopicQueue, snaps: Path, tmp_path: Path) -> None:
    queue.append(3, 1, 1, [(("a",), 1)])
    queue.append(3, 2, 1, [(("a",), 2)])
    write_snapshot(queue, snaps, committed_txid=2)
    with RocksDBBackingMap(tmp_path / "db") as store, pytest.raises(ReplayError, match="all newer than the committed txid 1"):
        rebuild_store(store, queue, committed_txid=1, committed_epoch=1, snapshot_dir=snaps)


def test_rebuild_below_the_compaction_is_a_replay_error(queue: StateTopicQueue, snaps: Path, tmp_path: Path) -> None:
    queue.append(3, 1, 1, [(("a",), 1)])
    queue.append(3, 2, 1, [(("a",), 2)])
    compact_queue(queue, snaps, committed_txid=2)
    with RocksDBBackingMap(tmp_path / "db") as store, pytest.raises(ReplayError, match="compacted at txid 2"):
        rebuild_store(store, queue, committed_txid=1, committed_epoch=1)


def test_rebuild_with_a_snapshot_dir_missing_the_compaction_is_a_replay_error(
    queue: StateTopicQueue, snaps: Path, tmp_path: Path
) -> None:
    queue.append(3, 1, 1, [(("a",), 1)])
    compact_queue(queue, snaps, committed_txid=1)
    with RocksDBBackingMap(tmp_path / "db") as store, pytest.raises(ReplayError, match=str(snaps.resolve())):
        rebuild_store(store, queue, committed_txid=1, committed_epoch=1, snapshot_dir=tmp_path / "empty")


class SteppingClock:
    """A clock that advances a fixed step each time it is read."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_rebuild_from_a_snapshot_logs_progress_with_keys_per_second_at_a_bounded_rate(
    queue: StateTopicQueue, snaps: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    queue.append(3, 1, 1, [((f"k{i}",), i) for i in range(200)])
    compact_queue(queue, snaps, committed_txid=1)
    for sst in snaps.glob("*.sst"):
        sst.unlink()  # progress is logged while rows are loaded one by one (an SST is ingested whole)
    queue.append(3, 2, 1, [(("k0",), None), (("new",), 1)])
    clock = SteppingClock(1.0)  # progress is checked per chunk of keys: here, one per run
    with RocksDBBackingMap(tmp_path / "db") as store, caplog.at_level(logging.INFO, "stream_ops.state.state_topic"):
        assert rebuild_store(store, queue, committed_txid=2, committed_epoch=1, snapshot_dir=snaps, clock=clock) == 200
    progress = [r.getMessage() for r in caplog.records if "keys/s)" in r.getMessage() and "/201 keys" in r.getMessage()]
    assert 0 < len(progress) <= clock.now / 1.0
    assert any("rebuilt state store" in r.getMessage() and "keys/s" in r.getMessage() for r in caplog.records)


def test_a_compaction_during_a_rebuild_makes_the_rebuild_read_again(queue: StateTopicQueue, snaps: Path, tmp_path: Path) -> None:
    for txid in range(1, 7):
        queue.append(3, txid, 1, [((f"k{txid}",), txid), ((f"k{txid - 1}",), None)])
    expected = queue.replay(committed_txid=6)
    compact_queue(queue, snaps, committed_txid=2)
    compactions = []

    def compact_while_reading(read: int, total: int, entries: int) -> None:
        if not compactions:  # the scheduled compaction runs while the tail is being read
            compactions.append(compact_queue(queue, snaps, committed_txid=5))

    source = open_restore_source(queue, 6, snapshot_dir=snaps, on_file=compact_while_reading)
    try:
        assert source.snapshot is not None and source.snapshot.txid == 5
        assert dict(source.items()) == {("k6",): 6} == expected
    finally:
        source.close()
    assert len(compactions) == 1


def test_a_corrupt_counted_file_is_reported(queue: StateTopicQueue) -> None:
    queue.path.mkdir(parents=True)
    (queue.path / batch_file_name(4, 1, 1, ".arrow")).write_text('{"key":["a"],"value":null,"txid":1,"epoch":1}\n{oops\n')
    with pytest.raises(ReplayError, match=r"t00004-x000000000001-e000001.arrow is not a complete Arrow IPC file"):
        replay_changes(queue, after_txid=-1, committed_txid=1)
    first = queue.append(4, 3, 1, [(("a",), None)])
    first.replace(first.with_name(batch_file_name(4, 2, 1, ".arrow")))
    with pytest.raises(ReplayError, match="records txid 3 epoch 1, but is named for txid 2 epoch 1"):
        replay_changes(queue, after_txid=1, committed_txid=2)


def test_a_snapshot_and_the_compaction_marker_are_private_files(queue: StateTopicQueue, snaps: Path) -> None:
    import os

    queue.append(3, 0, 1, [(("a",), 1)])
    old = os.umask(0o022)
    try:
        result = compact_queue(queue, snaps, committed_txid=0, committed_epoch=1)
    finally:
        os.umask(old)
    assert result.snapshot.path.stat().st_mode & 0o777 == 0o640
    assert (queue.path / "_compacted.json").stat().st_mode & 0o777 == 0o640
    assert snaps.stat().st_mode & 0o777 == 0o750
