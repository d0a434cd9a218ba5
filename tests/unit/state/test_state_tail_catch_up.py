"""A store that is behind catches up by the state-topic tail alone, only from a committed state.

Reference: the store a full rebuild at the committed txid gives (DESIGN invariant 5). Each case
writes a queue as a task runner does (one file per batch, a zombie's lower epoch beside the
committing one), then compares the caught-up store with a rebuilt one, byte for byte.
"""

from __future__ import annotations

from pathlib import Path

from rocksdict import Options, Rdict

from stream_ops.runtime.task_state import open_task_state
from stream_ops.state import RocksDBBackingMap, StateTopicQueue, TransactionalValue, compact_queue, rebuild_store
from stream_ops.state.restore import catch_up_store, tail_start
from stream_ops.topics.file_topic import FileTopic


def _queue(tmp_path: Path) -> StateTopicQueue:
    return StateTopicQueue(FileTopic(tmp_path / "state", 1), 0)


def _write(queue: StateTopicQueue, txid: int, epoch: int, changes: dict[str, int | None]) -> None:
    items = [((k,), None if v is None else TransactionalValue(txid, v)) for k, v in changes.items()]
    queue.append(0, txid, epoch, items)


def _apply(store: RocksDBBackingMap, txid: int, epoch: int, changes: dict[str, int | None]) -> None:
    """What a task runner does for one batch: stage the writes, flush them with the marker."""
    puts = {(k,): TransactionalValue(txid, v) for k, v in changes.items() if v is not None}
    if puts:
        store.multi_put(list(puts), list(puts.values()))
    deletes = [(k,) for k, v in changes.items() if v is None]
    if deletes:
        store.delete(deletes)
    store.flush(txid, epoch)


def _raw(path: Path) -> dict[bytes, bytes]:
    db = Rdict(str(path), options=Options(raw_mode=True))
    try:
        return dict(db.items())
    finally:
        db.close()


def _rebuilt(tmp_path: Path, queue: StateTopicQueue, txid: int, epoch: int) -> dict[bytes, bytes]:
    path = tmp_path / "reference"
    with RocksDBBackingMap(path) as store:
        rebuild_store(store, queue, txid, epoch, require_complete=True)
    return _raw(path)


BATCHES = [
    {"a": 1, "b": 2},
    {"a": 3, "c": 4},
    {"b": None, "d": 5},
    {"c": 6},
]


def test_a_standby_at_a_committed_txid_applies_only_the_tail_and_equals_a_rebuild(tmp_path):
    queue = _queue(tmp_path)
    standby = RocksDBBackingMap(tmp_path / "standby")
    for txid, changes in enumerate(BATCHES[:2]):
        _write(queue, txid, 1, changes)
    assert rebuild_store(standby, queue, 1, 1, require_complete=True) == 3
    for txid, changes in enumerate(BATCHES[2:], start=2):
        _write(queue, txid, 1, changes)
    assert tail_start(standby, queue, 3) == 1
    assert catch_up_store(standby, queue, 3, 1) == 3  # b deleted, d and c written
    assert catch_up_store(standby, queue, 3, 1) == 0  # current: nothing to do
    standby.close()
    assert _raw(tmp_path / "standby") == _rebuilt(tmp_path, queue, 3, 1)


def test_a_store_that_applied_a_batch_a_new_owner_redid_is_not_caught_up(tmp_path):
    queue = _queue(tmp_path)
    store = RocksDBBackingMap(tmp_path / "old-owner")
    _write(queue, 0, 1, BATCHES[0])
    _apply(store, 0, 1, BATCHES[0])
    _write(queue, 1, 1, {"a": 99})  # the old owner's batch 1, never committed ...
    _apply(store, 1, 1, {"a": 99})
    _write(queue, 1, 2, BATCHES[1])  # ... the new owner (epoch 2) did txid 1 again and committed it
    _write(queue, 2, 2, BATCHES[2])
    assert tail_start(store, queue, 2) is None
    assert catch_up_store(store, queue, 2, 2) is None  # the caller must rebuild
    store.close()


def test_a_store_ahead_of_the_committed_txid_is_not_caught_up(tmp_path):
    queue = _queue(tmp_path)
    store = RocksDBBackingMap(tmp_path / "ahead")
    for txid, changes in enumerate(BATCHES[:2]):
        _write(queue, txid, 1, changes)
        _apply(store, txid, 1, changes)
    assert catch_up_store(store, queue, 0, 1) is None  # txid 1 applied, only 0 committed
    store.close()


def test_a_compacted_tail_makes_the_store_rebuild(tmp_path):
    queue = _queue(tmp_path)
    store = RocksDBBackingMap(tmp_path / "behind")
    _write(queue, 0, 1, BATCHES[0])
    _apply(store, 0, 1, BATCHES[0])
    for txid, changes in enumerate(BATCHES[1:], start=1):
        _write(queue, txid, 1, changes)
    compact_queue(queue, tmp_path / "snapshots", 2, committed_epoch=1)
    assert catch_up_store(store, queue, 3, 1) is None
    store.close()


def test_open_task_state_catches_a_kept_store_up_instead_of_rebuilding(tmp_path):
    queue = _queue(tmp_path)
    store_dir = tmp_path / "worker" / "task-00000"
    for txid, changes in enumerate(BATCHES[:2]):
        _write(queue, txid, 1, changes)
    with RocksDBBackingMap(store_dir) as warm:
        rebuild_store(warm, queue, 1, 1, require_complete=True)
    for txid, changes in enumerate(BATCHES[2:], start=2):
        _write(queue, txid, 2, changes)  # a new owner epoch wrote the tail
    state = open_task_state(
        store_dir=store_dir,
        state_topic=FileTopic(tmp_path / "state", 1),
        queue=0,
        kind="transactional",
        committed_txid=3,
        committed_epoch=2,
    )
    assert (state.rebuilt, state.tail_keys, state.restored_keys) == (False, 3, 0)
    state.close()
    assert _raw(store_dir) == _rebuilt(tmp_path, queue, 3, 2)
