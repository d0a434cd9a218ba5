"""A worker's failed tasks: each failure logged once and recorded in ``/errors/{id}/{task}``,
the task tried again after a backoff and quarantined after ``quarantine_after`` failures in a
row, until an operator clears its record (:mod:`stream_ops.runtime.task_failures`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection

from stream_ops.coordination.store import ZkStore
from stream_ops.errors import StreamOpsError
from stream_ops.runtime.task_failures import (
    FailurePolicy,
    FailureTracker,
    TaskFailure,
    is_resource_exhaustion,
    mark_task_recovered,
    quarantine_cleared,
    record_task_failure,
)

logger = logging.getLogger(__name__)

#: Seconds between two reads of a quarantined task's ``/errors`` record (has an operator cleared it?).
QUARANTINE_CHECK_S = 2.0


class FailedTasks:
    """The failure state of the tasks assigned to one worker.

    Args:
        worker_id: the worker's ``host:port``.
        policy: backoff and quarantine.
        store: the worker's ZooKeeper access as it is now (set once the worker runs).
        clock: wall clock for the ``/errors`` records.
    """

    def __init__(
        self,
        *,
        worker_id: str,
        policy: FailurePolicy,
        store: Callable[[], ZkStore | None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.worker_id = worker_id
        self.policy = policy
        self._store = store
        self.clock = clock
        self._failures = FailureTracker(policy)
        self._quarantine_checked: dict[tuple[str, int], float] = {}
        # Quarantines whose /errors record could not be written yet (written again until it is).
        self._unrecorded: dict[tuple[str, int], tuple[TaskFailure, float]] = {}

    def started(self, key: tuple[str, int], now: float) -> None:
        """``key`` started at ``now`` (monotonic)."""
        self._failures.started(key, now=now)

    def recovered(self, key: tuple[str, int], now: float) -> bool:
        """Whether ``key`` has just run long enough after failures to count as recovered."""
        return self._failures.recovered(key, now=now)

    def forget_unassigned(self, assigned: Collection[tuple[str, int]]) -> None:
        """Drop the failure state of tasks not in ``assigned`` (a new assignment starts clean)."""
        self._failures.retain(assigned)
        for bookkeeping in (self._quarantine_checked, self._unrecorded):
            for key in [k for k in bookkeeping if k not in assigned]:
                del bookkeeping[key]

    def may_start(self, key: tuple[str, int], assigned_at: float | None, now: float) -> bool:
        """Whether ``key`` may be started now: not backing off, not quarantined (or cleared)."""
        if self._failures.may_start(key, now=now, assigned_at=assigned_at):
            return True
        failure = self._failures.get(key)
        return failure is not None and failure.quarantined and self._quarantine_lifted(key, now)

    def _quarantine_lifted(self, key: tuple[str, int], now: float) -> bool:
        """Whether an operator cleared ``key``'s ``/errors`` record (read at most every few seconds)."""
        store = self._store()
        assert store is not None
        if now - self._quarantine_checked.get(key, float("-inf")) < QUARANTINE_CHECK_S:
            return False
        self._quarantine_checked[key] = now
        if key in self._unrecorded:
            self._record_failure(key, *self._unrecorded[key])
            return False
        if not quarantine_cleared(store, key):
            return False
        self._failures.clear(key)
        del self._quarantine_checked[key]
        logger.info("task %s/%d: quarantine lifted (its /errors record was cleared); starting it again", *key)
        return True

    def failed(self, key: tuple[str, int], assigned_at: float | None, reason: str) -> None:
        """Count a failure of ``key``: log it once, back off or quarantine, record it in ZooKeeper."""
        now = time.monotonic()
        failure = self._failures.failed(key, reason, now=now, assigned_at=assigned_at)
        policy = self.policy
        if failure.quarantined:
            wait_s = 0.0
            logger.error(
                "task %s/%d failed %d times in a row, quarantined: %s. This worker no longer starts it; once the "
                "cause is fixed, delete /errors/%s/%d in ZooKeeper or resubmit the topology",
                key[0],
                key[1],
                failure.failures,
                reason,
                key[0],
                key[1],
            )
        else:
            wait_s = failure.retry_at - now  # a full disk backs off less and is never quarantined
            logger.error(
                "task %s/%d failed (%s): %s; next try in %g s",
                key[0],
                key[1],
                "out of disk space: never quarantined, it starts again once there is room"
                if is_resource_exhaustion(reason)
                else f"{failure.failures} of {policy.quarantine_after} before quarantine",
                reason,
                wait_s,
            )
        self._record_failure(key, failure, wait_s)

    def _record_failure(self, key: tuple[str, int], failure: TaskFailure, wait_s: float) -> None:
        """Write ``failure`` to ``/errors/{id}/{task}``; a quarantine not written is written again later."""
        store = self._store()
        assert store is not None
        try:
            record_task_failure(
                store,
                key,
                failure,
                worker_id=self.worker_id,
                policy=self.policy,
                wait_s=wait_s,
                clock=self.clock,
            )
        except StreamOpsError as e:
            logger.warning("task %s/%d: failure not recorded in ZooKeeper: %s", key[0], key[1], e)
            if failure.quarantined:
                self._unrecorded[key] = (failure, wait_s)
            return
        self._unrecorded.pop(key, None)

    def mark_recovered(self, key: tuple[str, int]) -> None:
        """``key`` has run long enough after failures: reset its count in ZooKeeper too."""
        store = self._store()
        assert store is not None
        logger.info(
            "task %s/%d has run %g s without failing; its failure count is reset",
            key[0],
            key[1],
            self.policy.healthy_after_s,
        )
        try:
            mark_task_recovered(store, key)
        except StreamOpsError as e:
            logger.warning("task %s/%d: recovery not recorded in ZooKeeper: %s", key[0], key[1], e)
