"""State snapshot assets (one per keyed stage, partitioned by queue) and the compaction op.

* :func:`state_assets` builds, for each stage of a topology that keeps state (keyed, join and
  process stages: RocksDB backed by a state topic), an asset
  ``stream_ops/<topology>/<stage>_state`` with one static partition per queue (``"0"``,
  ``"1"``, ...). Materializing partition ``q`` reads the committed txid of the stage's task on
  queue ``q`` from ZooKeeper and writes the queue's compacted snapshot at that txid
  (:func:`stream_ops.state.snapshot.write_snapshot`): a Parquet table with the columns
  ``key`` and ``value`` (JSON text), readable by Spark (``spark.read.parquet``), DuckDB or
  pandas. A backfill over all partitions brings every snapshot to its queue's committed txid.
  The state topic itself is left whole.
* :func:`build_compact_op` builds the op of the ``stream_ops_compact_state`` job: for every
  queue of every keyed stage it calls :func:`stream_ops.state.snapshot.compact_queue`
  (snapshot, then delete the state-topic files the snapshot covers), and records a
  materialization of the matching state asset partition, since it wrote a new snapshot.

Snapshots are built with pyarrow in the Dagster process; no SparkSession is started for them
(a cold session costs ~3.5 s and ~0.5 GB, the compaction itself reads only the new files).

Both run in the ``stream_ops_state`` pool: with a pool limit of 1 (``deployments/local``),
a backfill and a scheduled compaction never write the same snapshot directory at once.

Note: this module does not use ``from __future__ import annotations`` because Dagster reads
the resource and config parameters' annotations of the decorated functions at definition time.
"""

import itertools
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg

from stream_ops.config import ClusterConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import TransactionalRecord
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import StreamOpsError
from stream_ops.layout import TopologyLayout
from stream_ops.nimbus.compaction import compaction_lock
from stream_ops.nimbus.dist_store import load_submission
from stream_ops.nimbus.submission import find_topology_id, read_storm
from stream_ops.orchestration.resources import StreamClusterResource, ZooKeeperResource
from stream_ops.orchestration.run_config import ROLE_TAG, CompactStateConfig
from stream_ops.orchestration.translator import StreamOpsTranslator
from stream_ops.state.snapshot import CompactionResult, SnapshotInfo, compact_queue, read_snapshot, write_snapshot
from stream_ops.state.state_topic import StateTopicQueue
from stream_ops.topology.plan import Plan, StageSpec

__all__ = ["STATE_POOL", "StateQueue", "build_compact_op", "resolve_state_queue", "snapshot_metadata", "state_assets"]

logger = logging.getLogger(__name__)

#: Concurrency pool of everything that writes state snapshots.
STATE_POOL = "stream_ops_state"

_PREVIEW_ROWS = 10
_SNAPSHOT_SCHEMA = dg.TableSchema(
    columns=[
        dg.TableColumn(name="key", type="string", description="JSON list of the key fields (canonical encoding)."),
        dg.TableColumn(name="value", type="string", description="JSON of the stored value (transactional/opaque wrapper)."),
    ]
)


@dataclass(frozen=True)
class StateQueue:
    """One queue of a keyed stage of a live submission, and where its snapshots go.

    Attributes:
        topology_id: The live submission.
        stage: The keyed stage, from the submission's own plan.
        queue_number: The queue.
        task_id: The stage's task on that queue.
        committed_txid: The task's committed txid in ZooKeeper (-1 before its first batch).
        committed_epoch: The owner epoch that committed it (the state topic must hold its file).
        queue: The state-topic queue.
        snapshot_dir: Its snapshot directory.
    """

    topology_id: str
    stage: StageSpec
    queue_number: int
    task_id: int
    committed_txid: int
    committed_epoch: int
    queue: StateTopicQueue
    snapshot_dir: Path


def _running_plan(store: ZkStore, cluster: ClusterConfig, topology_name: str) -> tuple[str, Plan]:
    topology_id = find_topology_id(store, topology_name)
    assert topology_id is not None
    storm = read_storm(store, topology_id)
    return topology_id, load_submission(cluster.resolved_dist_dir(), storm).plan


def _keyed_stage(plan: Plan, topology_id: str, stage_name: str) -> StageSpec:
    for stage in plan.stages:
        if stage.name == stage_name:
            if not stage.keeps_state:
                raise StreamOpsError(f"stage {stage_name!r} of {topology_id} is a {stage.kind} stage; it keeps no state")
            return stage
    raise StreamOpsError(
        f"{topology_id} has no stage {stage_name!r} (its stages: {[s.name for s in plan.stages]}); the running "
        "submission differs from this code location: kill and resubmit it, or reload the code location"
    )


