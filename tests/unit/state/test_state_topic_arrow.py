"""Arrow IPC state-topic batch files: cut-short detection, a history restored, caught up and
compacted like the reference, batch files of any other format refused, and the SST restore."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from state_store_bytes import raw_items

from stream_ops.errors import ReplayError, StateError
from stream_ops.state import OpaqueValue, RocksDBBackingMap, StateTopicQueue, TransactionalValue, compact_queue, rebuild_store
from stream_ops.state.restore import catch_up_store
from stream_ops.state.state_topic import replay_arrow_changes, replay_changes
from stream_ops.topics.file_topic import FileTopic, batch_file_name


@pytest.fixture
def queue(tmp_path: Path) -> StateTopicQueue:
    return StateTopicQueue(FileTopic(tmp_path / "state", queues=1), queue=0)


def history(queue: StateTopicQueue, rng: random.Random, *, txids: int, zombies: tuple[int, ...]) -> None:
    """Batches 0..txids with tombstones, and owners that lost the task at the txids ``zombies``."""
    epoch = 1
    for txid in range(txids + 1):
        if txid in zombies:
            queue.append(4, txid, epoch, [((f"k{rng.randrange(20)}",), "zombie")])
            epoch += 1
        items: list[tuple[Any, Any]] = []
        for _ in range(rng.randrange(1, 8)):
            key, roll = (f"k{rng.randrange(20)}",), rng.random()
            value = (
                None if roll < 0.2 else OpaqueValue(txid, rng.randrange(99)) if roll < 0.6 else TransactionalValue(txid, [roll])
            )
            items.append((key, value))
        queue.append(4, txid, epoch, items)


def generic_restore(path: Path, queue: StateTopicQueue, txid: int, epoch: int) -> None:
    """The reference: entries() -> replay_state_topic -> restore (encode_key + encode_stored)."""
    with RocksDBBackingMap(path) as store:
        store.restore(queue.replay(txid).items(), txid, epoch)


# --- cut short, or not the file it is named for ----------------------------------------------


@pytest.mark.parametrize("keep", [0, 6, 8, 100, 0.5, -1, -8, -20])
def test_an_arrow_file_cut_short_anywhere_fails_every_reader(queue: StateTopicQueue, tmp_path: Path, keep: float) -> None:
    queue.append(4, txid=0, epoch=1, items=[(("a",), 1), (("b",), 2)])
    path = queue.append(4, txid=1, epoch=1, items=[((f"k{i}",), TransactionalValue(1, i)) for i in range(50)])
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep) if isinstance(keep, float) else keep])

    with pytest.raises(ReplayError, match="t00004-x000000000001-e000001.arrow is not a complete Arrow IPC file"):
        list(queue.entries())
    with pytest.raises(ReplayError, match="cut short"):
        replay_changes(queue, after_txid=-1, committed_txid=1)
    with RocksDBBackingMap(tmp_path / "db") as store, pytest.raises(ReplayError, match="cut short"):
        rebuild_store(store, queue, committed_txid=1, committed_epoch=1, require_complete=True)
    with RocksDBBackingMap(tmp_path / "db") as store:
        assert store.applied_marker() is None


def test_an_arrow_file_of_another_batch_or_with_fewer_rows_than_recorded_fails(queue: StateTopicQueue) -> None:
    first = queue.append(4, txid=1, epoch=1, items=[(("a",), 1)])
    first.with_name(batch_file_name(4, 2, 1, ".arrow")).write_bytes(first.read_bytes())
    with pytest.raises(ReplayError, match="records txid 1 epoch 1, but is named for txid 2 epoch 1"):
        replay_arrow_changes(queue, after_txid=-1, committed_txid=2)

    table = pa.ipc.open_file(first.read_bytes()).read_all()
    meta = {b"stream_ops.state_batch": json.dumps({"format": 1, "txid": 1, "epoch": 1, "entries": 2}).encode()}
    with pa.ipc.new_file(str(first), table.schema.with_metadata(meta)) as writer:
        writer.write_table(table)
    with pytest.raises(ReplayError, match="holds 1 entries but records 2"):
        replay_arrow_changes(queue, after_txid=-1, committed_txid=1)


# --- a history with lost owners -------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2])
def test_a_queue_restores_catches_up_and_compacts_like_the_reference(queue: StateTopicQueue, tmp_path: Path, seed: int) -> None:
    history(queue, random.Random(seed), txids=20, zombies=(9, 10))
    generic_restore(tmp_path / "generic", queue, 20, 3)
    with RocksDBBackingMap(tmp_path / "full") as store:
        rebuild_store(store, queue, committed_txid=20, committed_epoch=3, require_complete=True)
    with RocksDBBackingMap(tmp_path / "behind") as store:  # a standby at txid 5 takes the tail
        rebuild_store(store, queue, committed_txid=5, committed_epoch=1, require_complete=True)
        assert catch_up_store(store, queue, committed_txid=20, committed_epoch=3) is not None
    snaps = tmp_path / "snapshots"
    compact_queue(queue, snaps, committed_txid=12)
    assert all(file_id.txid > 12 for file_id, _ in queue.batch_files())
    with RocksDBBackingMap(tmp_path / "snap") as store:
        rebuild_store(store, queue, committed_txid=20, committed_epoch=3, snapshot_dir=snaps, require_complete=True)

    expected = raw_items(tmp_path / "generic")
    assert raw_items(tmp_path / "full") == expected
    assert raw_items(tmp_path / "behind") == expected
    assert raw_items(tmp_path / "snap") == expected


# --- batch files of another format ------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_a_batch_file_in_another_format_fails_every_reader(queue: StateTopicQueue, tmp_path: Path, suffix: str) -> None:
    queue.append(4, 1, 1, [(("a",), 1)])
    other = queue.path / batch_file_name(4, 2, 1, suffix)
    other.write_bytes(b'{"key":["b"],"value":2,"txid":2,"epoch":1}\n')
    match = f"{other.name} is not a state-topic batch file"
    with pytest.raises(ReplayError, match=match):
        list(queue.entries())
    with pytest.raises(ReplayError, match=match):
        replay_changes(queue, after_txid=-1, committed_txid=2)
    with pytest.raises(ReplayError, match=match):
        replay_arrow_changes(queue, after_txid=-1, committed_txid=2)
    with RocksDBBackingMap(tmp_path / "db") as store, pytest.raises(ReplayError, match=match):
        rebuild_store(store, queue, committed_txid=2, committed_epoch=1)
    with pytest.raises(ReplayError, match=match):
        compact_queue(queue, tmp_path / "snapshots", committed_txid=2)
    assert other.exists()  # never skipped, never deleted


# --- RocksDBBackingMap.restore_sorted --------------------------------------------------------


@pytest.mark.parametrize(
    ("keys", "message"),
    [([b'["b"]', b'["a"]'], "strictly ascending"), ([b'["a"]', b"\x00meta"], "expected"), ([b'["a"]', '["b"]'], "bytes")],
)
def test_restore_sorted_rejects_unsorted_or_unencoded_keys_and_sets_no_marker(
    tmp_path: Path, keys: list[Any], message: str
) -> None:
    value = b'{"k":"raw","val":1}'
    with RocksDBBackingMap(tmp_path / "db") as store:
        with pytest.raises(StateError, match=message):
            store.restore_sorted([[(keys, [value] * len(keys))]], txid=3, epoch=1)
        assert store.applied_marker() is None
    assert not list(tmp_path.glob(".db.ingest-*"))  # the staged SST files are gone
