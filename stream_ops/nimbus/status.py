"""What a topology is doing right now: tasks, owners, heartbeat ages, committed txids.

Used by ``stream-ops status`` and by the Dagster heartbeat sensor, so both report the same.
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
                state_keys=hb.state_keys if hb else 0,
                dead_letters=hb.dead_letters if hb else 0,
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