def resolve_state_queue(
    store: ZkStore, cluster: ClusterConfig, topology_id: str, plan: Plan, stage_name: str, queue_number: int
) -> StateQueue:
    """Find the state-topic queue ``queue_number`` of keyed stage ``stage_name`` and its committed txid.

    Raises:
        StreamOpsError: The stage is not a keyed stage of the running plan, or has no such queue.
    """
    stage = _keyed_stage(plan, topology_id, stage_name)
    tasks = [t for t in plan.tasks if t.stage == stage.index and t.queue == queue_number]
    if not tasks:
        raise StreamOpsError(
            f"stage {stage_name!r} of {topology_id} has {stage.queues} queues, not queue {queue_number}; the running "
            "submission differs from this code location: kill and resubmit it, or reload the code location"
        )
    task_id = tasks[0].task_id
    found = store.get_json(ZkPaths.transactional_task(topology_id, task_id))
    record = TransactionalRecord.model_validate(found[0]) if found else TransactionalRecord()
    layout = TopologyLayout(cluster, topology_id)
    return StateQueue(
        topology_id=topology_id,
        stage=stage,
        queue_number=queue_number,
        task_id=task_id,
        committed_txid=record.committed_txid,
        committed_epoch=record.committed_epoch,
        queue=StateTopicQueue(layout.state_topic(stage), queue_number),
        snapshot_dir=layout.snapshot_dir(stage, queue_number),
    )


def _preview(info: SnapshotInfo) -> str:
    lines = ["| key | value |", "|---|---|"]
    for key, value in itertools.islice(read_snapshot(info.path), _PREVIEW_ROWS):
        lines.append(f"| {', '.join(str(k) for k in key)} | {value!r} |")
    if info.keys > _PREVIEW_ROWS:
        lines.append(f"| ... {info.keys - _PREVIEW_ROWS} more | |")
    return "\n".join(lines)


def snapshot_metadata(target: StateQueue, info: SnapshotInfo | None) -> dict[str, Any]:
    """Materialization metadata of one state partition (``info`` None: nothing committed yet)."""
    metadata: dict[str, Any] = {
        "topology_id": dg.MetadataValue.text(target.topology_id),
        "task_id": dg.MetadataValue.int(target.task_id),
        "committed_txid": dg.MetadataValue.int(target.committed_txid),
        "keys": dg.MetadataValue.int(info.keys if info else 0),
        "bytes": dg.MetadataValue.int(info.bytes if info else 0),
        "replay_seconds": dg.MetadataValue.float(round(info.seconds, 4) if info else 0.0),
        "dagster/row_count": dg.MetadataValue.int(info.keys if info else 0),
        "dagster/column_schema": dg.MetadataValue.table_schema(_SNAPSHOT_SCHEMA),
        "snapshot_dir": dg.MetadataValue.path(str(target.snapshot_dir)),
    }
    if info is not None:
        metadata["snapshot"] = dg.MetadataValue.path(str(info.path))
        metadata["snapshot_txid"] = dg.MetadataValue.int(info.txid)
        if info.epoch is not None:
            metadata["epoch"] = dg.MetadataValue.int(info.epoch)
        metadata["read_with"] = dg.MetadataValue.md(
            f"```python\nspark.read.parquet({str(info.path)!r})\nduckdb.sql(\"select * from read_parquet('{info.path}')\")\n```"
        )
        metadata["preview"] = dg.MetadataValue.md(_preview(info))
    return metadata


def state_assets(
    *,
    plan: Plan,
    translator: StreamOpsTranslator | None = None,
) -> list[dg.AssetsDefinition]:
    """One queue-partitioned state snapshot asset per stage of ``plan`` that keeps state.

    Args:
        plan: The topology's plan, as the code location defines it.
        translator: Naming of keys and groups; default :class:`StreamOpsTranslator`.

    Returns:
        The assets, in stage order (none for a topology without keyed stages). Each needs the
        ``zookeeper`` and ``stream_cluster`` resources.

    Example:
        >>> [a.key.to_user_string() for a in state_assets(plan=plan)]  # doctest: +SKIP
        ['stream_ops/wordcount/count_state']
    """
    translator = translator or StreamOpsTranslator()
    return [_state_asset(plan, stage, translator) for stage in plan.stages if stage.keeps_state]


