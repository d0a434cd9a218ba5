"""Submit, find, activate, deactivate and kill topologies (Storm's Nimbus verbs).

The readers :func:`list_topologies`, :func:`find_topology_id` and :func:`read_storm` live in
:mod:`stream_ops.coordination.cluster_state` (workers and query clients read them too) and are
re-exported here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from stream_ops.config import ClusterConfig
from stream_ops.coordination.cluster_state import find_topology_id, list_topologies, read_storm
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import StormRecord, TaskRecord, TopologyStatusName, TransactionalRecord
from stream_ops.coordination.store import ZkStore, encode_json
from stream_ops.dsl.build_plan import build_plan
from stream_ops.dsl.streams import Topology
from stream_ops.errors import StreamOpsError, SubmissionError
from stream_ops.nimbus.assignment import reassign
from stream_ops.nimbus.code_archive import build_code_archive
from stream_ops.nimbus.dist_store import load_submission, write_submission
from stream_ops.topology.layout import TopologyLayout
from stream_ops.topology.plan import Plan
from stream_ops.topology.sink_paths import clashes, sink_directories

__all__ = [
    "activate",
    "deactivate",
    "find_topology_id",
    "kill",
    "list_topologies",
    "read_storm",
    "set_status",
    "submit",
]

logger = logging.getLogger(__name__)


def submit(
    store: ZkStore,
    cluster: ClusterConfig,
    topology: Topology,
    *,
    workers: int = 2,
    conf: Mapping[str, Any] | None = None,
    standby_replicas: int = 0,
    clock: Callable[[], float] = time.time,
) -> str:
    """Submit ``topology``: store plan/conf/code, create its znodes, assign its tasks.

    The stored conf is ``cluster.topology_defaults`` overridden by ``conf``.

    ``standby_replicas``: for each stateful task, this many other workers (on other hosts
    first) keep a warm copy of its store by tailing the state topic, and a failover prefers
    them, so the new owner replays only the tail (Kafka Streams' ``num.standby.replicas``).

    Returns the topology id ``name-<counter>-<unix ts>``.

    Example:
        >>> with ZkStore.connect(ZooKeeperConfig()) as store:
        ...     topology_id = submit(store, ClusterConfig(), build_wordcount("/data/in"), workers=2)
    """
    if workers < 1:
        raise SubmissionError(f"workers must be at least 1, got {workers}")
    if standby_replicas < 0:
        raise SubmissionError(f"standby_replicas must be 0 or more, got {standby_replicas}")
    if find_topology_id(store, topology.name, missing_ok=True) is not None:
        raise SubmissionError(f"a topology named {topology.name!r} is already running; kill it first")
    plan = build_plan(topology)
    _refuse_shared_sink_directories(store, cluster, plan)
    code = build_code_archive(plan)  # refused (symlink out of a package, ...) before anything is written
    counter = store.next_counter(ZkPaths.ID_COUNTER)
    topology_id = f"{topology.name}-{counter}-{int(clock())}"
    layout = TopologyLayout(cluster, topology_id)
    conf_dict = {**cluster.topology_defaults, **dict(conf or {})}
    written = write_submission(layout.dist_dir, plan, conf_dict, code, topology_id=topology_id)
    for stage in plan.stages:
        layout.create_inputs(stage)
        if stage.keeps_state:
            layout.state_topic(stage).create()
    layout.dead_letter_topic().create()

    storm = StormRecord(
        topology_id=topology_id,
        name=topology.name,
        status="ACTIVE",
        workers=workers,
        conf=conf_dict,
        dist_dir=str(layout.dist_dir.resolve()),
        submitted_at=clock(),
        num_tasks=len(plan.tasks),
        code_sha256=written.code_sha256,
        submission_sha256=written.submission_sha256,
        standby_replicas=standby_replicas,
        stateful_tasks=[t.task_id for t in plan.tasks if plan.stage(t.stage).keeps_state],
    )
    _create_nodes(store, plan, layout, storm)
    reassign(store, topology_id, clock=clock)
    logger.info("submitted %s: %d stages, %d tasks, %d workers wanted", topology_id, len(plan.stages), len(plan.tasks), workers)
    return topology_id


def _refuse_shared_sink_directories(store: ZkStore, cluster: ClusterConfig, plan: Plan) -> None:
    """Refuse ``plan`` if one of its file sinks would write where a running topology's sink writes.

    Raises:
        SubmissionError: Naming both topologies, both sinks and the directories.
    """
    ours = list(sink_directories(plan))
    if not ours:
        return
    for storm in list_topologies(store):
        if storm.status == "KILLED":
            continue
        try:
            theirs = list(sink_directories(load_submission(cluster.resolved_dist_dir(), storm).plan))
        except StreamOpsError as e:
            logger.warning("cannot read the sinks of %s to check them against %s's: %s", storm.topology_id, plan.topology, e)
            continue
        for name, directory in ours:
            for other, other_directory in theirs:
                if clashes(directory, other_directory):
                    raise SubmissionError(
                        f"topology {plan.topology!r}: sink {name!r} would write {directory}, where sink {other!r} of the "
                        f"running topology {storm.topology_id} writes ({other_directory}): two sinks on one directory "
                        "(or one inside the other) overwrite or read each other's files; give the sink another "
                        "directory, or kill the other topology first"
                    )


def _create_nodes(store: ZkStore, plan: Plan, layout: TopologyLayout, storm: StormRecord) -> None:
    topology_id = storm.topology_id
    per_topology = (
        ZkPaths.tasks(topology_id),
        ZkPaths.transactional(topology_id),
        ZkPaths.owners(topology_id),
        ZkPaths.heartbeats(topology_id),
        ZkPaths.errors(topology_id),
        ZkPaths.standbys(topology_id),
    )
    store.ensure_paths([p.rsplit("/", 1)[0] for p in per_topology] + [ZkPaths.STORMS, ZkPaths.ASSIGNMENTS, ZkPaths.WORKERS])
    # The topology's own parents are new (its id is unique): created with its nodes, all or none.
    tx = store.transaction()
    for parent in per_topology:
        tx.create(parent, b"")
    for task in plan.tasks:
        stage = plan.stage(task.stage)
        record = TaskRecord(
            task_id=task.task_id,
            stage=task.stage,
            stage_name=stage.name,
            queue=task.queue,
            input_path=str(layout.input_dir(stage, task.queue) or f"<{stage.source.kind if stage.source else stage.kind}>"),
        )
        tx.create(ZkPaths.task(topology_id, task.task_id), encode_json(record.to_json_obj()))
        tx.create(ZkPaths.transactional_task(topology_id, task.task_id), encode_json(TransactionalRecord().to_json_obj()))
    tx.create(ZkPaths.storm(topology_id), encode_json(storm.to_json_obj()))
    store.commit_transaction(tx)


def set_status(store: ZkStore, name_or_id: str, status: TopologyStatusName) -> str:
    """Set a topology's status (ACTIVE, INACTIVE, ...); workers react through their watches."""
    topology_id = find_topology_id(store, name_or_id)
    assert topology_id is not None

    def change(data: Any) -> Any:
        return {**data, "status": status}

    store.update_json(ZkPaths.storm(topology_id), change)
    logger.info("topology %s is now %s", topology_id, status)
    return topology_id


def activate(store: ZkStore, name_or_id: str) -> str:
    """Resume a deactivated topology: its workers start its tasks again."""
    return set_status(store, name_or_id, "ACTIVE")


def deactivate(store: ZkStore, name_or_id: str) -> str:
    """Pause a topology: its workers stop its queries (state and checkpoints are kept)."""
    return set_status(store, name_or_id, "INACTIVE")


def kill(store: ZkStore, name_or_id: str, *, wait_s: float = 0.0, sleep: Callable[[float], None] = time.sleep) -> str:
    """Kill a topology: status KILLED (workers stop its tasks), then remove its znodes.

    Like ``storm kill -w``, ``wait_s`` gives workers time to stop before the nodes go.
    Files (dist store, topics, checkpoints) are kept for inspection.
    """
    topology_id = set_status(store, name_or_id, "KILLED")
    if wait_s > 0:
        sleep(wait_s)
    for path in ZkPaths.topology_roots(topology_id):
        store.delete_recursive(path)
    logger.info("killed %s", topology_id)
    return topology_id
