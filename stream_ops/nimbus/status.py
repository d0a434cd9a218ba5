"""What a topology is doing right now: tasks, owners, heartbeat ages, committed txids, errors.

Used by ``stream-ops status`` and by the Dagster heartbeat sensor, so both report the same.
A task that failed to start or whose query failed carries its last error and whether its
worker quarantined it (from ``/errors/{id}/{task}``, see :mod:`stream_ops.runtime.task_failures`).

Heartbeat ages (``TopologyStatus.heartbeat_age_basis`` says which one a status carries):

* ``observed`` (given a :class:`~stream_ops.nimbus.monitor.HeartbeatTracker`): seconds since
  the *observer* saw the heartbeat znode change, by the observer's own clock. The nimbus
  monitor's rule: clock skew between hosts does not matter. The Dagster heartbeat sensor keeps
  its tracker in its cursor; the on-demand checks rebuild one from the sensor's observations.
  A heartbeat seen for the first time is 0 s old (the observer knows nothing earlier).
* ``worker_clock`` (no tracker, e.g. a one-shot ``stream-ops status``): the reader's wall
  clock minus the ``time`` the worker wrote into the heartbeat. Right only while the two
  clocks agree.

Either way a heartbeat counts only if written by the task's owner (or, with no owner, its
assigned worker); another worker's leftover beat is no heartbeat.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import (
    HeartbeatRecord,
    OwnerRecord,
    StormRecord,
    TaskRecord,
    TransactionalRecord,
)
from stream_ops.coordination.store import ZkStore
from stream_ops.nimbus.assignment import live_workers, read_assignment
from stream_ops.nimbus.monitor import HeartbeatTracker, heartbeat_fingerprint
from stream_ops.nimbus.submission import read_storm
from stream_ops.runtime.task_failures import read_task_errors

Health = Literal["healthy", "degraded", "down", "inactive"]
HeartbeatAgeBasis = Literal["observed", "worker_clock"]

#: Heartbeat ages are seconds since the observer saw the heartbeat change (its own clock).
AGE_OBSERVED: HeartbeatAgeBasis = "observed"
#: Heartbeat ages are the reader's clock minus the time the worker wrote (clocks must agree).
AGE_WORKER_CLOCK: HeartbeatAgeBasis = "worker_clock"

#: One line per basis, for reports (observations, checks, the CLI).
AGE_BASIS_TEXT: Mapping[str, str] = {
    AGE_OBSERVED: "seconds since the observer saw the heartbeat change, by its own clock",
    AGE_WORKER_CLOCK: "reader's clock minus the time the worker wrote (assumes synchronised clocks)",
}


@dataclass(frozen=True)
class TaskStatus:
    """One task as seen in ZooKeeper."""

    task_id: int
    stage: int
    stage_name: str
    queue: int
    assigned_to: str | None
    owner: str | None
    owner_epoch: int | None
    heartbeat_age_s: float | None
    """Heartbeat age in seconds (see ``TopologyStatus.heartbeat_age_basis``); None: no heartbeat."""
    committed_txid: int
    txid_in_flight: int | None
    rows_per_s: float
    rows_out_per_s: float
    lag_files: int
    state_keys: int
    dead_letters: int
    lag_records: int | None = None
    """Input records not read yet (None where the source cannot count them)."""
    failures: int = 0
    """Consecutive failures of the task on its worker (0 once it ran long enough to be healthy)."""
    last_error: str | None = None
    """The most recent failure's reason (kept after a recovery, as history)."""
    last_error_at: float | None = None
    last_error_worker: str | None = None
    quarantined: bool = False
    """Its worker stopped trying it; delete ``/errors/{id}/{task}`` (or resubmit) to try again."""
    heartbeat_fingerprint: int | None = None
    """The heartbeat znode's mzxid (changes with every beat); None: no heartbeat that counts."""

    @property
    def has_lag(self) -> bool:
        """Whether the task has input it has not read (records or files)."""
        return (self.lag_records or 0) > 0 or self.lag_files > 0

    @property
    def failing(self) -> bool:
        """Whether the task's last tries failed (backing off or quarantined)."""
        return self.failures > 0 or self.quarantined

    def alive(self, timeout_s: float) -> bool:
        """Owned, and its heartbeat is younger than ``timeout_s``."""
        return self.owner is not None and self.heartbeat_age_s is not None and self.heartbeat_age_s <= timeout_s


