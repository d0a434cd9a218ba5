"""A stateful task's state when the task starts: its state topic (files or Kafka, as the
topology's conf says) and its local store, kept, caught up or rebuilt
(:func:`~stream_ops.runtime.task_state.open_task_state`) to the committed (txid, epoch); and
the automatic snapshots of its state-topic queue."""

from __future__ import annotations

import logging
import time

from stream_ops.coordination.cluster_state import read_storm
from stream_ops.coordination.records import TransactionalRecord
from stream_ops.coordination.store import ZkStore
from stream_ops.nimbus.compaction import compact_queue_locked
from stream_ops.runtime.task_state import TaskState, open_task_state
from stream_ops.state.auto_snapshot import AutoSnapshot, SnapshotPolicy
from stream_ops.state.state_log import open_state_log
from stream_ops.topology.layout import TopologyLayout
from stream_ops.topology.plan import Plan, StageSpec, TaskSpec

logger = logging.getLogger(__name__)


def open_stage_state(
    zk: ZkStore,
    layout: TopologyLayout,
    stage: StageSpec,
    task: TaskSpec,
    worker_id: str,
    committed: TransactionalRecord,
) -> TaskState:
    """The state of ``task`` (of a stage that keeps state) on this worker, at ``committed``."""
    started = time.monotonic()
    log = open_state_log(
        read_storm(zk, layout.topology_id).conf,
        file_topic=layout.state_topic(stage),
        queue=task.queue,
        topology_id=layout.topology_id,
        stage_index=stage.index,
        stage_name=stage.name,
    )
    state = open_task_state(
        store_dir=layout.local_store_dir(worker_id, task.task_id),
        log=log,
        kind=stage.state.kind if stage.state is not None else None,
        committed_txid=committed.committed_txid,
        committed_epoch=committed.committed_epoch,
        snapshot_dir=layout.snapshot_dir(stage, task.queue),
    )
    if state.rebuilt:
        logger.info(
            "task %s/%d: state rebuilt from the state topic, %d keys in %.3f s",
            layout.topology_id,
            task.task_id,
            state.restored_keys,
            time.monotonic() - started,
        )
    else:
        logger.info(
            "task %s/%d: kept the local state store (no rebuild), applied the state-topic tail only: %d changed keys in %.3f s",
            layout.topology_id,
            task.task_id,
            state.tail_keys or 0,
            time.monotonic() - started,
        )
    return state


def auto_snapshot(
    zk: ZkStore, layout: TopologyLayout, plan: Plan, stage: StageSpec, task: TaskSpec, policy: SnapshotPolicy
) -> AutoSnapshot:
    """The task's automatic snapshot: compacts its state-topic queue at its committed txid
    when ``policy`` says so."""

    def snapshot_own_queue() -> None:
        compact_queue_locked(zk, layout, plan, stage, task.queue, lock_timeout_s=1.0)

    return AutoSnapshot(policy, snapshot_own_queue, name=f"task {layout.topology_id}/{task.task_id}")