def _state_asset(plan: Plan, stage: StageSpec, translator: StreamOpsTranslator) -> dg.AssetsDefinition:
    topology_name = plan.topology
    stage_name = stage.name
    partitions = dg.StaticPartitionsDefinition([str(q) for q in range(stage.queues)])

    @dg.asset(
        key=translator.state_asset_key(topology_name, stage_name),
        deps=[translator.stream_asset_key(topology_name, stage_name)],
        partitions_def=partitions,
        description=translator.state_description(plan, stage),
        group_name=translator.group_name(topology_name),
        kinds={"parquet"},
        pool=STATE_POOL,
        metadata={
            "stream_ops/topology": dg.MetadataValue.text(topology_name),
            "stream_ops/stage": dg.MetadataValue.text(stage_name),
            "stream_ops/queues": dg.MetadataValue.int(stage.queues),
            "dagster/column_schema": dg.MetadataValue.table_schema(_SNAPSHOT_SCHEMA),
        },
        op_tags={"stream_ops/topology": topology_name},
    )
    def _state(
        context: dg.AssetExecutionContext, zookeeper: ZooKeeperResource, stream_cluster: StreamClusterResource
    ) -> dg.MaterializeResult:
        queue_number = int(context.partition_key)
        with zookeeper.store() as store:
            cluster = stream_cluster.config()
            topology_id, running = _running_plan(store, cluster, topology_name)
            target = resolve_state_queue(store, cluster, topology_id, running, stage_name, queue_number)
            if target.committed_txid < 0:
                context.log.info(f"{topology_id} queue {queue_number} of {stage_name!r} committed no batch yet; no snapshot")
                return dg.MaterializeResult(metadata=snapshot_metadata(target, None))
            with compaction_lock(store, topology_id, target.task_id):
                info = write_snapshot(
                    target.queue, target.snapshot_dir, target.committed_txid, committed_epoch=target.committed_epoch
                )
        context.log.info(
            f"{topology_id} {stage_name!r} queue {queue_number}: snapshot at txid {info.txid}, {info.keys} keys, "
            f"{info.bytes} bytes in {info.seconds:.3f}s ({info.path})"
        )
        return dg.MaterializeResult(metadata=snapshot_metadata(target, info))

    return _state


def build_compact_op(
    *,
    name: str,
    translator: StreamOpsTranslator,
    topology_names: Sequence[str] = (),
) -> dg.OpDefinition:
    """The op that compacts every state queue of one topology (see :class:`CompactStateConfig`).

    Args:
        name: The op's name.
        translator: Maps (topology, stage) to the state asset keys it records materializations of.
        topology_names: Topologies whose state assets are defined in this code location; others
            are compacted too but record no materialization.
    """
    defined = set(topology_names)

    @dg.op(name=name, tags={ROLE_TAG: "compact_state"}, pool=STATE_POOL)
    def _compact(
        context: dg.OpExecutionContext,
        config: CompactStateConfig,
        zookeeper: ZooKeeperResource,
        stream_cluster: StreamClusterResource,
    ) -> Iterator[dg.AssetMaterialization | dg.Output[dict[str, Any]]]:
        cluster = stream_cluster.config()
        targets: list[StateQueue] = []
        with zookeeper.store() as store:
            topology_id, running = _running_plan(store, cluster, config.topology)
            storm = read_storm(store, topology_id)
            stateful = [s for s in running.stages if s.keeps_state]
            stages = [s for s in stateful if not config.stages or s.name in config.stages]
            unknown = sorted(set(config.stages) - {s.name for s in stateful})
            if unknown:
                raise dg.Failure(
                    description=f"{topology_id} has no stages {unknown} that keep state; those that do are "
                    f"{[s.name for s in stateful]}"
                )
            for stage in stages:
                for queue_number in range(stage.queues):
                    if config.queues and queue_number not in config.queues:
                        continue
                    targets.append(resolve_state_queue(store, cluster, topology_id, running, stage.name, queue_number))
        summary: dict[str, Any] = {"topology_id": topology_id, "queues": 0, "deleted_files": 0, "deleted_bytes": 0}
        rows = [
            "| stage | queue | txid | keys | bytes | deleted files | kept files | seconds |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for target in targets:
            if target.committed_txid < 0:
                context.log.info(f"{target.stage.name} queue {target.queue_number}: nothing committed yet; skipped")
                continue
            with zookeeper.store() as lock_store, compaction_lock(lock_store, topology_id, target.task_id):
                result: CompactionResult = compact_queue(
                    target.queue, target.snapshot_dir, target.committed_txid, committed_epoch=target.committed_epoch
                )
            info = result.snapshot
            summary["queues"] += 1
            summary["deleted_files"] += result.deleted_files
            summary["deleted_bytes"] += result.deleted_bytes
            rows.append(
                f"| {target.stage.name} | {target.queue_number} | {info.txid} | {info.keys} | {info.bytes} "
                f"| {result.deleted_files} | {result.kept_files} | {info.seconds:.3f} |"
            )
            context.log.info(
                f"{target.stage.name} queue {target.queue_number}: snapshot at txid {info.txid} ({info.keys} keys), "
                f"deleted {result.deleted_files} covered files, kept {result.kept_files}"
            )
            if storm.name in defined:
                metadata = snapshot_metadata(target, info)
                metadata["deleted_files"] = dg.MetadataValue.int(result.deleted_files)
                metadata["deleted_bytes"] = dg.MetadataValue.int(result.deleted_bytes)
                metadata["kept_files"] = dg.MetadataValue.int(result.kept_files)
                yield dg.AssetMaterialization(
                    asset_key=translator.state_asset_key(storm.name, target.stage.name),
                    partition=str(target.queue_number),
                    metadata=metadata,
                    description=f"compacted by run {context.run_id}",
                )
        yield dg.Output(
            summary,
            metadata={
                "topology_id": topology_id,
                "queues_compacted": summary["queues"],
                "deleted_files": summary["deleted_files"],
                "deleted_bytes": summary["deleted_bytes"],
                "queues": dg.MetadataValue.md("\n".join(rows)),
            },
        )

    return _compact
