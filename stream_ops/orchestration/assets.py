"""Per-topology Dagster assets: submission, observed stream assets with checks, state snapshots.

* The **submission asset** (``stream_ops/<topology>/submission``) is materialized to submit the
  topology through :func:`stream_ops.nimbus.submission.submit`. If a live submission of that
  name exists already, nothing is submitted: the materialization reports the running one
  (and warns if it runs a different plan than the code location defines).
* The **source assets** (``stream_ops/kafka/<topic>``, ``stream_ops/topic/<parent>/<directory>``, ...)
  are external assets for what the source stages read (:mod:`stream_ops.orchestration.lineage`).
* The **stream assets** (``stream_ops/<topology>/<stage>``) are observable assets: the
  heartbeat sensor records observations on them (:mod:`stream_ops.orchestration.sensors`), and
  "Observe" does the same on demand (:mod:`stream_ops.orchestration.stream_observer`). A
  stage's asset depends on the source asset it reads or the stages whose shuffles it reads, so
  the asset graph is the topology's dataflow graph. Each has two asset checks,
  ``heartbeat_freshness`` and ``txid_progress`` (:mod:`stream_ops.orchestration.checks`),
  evaluated by the sensor on every tick and executable on demand.
* The **state assets** (``stream_ops/<topology>/<stage>_state``, one per keyed stage,
  partitioned by queue) hold compacted snapshots of the state topic
  (:mod:`stream_ops.orchestration.state`).
* The **sink assets** (``stream_ops/<topology>/sinks/<sink>``) are external assets downstream
  of the stages that write them; the heartbeat sensor materializes a Parquet sink whenever
  new files were committed (:mod:`stream_ops.orchestration.sinks`).
* The **health asset** (``stream_ops/<topology>/health``) sums the topology up: one-word
  health, a table of tasks, and the ``topology_health`` check
  (:mod:`stream_ops.orchestration.health`).

Resources required: ``zookeeper`` (:class:`ZooKeeperResource`) and ``stream_cluster``
(:class:`StreamClusterResource`).

Note: this module does not use ``from __future__ import annotations`` because Dagster reads
the resource parameters' annotations of the decorated function at definition time.
"""

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import dagster as dg

from stream_ops.config import ClusterConfig
from stream_ops.coordination.records import StormRecord
from stream_ops.coordination.store import ZkStore
from stream_ops.dsl.build_plan import build_plan
from stream_ops.dsl.streams import Topology
from stream_ops.errors import StreamOpsError, TopologyDefinitionError
from stream_ops.nimbus.dist_store import load_submission
from stream_ops.nimbus.status import TopologyStatus, describe_topology
from stream_ops.nimbus.submission import find_topology_id, read_storm, submit
from stream_ops.orchestration.checks import build_stream_checks
from stream_ops.orchestration.consumer_lag import DEFAULT_CONSUMER_LAG_THRESHOLD, KafkaSourceWatch, kafka_source_watches
from stream_ops.orchestration.health import build_health_asset
from stream_ops.orchestration.lineage import merge_source_specs, source_asset_specs
from stream_ops.orchestration.markdown import table
from stream_ops.orchestration.observations import observation_schema
from stream_ops.orchestration.resources import StreamClusterResource, ZooKeeperResource
from stream_ops.orchestration.sinks import ParquetSinkWatch, sink_asset_specs
from stream_ops.orchestration.state import state_assets
from stream_ops.orchestration.stream_observer import build_stream_observer
from stream_ops.orchestration.translator import StreamOpsTranslator, stage_summary
from stream_ops.topology.plan import Plan, StageSpec

__all__ = [
    "STREAM_CLUSTER_RESOURCE_KEY",
    "ZOOKEEPER_RESOURCE_KEY",
    "TopologyDefinitions",
    "topology_assets",
]

logger = logging.getLogger(__name__)

#: Resource key of the :class:`ZooKeeperResource` the assets and sensors use.
ZOOKEEPER_RESOURCE_KEY = "zookeeper"
#: Resource key of the :class:`StreamClusterResource` the submission assets use.
STREAM_CLUSTER_RESOURCE_KEY = "stream_cluster"


