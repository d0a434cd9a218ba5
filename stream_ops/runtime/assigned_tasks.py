"""What ZooKeeper assigns to one worker: the tasks it runs (in ACTIVE topologies) and the
tasks whose stores it keeps standby replicas of."""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from typing import NamedTuple

from pydantic import ValidationError

from stream_ops.config import ClusterConfig
from stream_ops.coordination.cluster_state import read_assignment
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import StormRecord
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import StreamOpsError
from stream_ops.runtime.standby import StandbyTarget
from stream_ops.state.state_topic import StateTopicQueue
from stream_ops.topology.layout import TopologyLayout
from stream_ops.topology.plan import Plan

logger = logging.getLogger(__name__)


class AssignedTask(NamedTuple):
    """A task assigned to this worker in an ACTIVE topology."""

    storm: StormRecord
    assigned_at: float | None
    """The task's start time in the assignment: another value means it was assigned anew."""


class Assigned(NamedTuple):
    """Everything assigned to one worker."""

    tasks: dict[tuple[str, int], AssignedTask]
    standbys: dict[tuple[str, int], StandbyTarget]
    """The stores this worker keeps standby replicas of, by task."""


class AssignmentReader:
    """Reads what is assigned to one worker.

    Args:
        worker_id: the worker's ``host:port``.
        cluster: the cluster's paths.
        plan_of: the (verified, cached) plan of a topology.
        may_log: whether to log about a topic now (rate-limited by the worker).
    """

    def __init__(
        self,
        *,
        worker_id: str,
        cluster: ClusterConfig,
        plan_of: Callable[[StormRecord], Plan],
        may_log: Callable[[Hashable], bool],
    ) -> None:
        self.worker_id = worker_id
        self.cluster = cluster
        self._plan_of = plan_of
        self._may_log = may_log

    def read(self, store: ZkStore) -> Assigned:
        """Every task assigned to this worker in an ACTIVE topology, and its standbys."""
        assigned = Assigned({}, {})
        for topology_id in store.children(ZkPaths.ASSIGNMENTS):
            try:
                assigned.tasks.update(self._assigned_in(store, topology_id, assigned.standbys))
            except ValidationError as e:
                if self._may_log(("records", topology_id)):
                    logger.error(
                        "topology %s: its records in ZooKeeper do not validate, none of its tasks runs here: %s",
                        topology_id,
                        e.errors()[0]["msg"],
                    )
        return assigned

    def _assigned_in(
        self, store: ZkStore, topology_id: str, standbys: dict[tuple[str, int], StandbyTarget]
    ) -> dict[tuple[str, int], AssignedTask]:
        """The tasks of ``topology_id`` assigned to this worker, if it is ACTIVE; its standbys
        go into ``standbys``."""
        found = store.get_json(ZkPaths.storm(topology_id))
        if found is None:
            return {}
        storm = StormRecord.model_validate(found[0])
        if storm.status != "ACTIVE":
            return {}
        assignment = read_assignment(store, topology_id)
        if assignment is None:
            return {}
        record = assignment[0]
        for task_id, workers in record.standbys.items():
            if self.worker_id in workers and record.tasks.get(task_id) != self.worker_id:
                self._want_standby((topology_id, int(task_id)), storm, standbys)
        return {
            (topology_id, int(task_id)): AssignedTask(storm, record.start_times.get(int(task_id)))
            for task_id, worker_id in record.tasks.items()
            if worker_id == self.worker_id
        }

    def _want_standby(self, key: tuple[str, int], storm: StormRecord, standbys: dict[tuple[str, int], StandbyTarget]) -> None:
        """Note that this worker keeps a standby replica of ``key``'s store (see :mod:`.standby`)."""
        try:
            plan = self._plan_of(storm)
            task = plan.task(key[1])
            stage = plan.stage(task.stage)
            layout = TopologyLayout(self.cluster, key[0])
            standbys[key] = StandbyTarget(
                store_dir=layout.local_store_dir(self.worker_id, key[1]),
                queue=StateTopicQueue(layout.state_topic(stage), task.queue),
                snapshot_dir=layout.snapshot_dir(stage, task.queue),
            )
        except StreamOpsError as e:
            if self._may_log(("standby", key)):
                logger.warning("standby of task %s/%d not kept: %s", key[0], key[1], e)