@dataclass(frozen=True)
class TopologyStatus:
    """A topology and all its tasks."""

    topology_id: str
    name: str
    status: str
    workers_wanted: int
    workers_live: list[str]
    assignment_epoch: int | None
    tasks: list[TaskStatus] = field(default_factory=list)
    heartbeat_age_basis: HeartbeatAgeBasis = AGE_WORKER_CLOCK
    """How ``TaskStatus.heartbeat_age_s`` was measured (see the module docstring)."""

    def health(self, timeout_s: float = 10.0) -> Health:
        """healthy: every task alive; down: none alive; degraded: some."""
        if self.status != "ACTIVE":
            return "inactive"
        alive = sum(t.alive(timeout_s) for t in self.tasks)
        if self.tasks and alive == len(self.tasks):
            return "healthy"
        return "down" if alive == 0 else "degraded"

    def problems(self) -> list[str]:
        """One line per failing task, e.g. for ``stream-ops status`` (empty when none fails).

        Example:
            >>> status.problems()  # doctest: +SKIP
            ['task 4 (word_counts) quarantined after 5 failures on 127.0.0.1:6700: OperationalError: ...']
        """
        lines = []
        for t in self.tasks:
            if not t.failing:
                continue
            state = f"quarantined after {t.failures} failures" if t.quarantined else f"failing ({t.failures} in a row)"
            lines.append(f"task {t.task_id} ({t.stage_name}) {state} on {t.last_error_worker or '?'}: {t.last_error}")
        return lines

    def to_json_obj(self, timeout_s: float = 10.0) -> dict[str, Any]:
        data = asdict(self)
        data["health"] = self.health(timeout_s)
        return data


def _get(store: ZkStore, path: str) -> Any | None:
    found = store.get_json(path)
    return None if found is None else found[0]


def read_heartbeat(data: Any | None, mzxid: int, worker: str | None) -> tuple[HeartbeatRecord | None, int | None]:
    """A heartbeat znode's record and fingerprint, if it counts for ``worker`` (pure).

    Args:
        data: The znode's JSON value, None when there is no node.
        mzxid: The node's mzxid.
        worker: The task's owner (or assigned worker); None: any writer counts.

    Returns:
        ``(record, fingerprint)``, or ``(None, None)`` when there is no heartbeat that counts.

    Raises:
        pydantic.ValidationError: The node holds no heartbeat record.
    """
    if data is None:
        return None, None
    fingerprint = heartbeat_fingerprint(data, mzxid, worker)
    if fingerprint is None:
        return None, None
    return HeartbeatRecord.model_validate(data), fingerprint


def heartbeat_age(
    record: HeartbeatRecord | None,
    fingerprint: int | None,
    topology_id: str,
    task_id: int,
    now: float,
    tracker: HeartbeatTracker | None,
) -> float | None:
    """A heartbeat's age by the rule of the module docstring (pure; feeds ``tracker``).

    With a tracker: the heartbeat is observed at ``now`` and its age is the time since the
    tracker saw it change. Without: ``now`` minus the time the worker wrote.

    Example:
        >>> t = HeartbeatTracker()
        >>> beat = HeartbeatRecord(worker_id="h:1", time=5000.0, epoch=1)  # a clock far ahead
        >>> heartbeat_age(beat, 7, "t", 0, now=100.0, tracker=t), heartbeat_age(beat, 7, "t", 0, now=112.0, tracker=t)
        (0.0, 12.0)
    """
    if tracker is not None:
        tracker.observe(topology_id, task_id, fingerprint, now)
        age = tracker.heartbeat_age(topology_id, task_id, now) if fingerprint is not None else None
        return None if age is None else round(age, 3)
    return round(max(0.0, now - record.time), 3) if record is not None else None


def _heartbeat(store: ZkStore, topology_id: str, task_id: int, worker: str | None) -> tuple[HeartbeatRecord | None, int | None]:
    found = store.get_json(ZkPaths.heartbeat(topology_id, task_id))
    return (None, None) if found is None else read_heartbeat(found[0], found[1].mzxid, worker)