@dataclass(frozen=True)
class TopologyDefinitions:
    """The Dagster definitions of one topology, as built by :func:`topology_assets`.

    Attributes:
        topology_name: The topology's name.
        plan: Its plan (stages and tasks), built when the definitions were made.
        submission_asset: Materialize to submit the topology (or report the live submission).
        stream_specs: The spec of each stage's stream asset, observed by the heartbeat sensor,
            in stage order.
        stream_observer: The observable assets of ``stream_specs`` (what ``assets`` holds).
        stream_checks: The heartbeat-freshness and txid-progress checks of every stream asset.
        health_asset: The health overview asset with its ``topology_health`` check.
        source_specs: One external asset per input the source stages read (Kafka topics,
            FileTopics, directories), upstream of their stages.
        state_assets: One queue-partitioned state snapshot asset per keyed stage.
        sink_specs: One external asset per sink, downstream of the stages that write it.
        parquet_sinks: The Parquet sinks the heartbeat sensor materializes.
        kafka_sources: The Kafka topics the source stages read, whose consumer lag the
            heartbeat sensor observes and checks (the ``consumer_lag`` checks are declared
            once per code location, by
            :func:`~stream_ops.orchestration.definitions.build_cluster_definitions`).
    """

    topology_name: str
    plan: Plan
    submission_asset: dg.AssetsDefinition
    stream_specs: tuple[dg.AssetSpec, ...]
    stream_observer: dg.AssetsDefinition
    stream_checks: dg.AssetChecksDefinition
    health_asset: dg.AssetsDefinition
    source_specs: tuple[dg.AssetSpec, ...] = ()
    state_assets: tuple[dg.AssetsDefinition, ...] = ()
    sink_specs: tuple[dg.AssetSpec, ...] = ()
    parquet_sinks: tuple[ParquetSinkWatch, ...] = ()
    kafka_sources: tuple[KafkaSourceWatch, ...] = ()

    @property
    def assets(self) -> list[dg.AssetsDefinition | dg.AssetSpec]:
        """Everything to pass to :class:`dagster.Definitions` ``assets=``.

        Several topologies may hold the same source spec (they read the same input); Dagster
        accepts an identical spec twice.
        """
        return [
            self.submission_asset,
            *self.source_specs,
            self.stream_observer,
            self.health_asset,
            *self.state_assets,
            *self.sink_specs,
        ]

    @property
    def stream_keys(self) -> list[dg.AssetKey]:
        """The keys of the stream assets, in stage order."""
        return [spec.key for spec in self.stream_specs]

    @property
    def asset_checks(self) -> list[dg.AssetChecksDefinition]:
        """Everything to pass to :class:`dagster.Definitions` ``asset_checks=``."""
        return [self.stream_checks]


def _plan_markdown(plan: Plan) -> str:
    rows = [
        (
            stage.index,
            stage.name,
            stage.kind,
            stage.queues,
            ", ".join(str(t.task_id) for t in plan.tasks if t.stage == stage.index),
            stage_summary(stage),
        )
        for stage in plan.stages
    ]
    return table(["stage", "name", "kind", "queues", "tasks", "what it does"], rows, ["---:", "---", "---", "---:", "---", "---"])


def _assignment_markdown(status: TopologyStatus) -> str:
    rows = [(t.task_id, t.stage_name, t.queue, t.assigned_to or "(unassigned)") for t in status.tasks]
    return table(["task", "stage", "queue", "worker"], rows, ["---:", "---", "---:", "---"])


def _plan_code_version(plan: Plan) -> str:
    """Changes whenever the plan does, so Dagster flags a running submission as outdated."""
    return hashlib.sha256(plan.to_json().encode("utf-8")).hexdigest()[:16]


def _submitted_plan(storm: StormRecord, cluster: ClusterConfig) -> Plan | None:
    """The plan a live submission runs (verified), or None if its dist store entry is not readable here."""
    try:
        return load_submission(cluster.resolved_dist_dir(), storm).plan
    except (StreamOpsError, ValueError) as e:
        logger.warning("cannot read the plan of %s from %s: %s", storm.topology_id, storm.dist_dir, e)
        return None


