"""Standby replicas: warm copies of stateful tasks' stores on workers that do not own them.

Kafka Streams' ``num.standby.replicas`` for stream_ops. The nimbus names, per stateful task,
the workers that keep a standby (``/assignments/{id}`` ``standbys``). Each of them follows the
task's committed txid in ZooKeeper and applies the state topic's tail above its store's marker
(:func:`~stream_ops.state.restore.catch_up_store`), into the very directory the task's store
would use on that worker. When the task fails over to it (the nimbus prefers a standby, and a
cleanly stopping owner moves the task onto a live one itself,
:func:`~stream_ops.nimbus.assignment.hand_over_to_standbys`), the new owner opens that store
and applies only the txids committed since the last poll.

A standby only reads the state topic, its snapshots and ``/transactional``; the one thing it
writes besides its own local store is an ephemeral ``/standbys/{id}/{task}@{worker}`` record of
how far it got, for observers and for a stopping owner choosing whom to hand the task to.
Nothing the commit protocol reads.

Where the state topic is (files, or a Kafka partition) comes from the topology's conf in its
``/storms`` record, read when the replica is made; a replica on Kafka keeps its reader between
polls, so each poll reads only the records produced since the last one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from stream_ops.coordination.cluster_state import read_storm
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import StandbyRecord, TaskRecord, TransactionalRecord
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import CoordinationError, StreamOpsError, ZnodeNotFoundError
from stream_ops.state.rocksdb_backing import RocksDBBackingMap
from stream_ops.state.state_log import FileStateLog, StateLog, open_state_log
from stream_ops.state.state_topic import StateTopicQueue

logger = logging.getLogger(__name__)

TaskKey = tuple[str, int]


@dataclass(frozen=True)
class StandbyTarget:
    """Where one standby replica reads and writes."""

    store_dir: Path
    queue: StateTopicQueue
    snapshot_dir: Path | None


@dataclass(frozen=True)
class StandbyProgress:
    """Where a replica is after a sync: its marker, its keys, and how it got there."""

    txid: int
    epoch: int
    keys: int
    how: str
    """``current``, ``tail`` (applied the state-topic tail) or ``rebuilt``."""


class StandbyReplica:
    """One warm copy of a task's store, brought up to a committed txid by :meth:`sync`.

    ``log`` is the task's state topic (default: the file queue of ``target``).
    """

    def __init__(self, target: StandbyTarget, log: StateLog | None = None) -> None:
        self.target = target
        self.log: StateLog = log if log is not None else FileStateLog(target.queue)
        self._store: RocksDBBackingMap | None = None

    def sync(self, committed_txid: int, committed_epoch: int) -> StandbyProgress | None:
        """Catch up to (``committed_txid``, ``committed_epoch``): the tail when the store is at a
        committed state, else a rebuild (snapshot + tail). None before the first commit."""
        if committed_txid < 0:
            return None
        store = self._open()
        applied = self.log.catch_up(store, committed_txid, committed_epoch, snapshot_dir=self.target.snapshot_dir)
        how = "current" if applied == 0 else "tail"
        if applied is None:
            logger.info("standby %s: rebuilding at txid %d from the state topic", self.target.store_dir, committed_txid)
            self._close_store()
            RocksDBBackingMap.destroy(self.target.store_dir)
            store = self._open()
            self.log.rebuild(store, committed_txid, committed_epoch, snapshot_dir=self.target.snapshot_dir, require_complete=True)
            how = "rebuilt"
        return StandbyProgress(committed_txid, committed_epoch, store.count_keys(), how)

    def _open(self) -> RocksDBBackingMap:
        if self._store is None:
            self.target.store_dir.parent.mkdir(parents=True, exist_ok=True)
            self._store = RocksDBBackingMap(self.target.store_dir)
        return self._store

    def close(self) -> None:
        """Close the store (kept on disk, for the task to take over or the next sync) and the log's clients."""
        self._close_store()
        self.log.close()

    def _close_store(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


class StandbyPool:
    """The standby replicas one worker keeps, synced on their own thread.

    :meth:`update` names the replicas wanted now (from the assignments); :meth:`release`
    hands a replica's store over to the task starting on this worker. A sync never runs while
    its replica is released, and a release waits for a sync in progress.
    """

    def __init__(
        self,
        store: ZkStore,
        worker_id: str,
        *,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.worker_id = worker_id
        self.interval_s = interval_s
        self.clock = clock
        self._lock = threading.Lock()
        self._replicas: dict[TaskKey, StandbyReplica] = {}
        self._wanted: dict[TaskKey, StandbyTarget] = {}
        self._written: dict[TaskKey, tuple[int, int]] = {}

    @property
    def keys(self) -> list[TaskKey]:
        """The tasks this worker keeps a standby of."""
        with self._lock:
            return sorted(self._wanted)

    def update(self, wanted: Mapping[TaskKey, StandbyTarget]) -> None:
        """Keep standbys of exactly ``wanted``; the others are closed and their records removed."""
        with self._lock:
            self._wanted = dict(wanted)
            for key in [k for k in self._replicas if k not in wanted]:
                self._drop(key)

    def release(self, key: TaskKey) -> None:
        """Stop keeping ``key`` (its task starts here): close its store, leave it on disk."""
        with self._lock:
            self._wanted.pop(key, None)
            self._drop(key)

    def close(self, wait_s: float = 5.0) -> None:
        """Close every replica (the stores stay on disk); gives up after ``wait_s`` if a sync
        is still running (a long rebuild: the process exit closes it)."""
        if not self._lock.acquire(timeout=wait_s):
            logger.warning("standby replicas of %s still syncing; not waiting for them", self.worker_id)
            return
        try:
            for key in list(self._replicas):
                self._drop(key, remove_record=False)
            self._wanted.clear()
        finally:
            self._lock.release()

    def run(self, stop: threading.Event, connected: threading.Event) -> None:
        """Sync every replica each ``interval_s`` while connected, until ``stop``."""
        while not stop.wait(self.interval_s):
            if connected.is_set():
                self.sync_all()

    def sync_all(self) -> None:
        """One round: bring every wanted replica up to its task's committed txid."""
        for key in self.keys:
            with self._lock:
                target = self._wanted.get(key)
                if target is None:
                    continue
                try:
                    self._sync(key, target)
                except (StreamOpsError, OSError) as e:
                    logger.warning("standby of task %s/%d: %s", key[0], key[1], e)

    def _sync(self, key: TaskKey, target: StandbyTarget) -> None:
        found = self.store.get_json(ZkPaths.transactional_task(*key))
        if found is None:
            return
        committed = TransactionalRecord.model_validate(found[0])
        replica = self._replicas.get(key)
        if replica is None:
            replica = self._replicas[key] = StandbyReplica(target, self._state_log(key, target.queue))
        progress = replica.sync(committed.committed_txid, committed.committed_epoch)
        if progress is None:
            return
        if progress.how != "current":
            logger.info(
                "standby of task %s/%d on %s: %s to txid %d (%d keys)",
                key[0],
                key[1],
                self.worker_id,
                "applied the state-topic tail" if progress.how == "tail" else "rebuilt",
                progress.txid,
                progress.keys,
            )
        if self._written.get(key) != (progress.txid, progress.epoch):
            self._write_record(key, progress)

    def _state_log(self, key: TaskKey, queue: StateTopicQueue) -> StateLog:
        """The task's state topic, where its topology's conf keeps it (``queue`` is its file queue)."""
        storm = read_storm(self.store, key[0])
        found = self.store.get_json(ZkPaths.task(*key))
        if found is None:
            raise ZnodeNotFoundError(f"task {key[0]}/{key[1]} has no /tasks record")
        task = TaskRecord.model_validate(found[0])
        return open_state_log(
            storm.conf,
            file_topic=queue.topic,
            queue=queue.queue,
            topology_id=key[0],
            stage_index=task.stage,
            stage_name=task.stage_name,
        )

    def _write_record(self, key: TaskKey, progress: StandbyProgress) -> None:
        record = StandbyRecord(
            worker_id=self.worker_id,
            applied_txid=progress.txid,
            applied_epoch=progress.epoch,
            time=self.clock(),
            keys=progress.keys,
        )
        path = ZkPaths.standby(key[0], key[1], self.worker_id)
        if key in self._written:
            try:
                self.store.set_json(path, record.to_json_obj())
                self._written[key] = (progress.txid, progress.epoch)
                return
            except ZnodeNotFoundError:  # gone with an expired session: create it again
                pass
        self.store.ensure_path(ZkPaths.standbys(key[0]))
        try:
            self.store.delete(path)  # a record an earlier session of this worker left
        except ZnodeNotFoundError:
            pass
        self.store.create_json(path, record.to_json_obj(), ephemeral=True)
        self._written[key] = (progress.txid, progress.epoch)

    def _drop(self, key: TaskKey, *, remove_record: bool = True) -> None:
        replica = self._replicas.pop(key, None)
        if replica is not None:
            replica.close()
        if key in self._written:
            del self._written[key]
            if remove_record:
                try:
                    self.store.delete(ZkPaths.standby(key[0], key[1], self.worker_id))
                except CoordinationError as e:
                    logger.debug("standby record of task %s/%d not removed: %s", key[0], key[1], e)
