"""State snapshot assets (one per keyed stage, partitioned by queue) and the compaction op.

* :func:`state_assets` builds, for each stage of a topology that keeps state (keyed, join and
  process stages: RocksDB backed by a state topic), an asset
  ``stream_ops/<topology>/<stage>_state`` with one static partition per queue (``"0"``,
  ``"1"``, ...). Materializing partition ``q`` reads the committed txid of the stage's task on
  queue ``q`` from ZooKeeper and writes the queue's compacted snapshot at that txid: a Parquet
  table with the columns ``key`` and ``value`` (JSON text), readable by Spark
  (``spark.read.parquet``), DuckDB or pandas. A backfill over all partitions brings every
  snapshot to its queue's committed txid. The state topic itself is left whole.
* :func:`build_compact_op` builds the op of the ``stream_ops_compact_state`` job: for every
  queue of every keyed stage it snapshots the queue and drops what the snapshot covers, and
  records a materialization of the matching state asset partition, since it wrote a new
  snapshot.

Both go through :func:`stream_ops.nimbus.compaction.compact_queue_locked`, as ``stream-ops
compact`` does: the queue is opened where the submission's conf keeps its state topic
(:func:`stream_ops.state.state_log.open_state_log`): files (the dropped batch files are deleted)
or a Kafka partition (``state_topic="kafka"``: the records below the snapshot's offset are
deleted). The metadata's ``state_topic`` says which (``kafka:<topic>/<partition>`` or the queue's
directory).

Snapshots are built with pyarrow in the Dagster process; no SparkSession is started for them
(a cold session costs ~3.5 s and ~0.5 GB, the compaction itself reads only the new records).

Both run in the ``stream_ops_state`` pool: with a pool limit of 1 (``deployments/local``),
a backfill and a scheduled compaction never write the same snapshot directory at once.

Note: this module does not use ``from __future__ import annotations`` because Dagster reads
the resource and config parameters' annotations of the decorated functions at definition time.
"""

import itertools
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg

from stream_ops.config import ClusterConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import TransactionalRecord
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import ConfigError, StreamOpsError
from stream_ops.nimbus.compaction import compact_queue_locked
from stream_ops.nimbus.dist_store import load_submission
from stream_ops.nimbus.submission import find_topology_id, read_storm
from stream_ops.orchestration.markdown import table
from stream_ops.orchestration.resources import StreamClusterResource, ZooKeeperResource
from stream_ops.orchestration.run_config import ROLE_TAG, CompactStateConfig
from stream_ops.orchestration.translator import StreamOpsTranslator
from stream_ops.state.kafka_state_topic import TOPIC_PREFIX, KafkaStateTopic
from stream_ops.state.snapshot import CompactionResult, SnapshotInfo, read_snapshot
from stream_ops.state.state_log import open_state_log
from stream_ops.topology.layout import TopologyLayout
from stream_ops.topology.plan import Plan, StageSpec

