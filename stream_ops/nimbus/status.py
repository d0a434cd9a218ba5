"""What a topology is doing right now: tasks, owners, heartbeat ages, committed txids, errors.

Used by ``stream-ops status`` and by the Dagster heartbeat sensor, so both report the same.
A task that failed to start or whose query failed carries its last error and whether its
worker quarantined it (from ``/errors/{id}/{task}``, see :mod:`stream_ops.runtime.task_failures`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
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
from stream_ops.nimbus.submission import read_storm
from stream_ops.runtime.task_failures import read_task_errors

Health = Literal["healthy", "degraded", "down", "inactive"]


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


def describe_topology(store: ZkStore, topology_id: str, *, clock: Callable[[], float] = time.time) -> TopologyStatus:
    """Read everything ZooKeeper knows about one topology."""
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
        hb_data = _get(store, ZkPaths.heartbeat(topology_id, task_id))
        hb = HeartbeatRecord.model_validate(hb_data) if hb_data else None
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
                heartbeat_age_s=round(max(0.0, now - hb.time), 3) if hb else None,
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
    )
