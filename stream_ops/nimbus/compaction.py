"""Compact a topology's state topics into snapshots (the CLI and the Dagster job call this).

Each queue of a stateful stage is compacted up to its task's committed txid under a
ZooKeeper lock, so two compactions of one queue never overlap; the running task keeps
appending meanwhile (compaction only deletes files of txids the snapshot covers). A state topic
kept in Kafka (the topology's conf) is compacted the same way: snapshot, then the partition's
records below the snapshot's offset are deleted.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from stream_ops.config import ClusterConfig
from stream_ops.coordination.cluster_state import find_topology_id, read_storm
from stream_ops.coordination.lock import hold_lock
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import TransactionalRecord
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import CoordinationError, LockTimeoutError
from stream_ops.nimbus.dist_store import load_submission
from stream_ops.state.snapshot import CompactionResult
from stream_ops.state.state_log import open_state_log
from stream_ops.topology.layout import TopologyLayout
from stream_ops.topology.plan import Plan, StageSpec

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class QueueCompaction:
    """The outcome for one queue: compacted, or skipped and why."""

    stage: str
    queue: int
    task_id: int
    committed_txid: int
    result: CompactionResult | None
    skipped: str | None = None


@contextmanager
def compaction_lock(store: ZkStore, topology_id: str, task_id: int, *, timeout_s: float = 30.0) -> Iterator[None]:
    """Hold the lock of one task's state-topic queue: one snapshot writer at a time.

    Raises:
        CoordinationError: The lock was not acquired within ``timeout_s``.
    """
    with ExitStack() as stack:
        try:
            stack.enter_context(hold_lock(store, ZkPaths.compaction_lock(topology_id, task_id), timeout_s=timeout_s))
        except LockTimeoutError as e:
            raise CoordinationError(
                f"the state queue of task {topology_id}/{task_id} is being compacted by someone else; try again"
            ) from e
        yield


def compact_queue_locked(
    store: ZkStore,
    layout: TopologyLayout,
    plan: Plan,
    stage: StageSpec,
    queue: int,
    *,
    delete_covered: bool = True,
    lock_timeout_s: float = 30.0,
) -> QueueCompaction:
    """Snapshot one state-topic queue at its task's committed txid, under the queue's lock.

    With ``delete_covered=False`` only the snapshot is written (the Dagster state asset);
    otherwise the files it covers are deleted too (compaction).
    """
    task = plan.task_for(stage.index, queue)
    found = store.get_json(ZkPaths.transactional_task(layout.topology_id, task.task_id))
    record = TransactionalRecord.model_validate(found[0]) if found else TransactionalRecord()
    committed = record.committed_txid
    if committed < 0:
        return QueueCompaction(stage.name, queue, task.task_id, committed, None, "nothing committed yet")
    log = open_state_log(
        read_storm(store, layout.topology_id).conf,
        file_topic=layout.state_topic(stage),
        queue=queue,
        topology_id=layout.topology_id,
        stage_index=stage.index,
        stage_name=stage.name,
    )
    try:
        with compaction_lock(store, layout.topology_id, task.task_id, timeout_s=lock_timeout_s):
            result = log.compact(
                layout.snapshot_dir(stage, queue),
                committed,
                committed_epoch=record.committed_epoch,
                delete_covered=delete_covered,
            )
    finally:
        log.close()
    logger.info(
        "compacted %s stage %s queue %d at txid %d: %d keys, %d files deleted",
        layout.topology_id,
        stage.name,
        queue,
        committed,
        result.snapshot.keys,
        result.deleted_files,
    )
    return QueueCompaction(stage.name, queue, task.task_id, committed, result)


def compact_state(
    store: ZkStore,
    cluster: ClusterConfig,
    name_or_id: str,
    *,
    stages: Sequence[str] = (),
    queues: Sequence[int] = (),
    lock_timeout_s: float = 30.0,
) -> list[QueueCompaction]:
    """Snapshot every (selected) state-topic queue of a topology at its committed txid.

    Args:
        stages: names of stateful stages to compact (all when empty).
        queues: queue numbers to compact (all when empty).
    """
    topology_id = find_topology_id(store, name_or_id)
    assert topology_id is not None
    plan = load_submission(cluster.resolved_dist_dir(), read_storm(store, topology_id)).plan
    layout = TopologyLayout(cluster, topology_id)
    done: list[QueueCompaction] = []
    for stage in plan.stages:
        if not stage.keeps_state or (stages and stage.name not in stages):
            continue
        for queue in range(stage.queues):
            if not queues or queue in queues:
                done.append(compact_queue_locked(store, layout, plan, stage, queue, lock_timeout_s=lock_timeout_s))
    return done