__all__ = [
    "STATE_POOL",
    "StateQueue",
    "build_compact_op",
    "resolve_state_queue",
    "snapshot_metadata",
    "state_assets",
    "state_topic_description",
]

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
    """One queue of a keyed stage of a live submission, and where its state topic and snapshots are.

    Attributes:
        topology_id: The live submission.
        stage: The keyed stage, from the submission's own plan.
        queue_number: The queue.
        task_id: The stage's task on that queue.
        committed_txid: The task's committed txid in ZooKeeper (-1 before its first batch).
        committed_epoch: The owner epoch that committed it (the state topic must hold its batch).
        state_topic: Where the queue's state topic is: its directory, or ``kafka:<topic>/<partition>``.
        state_topic_bootstrap: The Kafka brokers holding it (None: files).
        snapshot_dir: Its snapshot directory.
    """

    topology_id: str
    stage: StageSpec
    queue_number: int
    task_id: int
    committed_txid: int
    committed_epoch: int
    state_topic: str
    state_topic_bootstrap: str | None
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
    """Find queue ``queue_number`` of keyed stage ``stage_name``: its committed txid and where its
    state topic is (the submission's conf: files, or a Kafka partition).

    Raises:
        StreamOpsError: The stage is not a keyed stage of the running plan, or has no such queue.
        ConfigError: The submission's conf has malformed state-topic settings.
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
    conf = read_storm(store, topology_id).conf
    log = open_state_log(
        conf,
        file_topic=layout.state_topic(stage),
        queue=queue_number,
        topology_id=topology_id,
        stage_index=stage.index,
        stage_name=stage.name,
    )
    try:
        where = log.where
    finally:
        log.close()
    kafka = KafkaStateTopic.from_conf(conf)
    return StateQueue(
        topology_id=topology_id,
        stage=stage,
        queue_number=queue_number,
        task_id=task_id,
        committed_txid=record.committed_txid,
        committed_epoch=record.committed_epoch,
        state_topic=where,
        state_topic_bootstrap=kafka.bootstrap if kafka is not None else None,
        snapshot_dir=layout.snapshot_dir(stage, queue_number),
    )


def state_topic_description(conf: Mapping[str, Any], stage: StageSpec) -> str:
    """Where a stage's state topic lives under ``conf`` (the topology's conf), for the asset's metadata.

    Example:
        >>> state_topic_description({}, stage)  # doctest: +SKIP
        'files: <topics root>/<topology id>/state-001-count, one queue per queue of the stage'
    """
    try:
        kafka = KafkaStateTopic.from_conf(conf)
    except ConfigError as e:
        return f"unknown: {e}"
    if kafka is None:
        return f"files: <topics root>/<topology id>/state-{stage.index:03d}-{stage.name}, one queue per queue of the stage"
    return (
        f"kafka at {kafka.bootstrap}: topic {TOPIC_PREFIX}.<topology id>.{stage.index:03d}-{stage.name}, "
        "one partition per queue of the stage"
    )


def _preview(info: SnapshotInfo) -> str:
    rows: list[tuple[object, object]] = [
        (", ".join(str(k) for k in key), repr(value)) for key, value in itertools.islice(read_snapshot(info.path), _PREVIEW_ROWS)
    ]
    if info.keys > _PREVIEW_ROWS:
        rows.append((f"... {info.keys - _PREVIEW_ROWS} more", ""))
    return table(["key", "value"], rows)


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
        "state_topic": dg.MetadataValue.text(target.state_topic),
        "state_topic_kind": dg.MetadataValue.text("kafka" if target.state_topic_bootstrap else "files"),
    }
    if target.state_topic_bootstrap:
        metadata["state_topic_bootstrap"] = dg.MetadataValue.text(target.state_topic_bootstrap)
    if info is not None:
        metadata["snapshot"] = dg.MetadataValue.path(str(info.path))
        metadata["snapshot_txid"] = dg.MetadataValue.int(info.txid)
        if info.epoch is not None:
            metadata["epoch"] = dg.MetadataValue.int(info.epoch)
        if info.offset is not None:
            metadata["state_topic_offset"] = dg.MetadataValue.int(info.offset)
        # A code block ends at a line of backticks only; the path is one repr'd line.
        metadata["read_with"] = dg.MetadataValue.md(
            f'```python\nspark.read.parquet({str(info.path)!r})\nduckdb.sql("select * from read_parquet({str(info.path)!r})")\n```'
        )
        metadata["preview"] = dg.MetadataValue.md(_preview(info))
    return metadata


def _compact(
    store: ZkStore, cluster: ClusterConfig, target: StateQueue, plan: Plan, *, delete_covered: bool
) -> CompactionResult | None:
    """Snapshot ``target``'s queue at its committed txid wherever its state topic is (dropping what
    the snapshot covers with ``delete_covered``), under its compaction lock; None: nothing committed."""
    done = compact_queue_locked(
        store, TopologyLayout(cluster, target.topology_id), plan, target.stage, target.queue_number, delete_covered=delete_covered
    )
    return done.result


def state_assets(
    *,
    plan: Plan,
    translator: StreamOpsTranslator | None = None,
    conf: Mapping[str, Any] | None = None,
) -> list[dg.AssetsDefinition]:
    """One queue-partitioned state snapshot asset per stage of ``plan`` that keeps state.

    Args:
        plan: The topology's plan, as the code location defines it.
        translator: Naming of keys and groups; default :class:`StreamOpsTranslator`.
        conf: The topology's conf as submitted from this code location (its state-topic
            settings are shown in the asset's definition metadata; materializing reads the live
            submission's own conf).

    Returns:
        The assets, in stage order (none for a topology without keyed stages). Each needs the
        ``zookeeper`` and ``stream_cluster`` resources.

    Example:
        >>> [a.key.to_user_string() for a in state_assets(plan=plan)]  # doctest: +SKIP
        ['stream_ops/wordcount/count_state']
    """
    translator = translator or StreamOpsTranslator()
    return [_state_asset(plan, stage, translator, dict(conf or {})) for stage in plan.stages if stage.keeps_state]


def _state_asset(plan: Plan, stage: StageSpec, translator: StreamOpsTranslator, conf: Mapping[str, Any]) -> dg.AssetsDefinition:
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
            "stream_ops/state_topic": dg.MetadataValue.text(state_topic_description(conf, stage)),
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
            result = _compact(store, cluster, target, running, delete_covered=False)
        if result is None:  # the record went back meanwhile (a resubmission): nothing to snapshot
            return dg.MaterializeResult(metadata=snapshot_metadata(target, None))
        info = result.snapshot
        context.log.info(
            f"{topology_id} {stage_name!r} queue {queue_number}: snapshot at txid {info.txid}, {info.keys} keys, "
            f"{info.bytes} bytes in {info.seconds:.3f}s ({info.path}; state topic {target.state_topic})"
        )
        return dg.MaterializeResult(metadata=snapshot_metadata(target, info))

    return _state


def build_compact_op(
    *,
    name: str,
    translator: StreamOpsTranslator,
    topology_names: Sequence[str] = (),
) -> dg.OpDefinition:
    """The op that compacts every state queue of one topology (see :class:`CompactStateConfig`),
    wherever its conf keeps the state topic (files or Kafka).

    Args:
        name: The op's name.
        translator: Maps (topology, stage) to the state asset keys it records materializations of.
        topology_names: Topologies whose state assets are defined in this code location; others
            are compacted too but record no materialization.
    """
    defined = set(topology_names)

    @dg.op(name=name, tags={ROLE_TAG: "compact_state"}, pool=STATE_POOL)
    def _compact_op(
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
            rows: list[tuple[object, ...]] = []
            for target in targets:
                result = _compact(store, cluster, target, running, delete_covered=True) if target.committed_txid >= 0 else None
                if result is None:
                    context.log.info(f"{target.stage.name} queue {target.queue_number}: nothing committed yet; skipped")
                    continue
                info = result.snapshot
                summary["queues"] += 1
                summary["deleted_files"] += result.deleted_files
                summary["deleted_bytes"] += result.deleted_bytes
                rows.append(
                    (target.stage.name, target.queue_number, target.state_topic, info.txid, info.keys, info.bytes)
                    + (result.deleted_files, result.kept_files, f"{info.seconds:.3f}")
                )
                context.log.info(
                    f"{target.stage.name} queue {target.queue_number} ({target.state_topic}): snapshot at txid {info.txid} "
                    f"({info.keys} keys), deleted {result.deleted_files} covered files or records, kept {result.kept_files}"
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
                "queues": dg.MetadataValue.md(
                    table(
                        ["stage", "queue", "state topic", "txid", "keys", "bytes", "deleted", "kept", "seconds"],
                        rows,
                        ["---", "---:", "---", "---:", "---:", "---:", "---:", "---:", "---:"],
                    )
                ),
            },
        )

    return _compact_op
