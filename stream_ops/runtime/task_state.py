"""Open a keyed task's local state: reuse the RocksDB store, catch it up, or rebuild it.

The local store is reused as it is when its applied marker is exactly the committed (txid,
epoch) recorded in ZooKeeper. A store that holds an earlier *committed* state (a standby
replica's, or one left from an earlier stay of the task on this worker) catches up by applying
only the state-topic tail above its marker (:meth:`~stream_ops.state.state_log.StateLog.catch_up`).
Anything else (a batch applied but never committed, a tail compacted away, no store at all)
means rebuilding it from the snapshot and the state topic up to the committed txid (DESIGN
invariant 5). The state topic is a :class:`~stream_ops.state.state_log.StateLog`: files, or a
Kafka partition when the topology's conf says so.

A running task whose write of a committed batch into the store failed catches the store up the
same way (:meth:`TaskState.catch_up`), without closing it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from stream_ops.errors import StateError, StateStoreBehindError
from stream_ops.state.map_states import MapState, OpaqueMapState, TransactionalMapState
from stream_ops.state.rocksdb_backing import RocksDBBackingMap
from stream_ops.state.state_log import FileStateLog, StateLog
from stream_ops.state.state_topic import StateTopicQueue
from stream_ops.topics.file_topic import FileTopic

logger = logging.getLogger(__name__)

MAP_STATES: dict[str, type[TransactionalMapState | OpaqueMapState | MapState]] = {
    "transactional": TransactionalMapState,
    "opaque": OpaqueMapState,
    "non-transactional": MapState,
}


@dataclass
class TaskState:
    """The keyed state of one task: local store, map-state rules and state-topic queue."""

    store: RocksDBBackingMap
    map_state: TransactionalMapState | OpaqueMapState | MapState | None
    log: StateLog
    """The task's queue of the state topic (files or Kafka)."""
    restored_keys: int
    rebuilt: bool
    tail_keys: int | None = None
    """Changed keys applied from the state-topic tail when the store caught up (None: it did not)."""
    snapshot_dir: Path | None = None
    """Where the queue's snapshots are written (a catch-up reads the newest when it must)."""

    @property
    def state_topic(self) -> StateTopicQueue | None:
        """The file state topic's queue, None when the state topic is in Kafka."""
        return self.log.queue if isinstance(self.log, FileStateLog) else None

    def catch_up(self, committed_txid: int, committed_epoch: int) -> int:
        """Bring the store to the committed (txid, epoch) from the state topic after writing a
        committed batch into it failed: drop the batch's buffered writes, then apply the
        state-topic tail above the store's marker and the new marker in one atomic write, as a
        start does (:func:`open_task_state`); a store that never applied a batch is restored.

        Returns:
            The changed keys applied (0: the store was at the committed state already).

        Raises:
            StateStoreBehindError: the store is at no committed state its tail can extend (the
                tail was compacted meanwhile): only a rebuild at the next start can help.
            StateError: the store refused the write (a ReplayError: a state-topic file is
                corrupt or missing).
        """
        store = self.store
        store.discard_pending()
        applied = self.log.catch_up(store, committed_txid, committed_epoch, snapshot_dir=self.snapshot_dir)
        if applied is not None:
            return applied
        if store.applied_marker() is None:  # an empty store (the first batch's write failed): restore it
            return self.log.rebuild(store, committed_txid, committed_epoch, snapshot_dir=self.snapshot_dir)
        raise StateStoreBehindError(
            f"state store {store.path} is at {store.applied_marker()} and cannot be caught up to committed txid "
            f"{committed_txid} from {self.log.where} (the tail above its marker was compacted); the task must start "
            "again, which rebuilds the store from the newest snapshot"
        )

    def close(self) -> None:
        self.store.close()
        self.log.close()


def open_task_state(
    *,
    store_dir: Path,
    kind: str | None,
    committed_txid: int,
    committed_epoch: int,
    snapshot_dir: Path | None = None,
    state_topic: FileTopic | None = None,
    queue: int = 0,
    log: StateLog | None = None,
) -> TaskState:
    """Open (or rebuild) the local store of a stateful task.

    ``kind`` is the map-state kind of a keyed stage, or None for a stage whose processor
    keeps its own state in the store (join windows, processing elements). The state topic is
    ``log``, or queue ``queue`` of the file state topic ``state_topic``.

    Raises:
        StateError: neither ``log`` nor ``state_topic`` is given.
        ReplayError: the store cannot be rebuilt at the committed txid.
    """
    if log is not None:
        queue_log = log
    elif state_topic is not None:
        queue_log = FileStateLog(StateTopicQueue(state_topic, queue))
    else:
        raise StateError("open_task_state needs the task's state topic: log= or state_topic=")
    try:
        return _open(queue_log, store_dir, kind, committed_txid, committed_epoch, snapshot_dir)
    except BaseException:
        queue_log.close()
        raise


def _open(
    queue_log: StateLog, store_dir: Path, kind: str | None, committed_txid: int, committed_epoch: int, snapshot_dir: Path | None
) -> TaskState:
    expected = None if committed_txid < 0 else (committed_txid, committed_epoch)
    rebuilt = True
    tail: int | None = None
    if store_dir.exists():
        store = RocksDBBackingMap(store_dir)
        marker = store.applied_marker()
        if marker != expected and expected is not None:
            try:
                tail = queue_log.catch_up(store, *expected, snapshot_dir=snapshot_dir)
            except BaseException:
                store.close()
                raise
        if marker == expected or tail is not None:
            rebuilt = False
        else:
            logger.info("local store %s is at %s, committed is %s: rebuilding from the state topic", store_dir, marker, expected)
            store.close()
            RocksDBBackingMap.destroy(store_dir)
    restored = 0
    if rebuilt:
        store_dir.parent.mkdir(parents=True, exist_ok=True)
        store = RocksDBBackingMap(store_dir)
        try:
            if committed_txid >= 0:
                restored = queue_log.rebuild(
                    store, committed_txid, committed_epoch, snapshot_dir=snapshot_dir, require_complete=True
                )
        except BaseException:
            # closed here, not when the error is collected: its traceback may sit in a cycle
            # (a failed future of the replay's thread pool) and keep the RocksDB lock meanwhile
            store.close()
            raise
    map_state = MAP_STATES[kind](store) if kind is not None else None
    return TaskState(
        store=store,
        map_state=map_state,
        log=queue_log,
        restored_keys=restored,
        rebuilt=rebuilt,
        tail_keys=tail,
        snapshot_dir=snapshot_dir,
    )
