"""The SST written beside each snapshot, and restores that ingest it.

A restore from a snapshot with an SST ingests the file whole and applies the tail on top; it
must leave byte for byte the store the Parquet path leaves (the snapshot rows without the
tail's keys, then the tail's live values), report the same key count, and fall back to the
Parquet file when the SST cannot be loaded.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from state_store_bytes import raw_items

from stream_ops.errors import SstLoadError
from stream_ops.state import OpaqueValue, RocksDBBackingMap, StateTopicQueue, compact_queue, rebuild_store, write_snapshot
from stream_ops.state.snapshot import list_snapshots, snapshot_sst
from stream_ops.state.state_topic import encode_items
from stream_ops.topics.file_topic import FileTopic


def _queue(tmp_path: Path) -> StateTopicQueue:
    return StateTopicQueue(FileTopic(tmp_path / "topic", queues=1), 0)


def _append(queue: StateTopicQueue, txid: int, changes: dict[str, int | None]) -> None:
    items = [((word,), None if n is None else OpaqueValue(txid, n, None)) for word, n in changes.items()]
    queue.append_encoded(3, txid, 1, encode_items(items))


def _restore(queue: StateTopicQueue, path: Path, snapshots: Path, txid: int) -> int:
    with RocksDBBackingMap(path) as store:
        return rebuild_store(store, queue, txid, 1, snapshot_dir=snapshots)


def _build(tmp_path: Path) -> tuple[StateTopicQueue, Path]:
    """A snapshot at txid 2 of 300 keys, then a tail that updates, deletes and adds keys."""
    queue, snapshots = _queue(tmp_path), tmp_path / "snapshots"
    _append(queue, 1, {f"w{i:03d}": i for i in range(200)})
    _append(queue, 2, {**{f"w{i:03d}": i + 1 for i in range(150, 300)}, "w007": None})
    write_snapshot(queue, snapshots, 2)
    _append(queue, 3, {"w000": 50, "w001": None, "new-a": 1, "w007": 3})  # w007 comes back
    _append(queue, 4, {"w299": None, "new-b": 2, "new-a": None, "zzz": 9})
    return queue, snapshots


def test_every_compaction_writes_an_sst_beside_its_snapshot_and_removes_the_old_one(tmp_path):
    queue, snapshots = _build(tmp_path)
    first = list_snapshots(snapshots)[0]
    assert snapshot_sst(first.path).is_file()
    compact_queue(queue, snapshots, 4, delete_covered=True)
    (latest,) = list_snapshots(snapshots)
    assert latest.txid == 4 and snapshot_sst(latest.path).is_file()
    assert not first.path.exists() and not snapshot_sst(first.path).exists()
    assert sorted(p.name for p in snapshots.iterdir()) == sorted([latest.path.name, snapshot_sst(latest.path).name])


def test_a_restore_through_the_sst_leaves_the_bytes_and_count_of_the_parquet_path(tmp_path, caplog):
    queue, snapshots = _build(tmp_path)
    with caplog.at_level(logging.INFO, logger="stream_ops.state.rocksdb_backing"):
        via_sst = _restore(queue, tmp_path / "via-sst", snapshots, 4)
    assert "loaded snapshot-x" in caplog.text
    for sst in snapshots.glob("*.sst"):
        sst.unlink()  # a snapshot written before SSTs
    via_parquet = _restore(queue, tmp_path / "via-parquet", snapshots, 4)
    assert via_sst == via_parquet == 299 - 2 + 3  # snapshot 299 (w007 deleted); w001, w299 gone; w007, new-b, zzz new
    assert raw_items(tmp_path / "via-sst") == raw_items(tmp_path / "via-parquet")
    full = tmp_path / "full"
    with RocksDBBackingMap(full) as store:
        assert rebuild_store(store, _queue(tmp_path), 4, 1, snapshot_dir=tmp_path / "none") == via_sst
    assert raw_items(full) == raw_items(tmp_path / "via-sst")


@pytest.mark.parametrize("damage", ["cut short", "garbage"])
def test_an_sst_that_cannot_be_loaded_falls_back_to_the_parquet_file(tmp_path, caplog, damage):
    queue, snapshots = _build(tmp_path)
    expected = _restore(queue, tmp_path / "good", snapshots, 4)
    (sst,) = snapshots.glob("*.sst")
    data = sst.read_bytes()
    sst.write_bytes(data[: len(data) // 2] if damage == "cut short" else b"not an sst file" * 100)
    with caplog.at_level(logging.WARNING, logger="stream_ops.state.restore"):
        assert _restore(queue, tmp_path / "fallback", snapshots, 4) == expected
    assert "restoring from the Parquet snapshot instead" in caplog.text
    assert raw_items(tmp_path / "fallback") == raw_items(tmp_path / "good")


def test_loading_an_sst_into_a_store_that_holds_data_is_refused_and_a_missing_one_writes_nothing(tmp_path):
    queue, snapshots = _build(tmp_path)
    (sst,) = snapshots.glob("*.sst")
    with RocksDBBackingMap(tmp_path / "db") as store:
        with pytest.raises(SstLoadError, match="could not load"):
            store.restore_from_sst(tmp_path / "missing.sst", iter([]), 4, 1)
        assert store.applied_marker() is None and not list(store.items())
        store.restore_from_sst(sst, iter([]), 2, 1)
        with pytest.raises(Exception, match="empty state store"):
            store.restore_from_sst(sst, iter([]), 2, 1)


def test_a_snapshot_without_keys_has_no_sst_and_restores(tmp_path):
    queue, snapshots = _queue(tmp_path), tmp_path / "snapshots"
    _append(queue, 1, {"gone": 1})
    _append(queue, 2, {"gone": None})
    info = write_snapshot(queue, snapshots, 2)
    assert info.keys == 0 and not snapshot_sst(info.path).exists()
    _append(queue, 3, {"back": 1})
    assert _restore(queue, tmp_path / "db", snapshots, 3) == 1
    shutil.rmtree(tmp_path / "db")
