"""Failed tasks: backoff, quarantine and their ``/errors/{id}/{task}`` records.

One topology's broken task must cost its worker nothing but the task: a State factory that
raises, a plan that does not load, a query that keeps failing. The worker catches the error,
and this module decides when it tries again.

State machine of one task on one worker (:class:`FailureTracker`, pure: it reads no clock and
does no I/O, every method takes ``now``):

* **ok** (no entry): the worker starts the task whenever it is assigned here.
* **backing off**: after failure ``n`` the task is not started again before
  ``policy.backoff_s(n)`` (1 s, 2 s, 4 s, ... up to ``max_backoff_s``) has passed.
* **quarantined**: after ``quarantine_after`` consecutive failures the worker stops trying.
  Not for a machine out of a resource (:func:`is_resource_exhaustion`: a full disk, a disk
  quota): that is the environment, not the task, so it backs off (at most
  ``resource_backoff_s``) and starts again by itself once space returns, however long it took.
* A task that ran ``healthy_after_s`` without failing goes back to **ok** (its count resets).
* A new assignment of the task (its start time in ``/assignments/{id}`` changes, e.g. it moved
  away and back) resets it to **ok**, and so does an operator deleting ``/errors/{id}/{task}``
  or setting its ``quarantined`` to false (:func:`quarantine_cleared`); a resubmission is a new
  topology id, so it starts clean.

Every failure is written to ``/errors/{id}/{task}`` (an :class:`ErrorRecord`, compare-and-set,
the last ``kept_errors`` errors), which ``stream-ops status`` and the Dagster observations show.

Example:
    >>> tracker = FailureTracker(FailurePolicy(quarantine_after=2))
    >>> tracker.failed(("wc-1-1", 3), "OperationalError: disk I/O error", now=100.0, assigned_at=5.0).retry_at
    101.0
    >>> tracker.may_start(("wc-1-1", 3), now=100.5, assigned_at=5.0), tracker.may_start(("wc-1-1", 3), now=101.0, assigned_at=5.0)
    (False, True)
    >>> tracker.failed(("wc-1-1", 3), "OperationalError: disk I/O error", now=101.5, assigned_at=5.0).quarantined
    True
    >>> tracker.may_start(("wc-1-1", 3), now=10_000.0, assigned_at=5.0)
    False
    >>> tracker.may_start(("wc-1-1", 3), now=10_000.0, assigned_at=9.0)  # reassigned: tried again
    True
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import ErrorRecord, TaskError, parse_error_record
from stream_ops.coordination.store import ZkStore

__all__ = [
    "FailurePolicy",
    "FailureTracker",
    "TaskFailure",
    "TaskKey",
    "clear_task_errors",
    "describe_error",
    "is_resource_exhaustion",
    "mark_task_recovered",
    "quarantine_cleared",
    "read_task_error",
    "read_task_errors",
    "record_task_failure",
]

logger = logging.getLogger(__name__)

TaskKey = tuple[str, int]
"""(topology id, task id)."""

#: Longest failure reason kept (a Spark error's text can be very long).
MAX_REASON_CHARS = 1000


class FailurePolicy(BaseModel):
    """How a worker treats a task that fails to start or whose query fails.

    Example:
        >>> [FailurePolicy().backoff_s(n) for n in (1, 2, 3, 7, 8)]
        [1.0, 2.0, 4.0, 60.0, 60.0]
    """

    model_config = ConfigDict(frozen=True)

    initial_backoff_s: float = Field(1.0, gt=0, description="Wait before the first retry; doubles after each failure.")
    max_backoff_s: float = Field(60.0, gt=0, description="Longest wait between two tries.")
    quarantine_after: int = Field(
        5, ge=1, description="Consecutive failures after which the worker stops trying the task (quarantine)."
    )
    healthy_after_s: float = Field(
        60.0, gt=0, description="A task running this long without failing has its failure count reset."
    )
    kept_errors: int = Field(10, ge=1, description="Most recent errors kept in /errors/{topology}/{task}.")
    resource_backoff_s: float = Field(
        5.0, gt=0, description="Longest wait between two tries of a task failing for a full disk (never quarantined)."
    )

    def backoff_s(self, failures: int, *, resource: bool = False) -> float:
        """Wait after the ``failures``-th consecutive failure (1-based); ``resource``: a full disk's."""
        longest = min(self.max_backoff_s, self.resource_backoff_s) if resource else self.max_backoff_s
        return min(longest, self.initial_backoff_s * 2.0 ** max(failures - 1, 0))


