"""A task's keyed state as the commit protocol writes it and state queries read it.

Step 4 appends a batch's changes to the state topic; step 6 writes them, with the applied
marker (txid, epoch), into the local RocksDB store on the task's I/O thread, after the
ZooKeeper commit (why after: :mod:`stream_ops.runtime.task_runner`). A write that fails is
repaired at once from the state topic, or fails the task. State queries
(:meth:`StateStoreWrites.lookup`) wait for a committed batch's write in flight and never answer
from a store behind the committed txid (DESIGN invariant 9).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from stream_ops.coordination.store import ZkStore
from stream_ops.errors import OwnershipLostError, StateError, StateNotReadyError, StateStoreBehindError
from stream_ops.runtime.map_state_update import MapStateUpdate
from stream_ops.runtime.ownership import Ownership, verify_owner
from stream_ops.runtime.task_state import TaskState
from stream_ops.runtime.task_stats import TaskStats
from stream_ops.state.state_topic import encode_changes
from stream_ops.state.value_columns import ChangeColumns

logger = logging.getLogger(__name__)

CATCH_UP_ATTEMPTS = 3
"""Tries at catching the store up from the state topic after a committed batch's write failed,
0.2 s then 0.4 s apart, before the task fails (:class:`~stream_ops.errors.StateStoreBehindError`)."""


class StateStoreWrites:
    """Steps 4 and 6 of one task's state, and its state queries.

    Args:
        zk: ZooKeeper access (ownership is checked again after a repair).
        topology_id: the task's topology.
        task_id: the task.
        state: the task's state as it is now (None before it opens and once it is closed).
        ownership: the task's ownership as it is now (None before it is taken).
        io: the task's I/O thread, which writes the store.
        stopping: set once the task stops (a repair then gives up).
        connected: set while the ZooKeeper session is connected.
        commit_wait_s: how long a lookup waits for a committed batch's store write.
        stats: the task's counters (the state-topic and RocksDB steps' times).
    """

    def __init__(
        self,
        *,
        zk: ZkStore,
        topology_id: str,
        task_id: int,
        state: Callable[[], TaskState | None],
        ownership: Callable[[], Ownership | None],
        io: ThreadPoolExecutor,
        stopping: threading.Event,
        connected: threading.Event,
        commit_wait_s: float,
        stats: TaskStats,
    ) -> None:
        self.zk = zk
        self.topology_id = topology_id
        self.task_id = task_id
        self._state = state
        self._ownership = ownership
        self._io = io
        self._stopping = stopping
        self._connected = connected
        self._commit_wait_s = commit_wait_s
        self._stats = stats
        self._state_write: Future[None] | None = None
        self.failed: BaseException | None = None
        """Why a committed batch's store write failed for good (the task fails), or None."""
        self._ownership_lost: OwnershipLostError | None = None
        self.appended: tuple[int, int] | None = None
        """(entries, bytes) of the last state-topic append."""

    def append_changes(self, txid: int, epoch: int, map_update: MapStateUpdate) -> ChangeColumns | None:
        """Step 4: the batch's state changes to the state topic; returns them encoded for the
        RocksDB write (None for a task without state)."""
        state = self._state()
        if state is None:
            return None
        started = time.perf_counter()
        held = map_update.take_column_changes()
        if held is not None and held[0] == txid and not state.store.has_pending():
            encoded = held[1]
        else:
            keys, values = state.store.pending_columns()
            encoded = encode_changes(keys, values, key_texts=map_update.shuffled_key_texts(txid, keys), where=state.log.where)
        size = state.log.append_batch(self.task_id, txid, epoch, encoded)
        self.appended = (len(encoded), size)
        self._stats.commit_steps_ms["state_topic"] += (time.perf_counter() - started) * 1000.0
        return encoded

    def commit_starts(self) -> Future[None]:
        """Step 5 begins: from here a state query waits until the store holds this batch (or
        the commit failed), so it never reads the store behind a commit ZooKeeper already
        shows. Returns the future that releases those queries."""
        visible: Future[None] = Future()
        self._state_write = visible
        return visible

    def commit_failed(self, error: BaseException, visible: Future[None]) -> None:
        """Step 5 raised ``error``: nothing committed, so the store holds the committed state."""
        if isinstance(error, OwnershipLostError):
            self._ownership_lost = error  # a newer owner commits from now on: this one answers no query
        visible.set_result(None)

    def write_committed(self, txid: int, epoch: int, encoded: ChangeColumns | None, visible: Future[None]) -> None:
        """Step 6's RocksDB part: the committed batch's ``encoded`` changes into the store on
        the I/O thread; ``visible`` completes once they are written (or repaired, or failed)."""
        if encoded is not None:
            self._io.submit(self._write, txid, epoch, encoded).add_done_callback(
                lambda written: self._written(txid, written, visible)
            )
        else:
            visible.set_result(None)

    def _write(self, txid: int, epoch: int, encoded: ChangeColumns) -> None:
        """On the I/O thread: the committed batch's changes and the applied marker (txid,
        epoch) into RocksDB, one synced write batch."""
        state = self._state()
        if state is None:  # closed by a stop after the commit: the next start catches the store up
            return
        started = time.perf_counter()
        try:
            state.store.flush(txid, epoch, encoded=encoded)
        except Exception as e:  # noqa: BLE001 - whatever failed, the state topic holds the batch: re-apply it from there
            logger.warning(
                "task %s/%d: writing committed txid %d to the local state store failed (%s: %s); "
                "catching the store up from the state topic",
                self.topology_id,
                self.task_id,
                txid,
                type(e).__name__,
                e,
            )
            self._catch_up(state, txid, epoch, e)
        self._stats.commit_steps_ms["rocksdb"] += (time.perf_counter() - started) * 1000.0

    def _catch_up(self, state: TaskState, txid: int, epoch: int, cause: Exception) -> None:
        """On the I/O thread, after committed batch ``txid``'s store write failed: re-apply the
        batch from the state topic (a few tries), then check we still own the task, since state
        queries are answered from this store again once this returns.

        Raises:
            StateStoreBehindError: the store could not be caught up (the task fails).
            OwnershipLostError: the task has a newer owner (the task fails).
        """
        ownership = self._ownership()
        assert ownership is not None
        last: Exception = cause
        for attempt in range(CATCH_UP_ATTEMPTS):
            if attempt and self._stopping.wait(0.1 * 2**attempt):
                break  # a stop: the next start catches the store up
            try:
                applied = state.catch_up(txid, epoch)
            except StateStoreBehindError:
                raise
            except Exception as e:  # noqa: BLE001 - the disk may recover; tried again, then reported
                last = e
                continue
            verify_owner(self.zk, ownership)
            logger.info(
                "task %s/%d: local state store caught up to committed txid %d from the state topic (%d changed keys)",
                self.topology_id,
                self.task_id,
                txid,
                applied,
            )
            return
        raise StateStoreBehindError(
            f"task {self.topology_id}/{self.task_id}: the local state store could not be brought to committed "
            f"txid {txid}: its write failed ({type(cause).__name__}: {cause}) and so did catching it up from the state "
            f"topic ({type(last).__name__}: {last}); the task stops, and its next start catches the store up from the "
            "state topic or rebuilds it (check the local disk of the store)"
        ) from last

    def _written(self, txid: int, written: Future[None], visible: Future[None]) -> None:
        """The outcome of committed batch ``txid``'s store write, passed on to the state queries
        and the next batch through ``visible``; a failure fails the task at once (no later batch
        need arrive to notice), recorded before ``visible`` wakes the queries waiting on it."""
        error = written.exception()
        if error is None:
            visible.set_result(None)
            return
        if self.failed is None:
            self.failed = error
        logger.log(
            logging.WARNING if self._stopping.is_set() else logging.ERROR,  # a stop cut the catch-up short
            "task %s/%d: the local state store is behind committed txid %d; the task stops answering state queries "
            "and fails: %s: %s",
            self.topology_id,
            self.task_id,
            txid,
            type(error).__name__,
            error,
        )
        visible.set_exception(error)

    def await_write(self) -> None:
        """Wait for the last committed batch's RocksDB write.

        Raises:
            StateError: that write failed; the store is behind the committed txid until the task
                starts again (which catches it up from the state topic).
        """
        pending = self._state_write
        if pending is not None:
            try:
                pending.result()
            except BaseException as e:  # noqa: BLE001 - whatever ended the write on its thread is reported below
                self.failed = e
            # cleared only once done: a query arriving meanwhile still waits for it
            if self._state_write is pending:
                self._state_write = None
        if self.failed is not None:
            raise StateError(
                f"task {self.topology_id}/{self.task_id}: writing a committed batch to the local state store "
                f"failed and could not be repaired ({type(self.failed).__name__}: "
                f"{self.failed}); the task must start again, which catches the store up from the state topic"
            ) from self.failed

    def lookup(self, keys: list[tuple[Any, ...]]) -> list[Any]:
        """Committed values of ``keys`` in the task's state, never older than the task's
        committed txid.

        Raises:
            LookupError: the task keeps no state.
            StateNotReadyError: the store may be behind the committed txid: a commit or its
                store write in flight longer than ``commit_wait_s``, a write that failed and is
                being caught up or failed for good; ZooKeeper not connected, or the task lost to a
                newer owner. Retryable.
        """
        state = self._state()
        if state is None:
            raise LookupError(f"task {self.task_id} keeps no state")
        where = f"task {self.topology_id}/{self.task_id}"
        # Read first: a commit after this point is concurrent with the query, one before it is not.
        ownership = self._ownership()
        committed = ownership.committed_txid if ownership is not None else -1
        if not self._connected.is_set():
            raise StateNotReadyError(f"{where}: not connected to ZooKeeper, so the task may have a new owner; ask again shortly")
        # RocksDB never holds an uncommitted batch (it is written after the commit); waiting for
        # a committed batch's write in flight (milliseconds) lets a query see every commit made.
        writing = self._state_write
        if writing is not None and not wait((writing,), timeout=self._commit_wait_s).done:
            raise StateNotReadyError(
                f"{where}: committed txid {committed} is still being written to the local state store (over "
                f"{self._commit_wait_s:g} s); ask again shortly"
            )
        if self._ownership_lost is not None:
            raise StateNotReadyError(
                f"{where}: this worker lost the task to a newer owner (its commit was refused); ask again shortly, "
                "the query then goes to the task's new worker"
            ) from self._ownership_lost
        failed = self.failed
        if failed is not None:
            raise StateNotReadyError(
                f"{where}: its local state store is behind committed txid {committed} and the task is failing "
                f"({type(failed).__name__}); it answers again once it has started anew, ask again shortly"
            ) from failed
        marker = state.store.applied_marker()
        if committed >= 0 and (marker is None or marker[0] < committed):
            raise StateNotReadyError(
                f"{where}: its local state store is at {marker}, behind committed txid {committed}; ask again shortly"
            )
        return [_unwrap(v) for v in state.store.multi_get(keys, include_pending=False)]


def _unwrap(stored: Any) -> Any:
    if stored is None:
        return None
    if hasattr(stored, "curr"):
        return stored.curr
    if hasattr(stored, "val"):
        return stored.val
    return stored