def _submission_metadata(
    store: ZkStore, storm: StormRecord, plan: Plan, *, action: str, plan_matches: bool | None
) -> dict[str, Any]:
    status = describe_topology(store, storm.topology_id)
    metadata: dict[str, Any] = {
        "topology_id": dg.MetadataValue.text(storm.topology_id),
        "action": dg.MetadataValue.text(action),
        "status": dg.MetadataValue.text(storm.status),
        "tasks": dg.MetadataValue.int(storm.num_tasks),
        "workers": dg.MetadataValue.int(storm.workers),
        "workers_live": dg.MetadataValue.int(len(status.workers_live)),
        "assignment_epoch": dg.MetadataValue.int(status.assignment_epoch if status.assignment_epoch is not None else -1),
        "assignment": dg.MetadataValue.md(_assignment_markdown(status)),
        "submitted_at": dg.MetadataValue.timestamp(storm.submitted_at),
        "dist_dir": dg.MetadataValue.path(storm.dist_dir),
        "conf": dg.MetadataValue.json(dict(storm.conf)),
        "plan": dg.MetadataValue.md(_plan_markdown(plan)),
        "plan_json": dg.MetadataValue.json(plan.model_dump(mode="json")),
        "code_sha256": dg.MetadataValue.text(storm.code_sha256),
        "submission_sha256": dg.MetadataValue.text(storm.submission_sha256),
    }
    if plan_matches is not None:
        metadata["plan_matches_definition"] = dg.MetadataValue.bool(plan_matches)
    return metadata


def _stream_spec(
    plan: Plan,
    stage: StageSpec,
    *,
    submission_key: dg.AssetKey,
    source_key: dg.AssetKey | None,
    translator: StreamOpsTranslator,
) -> dg.AssetSpec:
    # Lineage: a stage depends on the input it reads, or on the stages whose shuffles it reads
    # (the topology's edges).
    upstream = [translator.stream_asset_key(plan.topology, plan.stage(i).name) for i in stage.from_stages]
    if source_key is not None:
        upstream.insert(0, source_key)
    return dg.AssetSpec(
        key=translator.stream_asset_key(plan.topology, stage.name),
        deps=[submission_key, *upstream],
        description=translator.description(plan, stage),
        group_name=translator.group_name(plan.topology),
        kinds={"spark"},
        metadata={
            "stream_ops/topology": dg.MetadataValue.text(plan.topology),
            "stream_ops/stage_index": dg.MetadataValue.int(stage.index),
            "stream_ops/stage_kind": dg.MetadataValue.text(stage.kind),
            "stream_ops/queues": dg.MetadataValue.int(stage.queues),
            "stream_ops/task_ids": dg.MetadataValue.json([t.task_id for t in plan.tasks if t.stage == stage.index]),
            # The records this stage reads, and what the heartbeat sensor observes on it.
            "stream_ops/input_schema": dg.MetadataValue.table_schema(
                dg.TableSchema(columns=[dg.TableColumn(name=f, type=t) for f, t in stage.input_fields.items()])
            ),
            "stream_ops/observation_schema": dg.MetadataValue.table_schema(observation_schema()),
        },
    )