#: What the operating system says when a machine is out of room (``strerror`` of ENOSPC, EDQUOT),
#: found in a failure's reason, which for a query's failure is only text (it crossed Py4J).
_RESOURCE_EXHAUSTION = ("No space left on device", "Disk quota exceeded")


def is_resource_exhaustion(reason: str) -> bool:
    """Whether a failure's ``reason`` says the machine ran out of disk space or quota.

    Example:
        >>> is_resource_exhaustion("TopicError: could not write x: [Errno 28] No space left on device")
        True
        >>> is_resource_exhaustion("ImportError: no module named 'mypkg'")
        False
    """
    return any(text in reason for text in _RESOURCE_EXHAUSTION)


@dataclass(frozen=True)
class TaskFailure:
    """What a worker remembers of a failing task.

    Attributes:
        failures: Consecutive failures on this worker.
        reason: The last one's reason.
        retry_at: Earliest next start, by the tracker's clock (``inf`` when quarantined).
        quarantined: Whether the worker stopped trying.
        assigned_at: The task's assignment start time when it failed; another means a new assignment.
    """

    failures: int
    reason: str
    retry_at: float
    quarantined: bool
    assigned_at: float | None


class FailureTracker:
    """Backoff and quarantine of the failing tasks of one worker (pure; see the module doc).

    Not thread-safe: the worker's main loop owns it.

    Args:
        policy: Backoff and quarantine settings.
    """

    def __init__(self, policy: FailurePolicy) -> None:
        self.policy = policy
        self._failures: dict[TaskKey, TaskFailure] = {}
        self._running_since: dict[TaskKey, float] = {}

    def get(self, key: TaskKey) -> TaskFailure | None:
        """The failure state of ``key``, if it failed since it last was healthy."""
        return self._failures.get(key)

    def failed(self, key: TaskKey, reason: str, *, now: float, assigned_at: float | None) -> TaskFailure:
        """Count a failure of ``key`` at ``now``; returns its new state."""
        self._running_since.pop(key, None)
        previous = self._failures.get(key)
        resource = is_resource_exhaustion(reason)
        if previous is None or previous.assigned_at != assigned_at:
            failures = 1
        elif is_resource_exhaustion(previous.reason) and not resource:
            failures = 1  # a full disk's failures do not count towards the quarantine of what fails after it
        else:
            failures = previous.failures + 1
        quarantined = failures >= self.policy.quarantine_after and not resource
        failure = TaskFailure(
            failures=failures,
            reason=reason,
            retry_at=float("inf") if quarantined else now + self.policy.backoff_s(failures, resource=resource),
            quarantined=quarantined,
            assigned_at=assigned_at,
        )
        self._failures[key] = failure
        return failure

    def may_start(self, key: TaskKey, *, now: float, assigned_at: float | None) -> bool:
        """Whether the worker may start ``key`` now; a new assignment clears its failures."""
        failure = self._failures.get(key)
        if failure is None:
            return True
        if failure.assigned_at != assigned_at:
            self.clear(key)
            return True
        return now >= failure.retry_at

    def started(self, key: TaskKey, *, now: float) -> None:
        """``key`` started at ``now`` (its failures stay counted until it proves healthy)."""
        self._running_since[key] = now

    def recovered(self, key: TaskKey, *, now: float) -> bool:
        """Whether running ``key`` has just become healthy: its failures are then forgotten.

        True once, when a task with failures has run ``healthy_after_s``; the caller then
        records the recovery.
        """
        since = self._running_since.get(key)
        if since is None or key not in self._failures or now - since < self.policy.healthy_after_s:
            return False
        self.clear(key)
        return True

    def clear(self, key: TaskKey) -> None:
        """Forget ``key``'s failures (operator cleared it, or it was reassigned)."""
        self._failures.pop(key, None)

    def retain(self, keys: Collection[TaskKey]) -> None:
        """Forget every task not in ``keys`` (no longer assigned here)."""
        for key in [k for k in self._failures if k not in keys]:
            del self._failures[key]
        for key in [k for k in self._running_since if k not in keys]:
            del self._running_since[key]

    def quarantined(self) -> list[TaskKey]:
        """Tasks the worker stopped trying, sorted."""
        return sorted(k for k, f in self._failures.items() if f.quarantined)


