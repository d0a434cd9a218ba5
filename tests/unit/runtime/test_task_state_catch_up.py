"""A running task's store whose write of a committed batch failed is caught up from the state
topic (:meth:`TaskState.catch_up`), byte for byte what a rebuild at the committed txid gives, or
refused when only a rebuild can help.

The failure is injected at the store's one write seam (``RocksDBBackingMap._write_batch``) as
RocksDB reports an I/O error, so the store's own error translation and buffering are real.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rocksdict import Options, Rdict

from stream_ops.errors import StateError, StateStoreBehindError
from stream_ops.runtime.task_state import TaskState, open_task_state
from stream_ops.state import RocksDBBackingMap, StateTopicQueue, TransactionalValue, compact_queue, rebuild_store
from stream_ops.topics.file_topic import FileTopic

EPOCH = 1


def _queue(tmp_path: Path) -> StateTopicQueue:
    return StateTopicQueue(FileTopic(tmp_path / "state", 1), 0)


def _open(tmp_path: Path, committed_txid: int) -> TaskState:
    return open_task_state(
        store_dir=tmp_path / "store",
        kind="transactional",
        committed_txid=committed_txid,
        committed_epoch=EPOCH,
        snapshot_dir=tmp_path / "snapshots",
        state_topic=FileTopic(tmp_path / "state", 1),
    )


def _commit(tmp_path: Path, state: TaskState, txid: int, changes: dict[str, int]) -> None:
    """Steps 4 and 6 of a batch as a task runner does them: state topic, then the store."""
    keys = [(k,) for k in changes]
    values = [TransactionalValue(txid, v) for v in changes.values()]
    state.store.multi_put(keys, values)
    _queue(tmp_path).append(0, txid, EPOCH, list(zip(keys, values, strict=True)))
    state.store.flush(txid, EPOCH)


def _failing_writes(monkeypatch: pytest.MonkeyPatch, store: RocksDBBackingMap, times: int) -> list[str]:
    """The next ``times`` writes of ``store`` fail as RocksDB fails them on a disk error;
    returns the actions that failed."""
    real = store._write_batch
    failed: list[str] = []

    def eio(db: Any) -> None:
        raise Exception("IO error: While appending to file: 000012.log: Input/output error")  # what rocksdict raises

    def write(action: str, batch: Any) -> None:
        if len(failed) < times:
            failed.append(action)
            store._call(action, eio)
        real(action, batch)

    monkeypatch.setattr(store, "_write_batch", write)
    return failed


def _raw(path: Path) -> dict[bytes, bytes]:
    db = Rdict(str(path), options=Options(raw_mode=True))
    try:
        return dict(db.items())
    finally:
        db.close()


def _rebuilt(tmp_path: Path, txid: int) -> dict[bytes, bytes]:
    path = tmp_path / "reference"
    with RocksDBBackingMap(path) as store:
        rebuild_store(store, _queue(tmp_path), txid, EPOCH, require_complete=True)
    return _raw(path)


def test_a_failed_write_of_a_committed_batch_is_re_applied_from_the_state_topic(tmp_path, monkeypatch):
    state = _open(tmp_path, -1)
    _commit(tmp_path, state, 0, {"a": 1, "b": 2})
    failed = _failing_writes(monkeypatch, state.store, times=1)
    with pytest.raises(StateError, match="Input/output error"):
        _commit(tmp_path, state, 1, {"a": 3, "c": 4})
    assert failed == ["write"] and state.store.has_pending(), "the failed batch is still buffered"
    assert state.store.applied_marker() == (0, EPOCH)

    assert state.catch_up(1, EPOCH) == 2
    assert not state.store.has_pending()
    assert state.store.applied_marker() == (1, EPOCH)
    assert state.store.multi_get([("a",), ("b",), ("c",)]) == [
        TransactionalValue(1, 3),
        TransactionalValue(0, 2),
        TransactionalValue(1, 4),
    ]
    state.close()
    assert _raw(tmp_path / "store") == _rebuilt(tmp_path, 1)


def test_a_store_whose_first_write_failed_is_restored(tmp_path, monkeypatch):
    state = _open(tmp_path, -1)
    _failing_writes(monkeypatch, state.store, times=1)
    with pytest.raises(StateError):
        _commit(tmp_path, state, 0, {"a": 1})
    assert state.store.applied_marker() is None

    assert state.catch_up(0, EPOCH) == 1
    assert state.store.applied_marker() == (0, EPOCH)
    state.close()
    assert _raw(tmp_path / "store") == _rebuilt(tmp_path, 0)


def test_a_catch_up_whose_write_fails_too_leaves_the_store_at_its_committed_marker(tmp_path, monkeypatch):
    state = _open(tmp_path, -1)
    _commit(tmp_path, state, 0, {"a": 1})
    failed = _failing_writes(monkeypatch, state.store, times=2)
    with pytest.raises(StateError):
        _commit(tmp_path, state, 1, {"a": 2})
    with pytest.raises(StateError, match="Input/output error"):
        state.catch_up(1, EPOCH)
    assert failed == ["write", "apply a tail"]
    assert state.store.applied_marker() == (0, EPOCH)
    assert state.store.multi_get([("a",)]) == [TransactionalValue(0, 1)]
    assert state.catch_up(1, EPOCH) == 1, "once the disk is back, the same catch-up succeeds"
    assert state.store.multi_get([("a",)]) == [TransactionalValue(1, 2)]
    state.close()


def test_a_tail_compacted_after_the_failed_write_needs_a_rebuild(tmp_path, monkeypatch):
    state = _open(tmp_path, -1)
    _commit(tmp_path, state, 0, {"a": 1})
    _failing_writes(monkeypatch, state.store, times=1)
    with pytest.raises(StateError):
        _commit(tmp_path, state, 1, {"a": 2})
    compact_queue(_queue(tmp_path), tmp_path / "snapshots", 1, committed_epoch=EPOCH)  # deletes txid 0 and 1's files

    with pytest.raises(StateStoreBehindError, match="rebuilds the store"):
        state.catch_up(1, EPOCH)
    assert state.store.applied_marker() == (0, EPOCH)
    state.close()

    again = _open(tmp_path, 1)  # the next start: rebuilt from the snapshot
    assert again.rebuilt and again.store.multi_get([("a",)]) == [TransactionalValue(1, 2)]
    again.close()