def describe_topology(
    store: ZkStore,
    topology_id: str,
    *,
    clock: Callable[[], float] = time.time,
    tracker: HeartbeatTracker | None = None,
) -> TopologyStatus:
    """Read everything ZooKeeper knows about one topology.

    Args:
        store: Connected store.
        topology_id: The topology.
        clock: The reader's clock. With ``tracker`` it is the tracker's clock (any time base,
            used consistently); without, unix time compared with the workers' timestamps.
        tracker: The observer's heartbeat tracker: every task's heartbeat is fed to it, and
            ages are "seconds since the observer saw it change" (``heartbeat_age_basis``
            ``observed``). Without one, ages are by the worker's clock (``worker_clock``).

    Raises:
        TopologyNotFoundError: The topology does not exist.
    """
    storm: StormRecord = read_storm(store, topology_id)
    assignment = read_assignment(store, topology_id)
    assigned = assignment[0].tasks if assignment else {}
    workers = live_workers(store)
    errors = read_task_errors(store, topology_id)
    now = clock()
    tasks: list[TaskStatus] = []
    for name in sorted(store.children(ZkPaths.tasks(topology_id)), key=int):
        task_id = int(name)
        task_data = _get(store, ZkPaths.task(topology_id, task_id))
        if task_data is None:
            continue
        task = TaskRecord.model_validate(task_data)
        owner_data = _get(store, ZkPaths.owner(topology_id, task_id))
        owner = OwnerRecord.model_validate(owner_data) if owner_data else None
        tx_data = _get(store, ZkPaths.transactional_task(topology_id, task_id))
        tx = TransactionalRecord.model_validate(tx_data) if tx_data else TransactionalRecord()
        hb, fingerprint = _heartbeat(store, topology_id, task_id, owner.worker_id if owner else assigned.get(task_id))
        error = errors.get(task_id)
        last = error.last if error else None
        tasks.append(
            TaskStatus(
                task_id=task_id,
                stage=task.stage,
                stage_name=task.stage_name,
                queue=task.queue,
                assigned_to=assigned.get(task_id),
                owner=owner.worker_id if owner else None,
                owner_epoch=owner.epoch if owner else None,
                heartbeat_age_s=heartbeat_age(hb, fingerprint, topology_id, task_id, now, tracker),
                committed_txid=tx.committed_txid,
                txid_in_flight=hb.txid_in_flight if hb else None,
                rows_per_s=hb.rows_per_s if hb else 0.0,
                rows_out_per_s=hb.rows_out_per_s if hb else 0.0,
                lag_files=hb.lag_files if hb else 0,
                lag_records=hb.lag_records if hb else None,
                state_keys=hb.state_keys if hb else 0,
                dead_letters=hb.dead_letters if hb else 0,
                failures=error.consecutive_failures if error else 0,
                last_error=last.reason if last else None,
                last_error_at=last.time if last else None,
                last_error_worker=last.worker_id if last else None,
                quarantined=error.quarantined if error else False,
                heartbeat_fingerprint=fingerprint,
            )
        )
    return TopologyStatus(
        topology_id=topology_id,
        name=storm.name,
        status=storm.status,
        workers_wanted=storm.workers,
        workers_live=sorted(workers),
        assignment_epoch=assignment[1] if assignment else None,
        tasks=tasks,
        heartbeat_age_basis=AGE_OBSERVED if tracker is not None else AGE_WORKER_CLOCK,
    )


def lost_tasks_now(
    store: ZkStore,
    topology_id: str,
    lost: Collection[int],
    *,
    seen: Mapping[int, int | None],
    timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    poll_s: float = 0.5,
) -> list[TaskStatus]:
    """Which of the tasks an observer reported lost are still lost, by the tracker's rule.

    No clock written by a worker is read. A task is alive again when it is owned and its
    heartbeat changed since the observer saw it (``seen``: task -> fingerprint the observer
    last saw, None for no heartbeat). For a task the observer gave no fingerprint for (a
    rebalance started by hand with ``lost_tasks`` only), this call watches the heartbeat itself
    for up to ``timeout_s`` by ``clock``: a task whose heartbeat changes meanwhile is alive.

    Args:
        store: Connected store.
        topology_id: The topology.
        lost: Task ids reported lost.
        seen: Task -> the heartbeat fingerprint the observer saw when it judged it lost.
        timeout_s: How long to watch tasks without a fingerprint in ``seen``.
        clock: Monotonic clock of the watch.
        sleep: Sleeper between polls.
        poll_s: Seconds between polls.

    Returns:
        The tasks of ``lost`` still lost, as read last.

    Example:
        >>> [t.task_id for t in lost_tasks_now(store, topology_id, [0, 3], seen={0: None, 3: 7711}, timeout_s=10)]  # doctest: +SKIP
        [3]
    """
    wanted = set(lost)
    unknown = wanted - set(seen)
    baseline: dict[int, int | None] = {t: seen[t] for t in wanted & set(seen)}
    deadline = clock() + timeout_s
    first = True
    while True:
        tasks = [t for t in describe_topology(store, topology_id).tasks if t.task_id in wanted]
        for t in tasks:
            if first and t.task_id in unknown:
                baseline[t.task_id] = t.heartbeat_fingerprint
        first = False
        still = [t for t in tasks if not _beat_since(t, baseline.get(t.task_id))]
        watching = [t for t in still if t.task_id in unknown]
        if not watching or clock() >= deadline:
            return still
        sleep(min(poll_s, max(0.0, deadline - clock())))


def _beat_since(task: TaskStatus, fingerprint: int | None) -> bool:
    """Owned, with a heartbeat other than ``fingerprint`` (it beat since then)."""
    return task.owner is not None and task.heartbeat_fingerprint is not None and task.heartbeat_fingerprint != fingerprint