def describe_error(error: BaseException) -> str:
    """One line naming an error's type and message, bounded (for logs and ``/errors``).

    Example:
        >>> import sqlite3
        >>> describe_error(sqlite3.OperationalError("unable to open database file"))
        'OperationalError: unable to open database file'
    """
    text = " ".join(str(error).split()) or "(no message)"
    return f"{type(error).__name__}: {text}"[:MAX_REASON_CHARS]


# --- /errors/{id}/{task} ----------------------------------------------------------------------


def record_task_failure(
    store: ZkStore,
    key: TaskKey,
    failure: TaskFailure,
    *,
    worker_id: str,
    policy: FailurePolicy,
    wait_s: float,
    clock: Callable[[], float] = time.time,
) -> ErrorRecord | None:
    """Append ``failure`` to ``/errors/{id}/{task}`` (compare-and-set); None if the topology is gone.

    Args:
        store: Connected store.
        key: The task.
        failure: Its state after this failure (:meth:`FailureTracker.failed`).
        worker_id: The worker it failed on.
        policy: For the number of errors kept.
        wait_s: Seconds until the next try (for ``retry_at``; ignored when quarantined).
        clock: Wall clock of the error times.

    Raises:
        CoordinationError: ZooKeeper refused or failed the write.
    """
    topology_id, task_id = key
    if not store.exists(ZkPaths.storm(topology_id)):
        return None  # killed meanwhile: do not recreate its /errors subtree
    path = ZkPaths.task_errors(topology_id, task_id)
    now = clock()
    entry = TaskError(time=now, worker_id=worker_id, reason=failure.reason, attempt=failure.failures)

    def append(value: Any) -> dict[str, Any]:
        record = parse_error_record(path, value)
        return ErrorRecord(
            errors=[*record.errors, entry][-policy.kept_errors :],
            consecutive_failures=failure.failures,
            quarantined=failure.quarantined,
            worker_id=worker_id,
            retry_at=None if failure.quarantined else now + wait_s,
        ).to_json_obj()

    return ErrorRecord.model_validate(store.update_json(path, append, default=None))


def mark_task_recovered(store: ZkStore, key: TaskKey) -> None:
    """Reset the failure count in ``/errors/{id}/{task}`` (history kept); nothing if it is gone."""
    path = ZkPaths.task_errors(*key)

    def reset(value: Any) -> dict[str, Any]:
        return (
            parse_error_record(path, value)
            .model_copy(update={"consecutive_failures": 0, "quarantined": False, "retry_at": None})
            .to_json_obj()
        )

    if store.exists(path):
        store.update_json(path, reset)


def read_task_error(store: ZkStore, key: TaskKey) -> ErrorRecord | None:
    """The error record of one task, or None if it has none."""
    path = ZkPaths.task_errors(*key)
    found = store.get_json(path)
    return None if found is None else parse_error_record(path, found[0])


def read_task_errors(store: ZkStore, topology_id: str) -> dict[int, ErrorRecord]:
    """Task id -> error record, for every task of ``topology_id`` that has one."""
    records: dict[int, ErrorRecord] = {}
    for name in store.children(ZkPaths.errors(topology_id)):
        if name.isdigit():
            record = read_task_error(store, (topology_id, int(name)))
            if record is not None:
                records[int(name)] = record
    return records


def quarantine_cleared(store: ZkStore, key: TaskKey) -> bool:
    """Whether an operator lifted ``key``'s quarantine: its record deleted or marked not quarantined."""
    record = read_task_error(store, key)
    return record is None or not record.quarantined


def clear_task_errors(store: ZkStore, key: TaskKey) -> bool:
    """Delete ``/errors/{id}/{task}`` (the operator's way to lift a quarantine); False if none existed.

    Example:
        >>> clear_task_errors(store, ("wordcount-db-3-1700000000", 4))  # doctest: +SKIP
        True
    """
    path = ZkPaths.task_errors(*key)
    if not store.exists(path):
        return False
    store.delete_recursive(path)
    return True