def topology_assets(
    *,
    topology: Topology,
    workers: int = 2,
    standby_replicas: int = 0,
    conf: Mapping[str, Any] | None = None,
    translator: StreamOpsTranslator | None = None,
    heartbeat_timeout_s: float = 10.0,
    progress_timeout_s: float = 60.0,
    consumer_lag_threshold: int = DEFAULT_CONSUMER_LAG_THRESHOLD,
) -> TopologyDefinitions:
    """Build the submission asset, the stream assets with their checks and the state assets.

    The plan is built here, so an invalid topology fails when the code location loads.

    Args:
        topology: The topology to submit and observe.
        workers: Worker slots to ask for at submission.
        standby_replicas: Standby replicas of each stateful task (see :func:`~stream_ops.nimbus.submit`).
        conf: Topology configuration stored with the submission.
        translator: Naming of keys and groups; default :class:`StreamOpsTranslator`.
        heartbeat_timeout_s: The checks' heartbeat timeout when executed on demand (use the
            heartbeat sensor's).
        progress_timeout_s: The txid-progress check's stall limit when executed on demand.
        consumer_lag_threshold: The ``consumer_lag`` check of a Kafka topic this topology reads
            fails once it is this many records behind (over all partitions).

    Returns:
        The topology's definitions; pass ``.assets`` and ``.asset_checks`` to
        :class:`dagster.Definitions`.

    Raises:
        TopologyDefinitionError: The topology cannot be planned, two stages share a name,
            ``workers`` is below 1 or ``consumer_lag_threshold`` below 1.

    Example:
        >>> from stream_ops.examples.wordcount import build_wordcount
        >>> defs = topology_assets(topology=build_wordcount("/data/sentences"), workers=2)
        >>> defs.submission_asset.key.to_user_string()
        'stream_ops/wordcount/submission'
        >>> [spec.key.path[-1] for spec in defs.stream_specs]
        ['sentences', 'count']
        >>> [asset.key.path[-1] for asset in defs.state_assets]
        ['count_state']
    """
    if workers < 1:
        raise TopologyDefinitionError(f"topology_assets(workers={workers}): ask for at least 1 worker")
    if consumer_lag_threshold < 1:
        raise TopologyDefinitionError(f"topology_assets(consumer_lag_threshold={consumer_lag_threshold}): must be at least 1")
    translator = translator or StreamOpsTranslator()
    plan = build_plan(topology)
    stage_names = [stage.name for stage in plan.stages]
    duplicates = sorted({n for n in stage_names if stage_names.count(n) > 1})
    if duplicates:
        raise TopologyDefinitionError(
            f"topology {topology.name!r} has several stages named {duplicates}; stage names must be unique "
            "to give each stream asset its own key: rename the sources or aggregations"
        )
    conf_dict = dict(conf or {})
    submission_key = translator.submission_asset_key(topology.name)

    @dg.asset(
        key=submission_key,
        description=translator.description(plan),
        group_name=translator.group_name(topology.name),
        kinds={"zookeeper"},
        code_version=_plan_code_version(plan),
        metadata={
            "stream_ops/topology": dg.MetadataValue.text(topology.name),
            "stream_ops/stages": dg.MetadataValue.int(len(plan.stages)),
            "stream_ops/tasks": dg.MetadataValue.int(len(plan.tasks)),
            "stream_ops/workers": dg.MetadataValue.int(workers),
            "stream_ops/standby_replicas": dg.MetadataValue.int(standby_replicas),
        },
        op_tags={"stream_ops/topology": topology.name},
    )
    def _submission(
        context: dg.AssetExecutionContext,
        zookeeper: ZooKeeperResource,
        stream_cluster: StreamClusterResource,
    ) -> dg.MaterializeResult:
        cluster = stream_cluster.config()
        with zookeeper.store() as store:
            existing = find_topology_id(store, topology.name, missing_ok=True)
            if existing is None:
                topology_id = submit(store, cluster, topology, workers=workers, conf=conf_dict, standby_replicas=standby_replicas)
                context.log.info(f"submitted {topology_id} ({len(plan.tasks)} tasks, {workers} workers wanted)")
                storm = read_storm(store, topology_id)
                return dg.MaterializeResult(
                    metadata=_submission_metadata(store, storm, plan, action="submitted", plan_matches=True)
                )
            storm = read_storm(store, existing)
            running = _submitted_plan(storm, cluster)
            plan_matches = None if running is None else running == plan
            if plan_matches is False:
                context.log.warning(
                    f"{existing} runs a different plan than this code location defines for {topology.name!r}; "
                    f"to run the new plan, kill it (stream-ops kill {topology.name}) and materialize this asset again"
                )
            else:
                context.log.info(f"{topology.name!r} is already running as {existing}; nothing submitted")
            return dg.MaterializeResult(
                metadata=_submission_metadata(store, storm, running or plan, action="already_running", plan_matches=plan_matches)
            )

    sources = source_asset_specs(plan, translator)
    specs = tuple(
        _stream_spec(
            plan,
            stage,
            submission_key=submission_key,
            source_key=sources[stage.index].key if stage.index in sources else None,
            translator=translator,
        )
        for stage in plan.stages
    )
    sink_specs, parquet_sinks = sink_asset_specs(plan, translator)
    return TopologyDefinitions(
        topology_name=topology.name,
        plan=plan,
        submission_asset=_submission,
        stream_specs=specs,
        stream_observer=build_stream_observer(
            plan=plan, specs=specs, translator=translator, heartbeat_timeout_s=heartbeat_timeout_s
        ),
        health_asset=build_health_asset(plan=plan, translator=translator, heartbeat_timeout_s=heartbeat_timeout_s),
        source_specs=tuple(merge_source_specs(sources.values())),
        stream_checks=build_stream_checks(
            plan=plan,
            translator=translator,
            heartbeat_timeout_s=heartbeat_timeout_s,
            progress_timeout_s=progress_timeout_s,
        ),
        state_assets=tuple(state_assets(plan=plan, translator=translator, conf=conf_dict)),
        sink_specs=tuple(sink_specs),
        parquet_sinks=tuple(parquet_sinks),
        kafka_sources=tuple(kafka_source_watches(plan, translator, threshold=consumer_lag_threshold)),
    )
