"""Wire topologies, resources, jobs, sensors and schedules into one :class:`dagster.Definitions`.

:func:`build_definitions` builds a whole code location from a list of topologies. It is made of
three parts that can be used on their own, e.g. by
:class:`~stream_ops.orchestration.component.StreamTopologyComponent`, where each topology is
its own component and the parts must merge into one :class:`dagster.Definitions`:

* per topology, :func:`~stream_ops.orchestration.assets.topology_assets` (assets and checks)
  and :func:`build_topology_schedules` (its rebalance and compaction schedules);
* once per code location, :func:`build_cluster_definitions`: the jobs (with the job observing
  every stream asset, which the heartbeat sensor targets), the heartbeat sensor observing every
  topology, the worker relaunch sensor and the resources.

Topologies reading the same input share its source asset (:mod:`stream_ops.orchestration.lineage`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import dagster as dg
from dagster_pyspark import LazyPySparkResource

from stream_ops.dsl.streams import Topology
from stream_ops.orchestration.assets import (
    STREAM_CLUSTER_RESOURCE_KEY,
    ZOOKEEPER_RESOURCE_KEY,
    TopologyDefinitions,
    topology_assets,
)
from stream_ops.orchestration.consumer_lag import DEFAULT_CONSUMER_LAG_THRESHOLD
from stream_ops.orchestration.consumer_lag_checks import build_consumer_lag_checks
from stream_ops.orchestration.jobs import StreamOpsJobs, build_jobs
from stream_ops.orchestration.lineage import merge_source_specs
from stream_ops.orchestration.pinned import pinned_resource
from stream_ops.orchestration.resources import (
    PYSPARK_RESOURCE_KEY,
    StreamClusterResource,
    ZooKeeperResource,
    pyspark_resource,
)
from stream_ops.orchestration.schedules import build_compaction_schedule, build_rebalance_schedule
from stream_ops.orchestration.sensors import (
    DEFAULT_HEARTBEAT_SENSOR_NAME,
    build_heartbeat_sensor,
    build_worker_relaunch_sensor,
)
from stream_ops.orchestration.stream_observer import ObserveJob, build_observe_job
from stream_ops.orchestration.translator import StreamOpsTranslator

__all__ = [
    "StreamClusterDefinitions",
    "build_cluster_definitions",
    "build_definitions",
    "build_topology_schedules",
    "check_topology_names",
]


def check_topology_names(names: Sequence[str], caller: str) -> list[str]:
    """``names`` as a list, if there is at least one and no two are equal.

    Raises:
        ValueError: No names, or duplicates (named in the message, which starts with ``caller``).
    """
    names = list(names)
    if not names:
        raise ValueError(f"{caller}: give at least one topology")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"{caller}: several topologies are named {duplicates}; names must be unique")
    return names


@dataclass(frozen=True)
class StreamClusterDefinitions:
    """The cluster-wide definitions of one code location, as built by :func:`build_cluster_definitions`.

    Attributes:
        jobs: The worker, rebalance, activate, deactivate, kill and compact-state jobs.
        observe_job: The job observing every topology's stream assets on demand; the heartbeat
            sensor targets it, so the UI lists the sensor among those assets' automations.
        sensors: The heartbeat sensor over all topologies and the worker relaunch sensor.
        resources: ``zookeeper``, ``stream_cluster`` and ``pyspark``.
        asset_checks: The ``consumer_lag`` checks of the Kafka source assets (one definition
            over every topology's topics, since topologies share a topic's asset); empty
            without Kafka sources.
    """

    jobs: StreamOpsJobs
    observe_job: ObserveJob
    sensors: tuple[dg.SensorDefinition, ...]
    resources: Mapping[str, Any]
    asset_checks: tuple[dg.AssetChecksDefinition, ...] = ()

    @property
    def all_jobs(self) -> list[dg.JobDefinition | ObserveJob]:
        """Everything to pass to :class:`dagster.Definitions` ``jobs=``."""
        return [*self.jobs.all, self.observe_job]


def build_cluster_definitions(
    *,
    topologies: Sequence[TopologyDefinitions],
    zookeeper: ZooKeeperResource,
    stream_cluster: StreamClusterResource,
    pyspark: LazyPySparkResource | None = None,
    translator: StreamOpsTranslator | None = None,
    heartbeat_timeout_s: float = 10.0,
    heartbeat_interval_s: int = 5,
    progress_timeout_s: float = 60.0,
    launch_grace_s: float = 30.0,
    heartbeat_sensor_name: str = DEFAULT_HEARTBEAT_SENSOR_NAME,
    heartbeat_sensor_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.RUNNING,
    repair: bool = True,
    relaunch_sensor_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.RUNNING,
    kafka_timeout_s: float = 2.0,
) -> StreamClusterDefinitions:
    """The jobs, sensors and resources a code location has once, whatever its topologies.

    The heartbeat sensor observes every topology of ``topologies`` (and materializes their
    Parquet sinks and health assets); the jobs act on any topology named in their run configuration (the first
    one is the launchpad default). Arguments as in :func:`build_definitions`; ``translator``
    must name every topology's assets as its :func:`topology_assets` did.

    Raises:
        ValueError: No topologies, or two share a name.
    """
    names = check_topology_names([t.topology_name for t in topologies], "build_cluster_definitions")
    translator = translator or StreamOpsTranslator()
    jobs = build_jobs(topology_names=names, translator=translator)
    observe_job = build_observe_job([key for defs in topologies for key in defs.stream_keys])
    kafka_sources = [watch for defs in topologies for watch in defs.kafka_sources]
    lag_checks = build_consumer_lag_checks(kafka_sources, kafka_timeout_s=kafka_timeout_s)
    sensors = (
        build_heartbeat_sensor(
            topology_names=names,
            translator=translator,
            minimum_interval_seconds=heartbeat_interval_s,
            heartbeat_timeout_s=heartbeat_timeout_s,
            progress_timeout_s=progress_timeout_s,
            launch_grace_s=launch_grace_s,
            rebalance_job=jobs.rebalance if repair else None,
            worker_job=jobs.worker if repair else None,
            name=heartbeat_sensor_name,
            default_status=heartbeat_sensor_status,
            parquet_sinks=[watch for defs in topologies for watch in defs.parquet_sinks],
            observe_job=observe_job,
            report_health=True,
            kafka_sources=kafka_sources,
            kafka_timeout_s=kafka_timeout_s,
        ),
        build_worker_relaunch_sensor(worker_job=jobs.worker, default_status=relaunch_sensor_status),
    )
    return StreamClusterDefinitions(
        jobs=jobs,
        observe_job=observe_job,
        sensors=sensors,
        # Pinned: the deployment's settings, which no run config can replace (pinned.py).
        resources={
            ZOOKEEPER_RESOURCE_KEY: pinned_resource(zookeeper),
            STREAM_CLUSTER_RESOURCE_KEY: pinned_resource(stream_cluster),
            PYSPARK_RESOURCE_KEY: pinned_resource(pyspark if pyspark is not None else pyspark_resource(stream_cluster)),
        },
        asset_checks=(lag_checks,) if lag_checks is not None else (),
    )


def build_topology_schedules(
    topology: TopologyDefinitions,
    jobs: StreamOpsJobs,
    *,
    rebalance_cron: str | None = "*/15 * * * *",
    compaction_cron: str | None = "0 * * * *",
    schedule_status: dg.DefaultScheduleStatus = dg.DefaultScheduleStatus.STOPPED,
) -> list[dg.ScheduleDefinition]:
    """One topology's rebalance schedule and, if it keeps state, its compaction schedule.

    Their names carry the topology's name (``stream_ops_rebalance_<topology>``,
    ``stream_ops_compact_state_<topology>``), so the schedules of several topologies never clash.

    Args:
        topology: The topology's definitions (:func:`topology_assets`).
        jobs: The code location's jobs (:func:`build_cluster_definitions`).
        rebalance_cron: Cron of the rebalance schedule; None: no schedule.
        compaction_cron: Cron of the compaction schedule (topologies with keyed stages only);
            None: no schedule.
        schedule_status: Whether the schedules run as soon as the code loads.
    """
    schedules: list[dg.ScheduleDefinition] = []
    if rebalance_cron is not None:
        schedules.append(
            build_rebalance_schedule(
                topology_name=topology.topology_name,
                rebalance_job=jobs.rebalance,
                cron_schedule=rebalance_cron,
                default_status=schedule_status,
            )
        )
    if compaction_cron is not None and topology.state_assets:
        schedules.append(
            build_compaction_schedule(
                topology_name=topology.topology_name,
                compact_job=jobs.compact_state,
                cron_schedule=compaction_cron,
                default_status=schedule_status,
            )
        )
    return schedules


def build_definitions(
    *,
    topologies: Sequence[Topology],
    zookeeper: ZooKeeperResource,
    stream_cluster: StreamClusterResource,
    pyspark: LazyPySparkResource | None = None,
    workers: int = 2,
    standby_replicas: int = 0,
    conf: Mapping[str, Any] | None = None,
    translator: StreamOpsTranslator | None = None,
    heartbeat_timeout_s: float = 10.0,
    heartbeat_interval_s: int = 5,
    progress_timeout_s: float = 60.0,
    launch_grace_s: float = 30.0,
    heartbeat_sensor_name: str = DEFAULT_HEARTBEAT_SENSOR_NAME,
    heartbeat_sensor_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.RUNNING,
    repair: bool = True,
    relaunch_sensor_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.RUNNING,
    rebalance_cron: str | None = "*/15 * * * *",
    compaction_cron: str | None = "0 * * * *",
    schedule_status: dg.DefaultScheduleStatus = dg.DefaultScheduleStatus.STOPPED,
    consumer_lag_threshold: int = DEFAULT_CONSUMER_LAG_THRESHOLD,
    kafka_timeout_s: float = 2.0,
) -> dg.Definitions:
    """The Dagster control room for ``topologies``.

    * Per topology (:func:`topology_assets`): a submission asset, one observed stream asset
      per stage with its heartbeat-freshness and txid-progress checks, downstream of the
      source asset of what it reads or of the stages it reads, one queue-partitioned state
      snapshot asset per keyed stage, one asset per sink (the heartbeat sensor materializes
      Parquet sinks as their tasks commit) and a health asset (tasks table, one-word health,
      ``topology_health`` check). A rebalance and a compaction schedule (unless their cron is None).
    * Cluster-wide (:func:`build_jobs`): the worker, rebalance, activate, deactivate, kill and
      compact-state jobs; the heartbeat sensor over all topologies, which requests rebalance
      and worker runs when ``repair`` is on; the run-failure sensor relaunching failed
      worker runs.
    * Resources ``zookeeper``, ``stream_cluster`` and ``pyspark`` (default: a
      :class:`LazyPySparkResource` with ``stream_cluster``'s Spark settings), pinned
      (:func:`~stream_ops.orchestration.pinned.pinned_resource`): whoever launches a run cannot
      replace their configuration, so cluster credentials only go to the deployment's hosts.

    The heartbeat sensor runs by default: it reads ZooKeeper, and skips its tick (with the
    reason) while ZooKeeper is unreachable. Schedules are stopped unless ``schedule_status``
    says otherwise (the example code location turns them on).

    Args:
        topologies: The topologies to submit and observe (names must be unique).
        zookeeper: Where the cluster's coordination data lives.
        stream_cluster: Where the cluster's files live and how Dagster-launched workers run.
        pyspark: The Spark of worker runs; default built from ``stream_cluster``.
        workers: Worker slots each topology asks for at submission.
        standby_replicas: Standby replicas of each stateful task (see :func:`~stream_ops.nimbus.submit`).
        conf: Topology configuration stored with each submission.
        translator: Naming of keys and groups; default :class:`StreamOpsTranslator`.
        heartbeat_timeout_s: A task is alive if owned and its heartbeat is at most this old.
        heartbeat_interval_s: Seconds between heartbeat sensor ticks.
        progress_timeout_s: The txid-progress check fails for a task with unprocessed input
            that committed nothing for longer than this.
        launch_grace_s: Time a new assignment gets before its lost tasks call for a rebalance.
        heartbeat_sensor_name: Name of the heartbeat sensor.
        heartbeat_sensor_status: Whether the heartbeat sensor runs as soon as the code loads.
        repair: Whether the heartbeat sensor requests rebalance and worker runs.
        relaunch_sensor_status: Whether the worker relaunch sensor runs as soon as the code loads.
        rebalance_cron: Cron of each topology's rebalance schedule; None: no schedule.
        compaction_cron: Cron of each topology's compaction schedule (topologies with keyed
            stages only); None: no schedule.
        schedule_status: Whether the schedules run as soon as the code loads.
        consumer_lag_threshold: The ``consumer_lag`` check of a Kafka source asset fails when a
            topology reading it is this many records behind (end offsets less committed
            offsets, over all partitions).
        kafka_timeout_s: Longest wait of the heartbeat sensor (and the on-demand check) for one
            topic's offsets from the brokers.

    Returns:
        The definitions, ready to be a code location's ``defs``.

    Raises:
        ValueError: No topologies, or two share a name.
        TopologyDefinitionError: Two different inputs get the same source asset key.

    Example:
        >>> defs = build_definitions(  # doctest: +SKIP
        ...     topologies=[wordcount.topology()],
        ...     zookeeper=ZooKeeperResource(hosts="127.0.0.1:2181"),
        ...     stream_cluster=StreamClusterResource(root="/srv/stream_ops"),
        ... )
    """
    check_topology_names([t.name for t in topologies], "build_definitions")
    translator = translator or StreamOpsTranslator()
    per_topology = [
        topology_assets(
            topology=t,
            workers=workers,
            standby_replicas=standby_replicas,
            conf=conf,
            translator=translator,
            heartbeat_timeout_s=heartbeat_timeout_s,
            progress_timeout_s=progress_timeout_s,
            consumer_lag_threshold=consumer_lag_threshold,
        )
        for t in topologies
    ]
    cluster = build_cluster_definitions(
        topologies=per_topology,
        zookeeper=zookeeper,
        stream_cluster=stream_cluster,
        pyspark=pyspark,
        translator=translator,
        heartbeat_timeout_s=heartbeat_timeout_s,
        heartbeat_interval_s=heartbeat_interval_s,
        progress_timeout_s=progress_timeout_s,
        launch_grace_s=launch_grace_s,
        heartbeat_sensor_name=heartbeat_sensor_name,
        heartbeat_sensor_status=heartbeat_sensor_status,
        repair=repair,
        relaunch_sensor_status=relaunch_sensor_status,
        kafka_timeout_s=kafka_timeout_s,
    )
    schedules = [
        schedule
        for definitions in per_topology
        for schedule in build_topology_schedules(
            definitions,
            cluster.jobs,
            rebalance_cron=rebalance_cron,
            compaction_cron=compaction_cron,
            schedule_status=schedule_status,
        )
    ]
    merge_source_specs(spec for d in per_topology for spec in d.source_specs)  # refuses clashing inputs, naming both
    return dg.Definitions(
        assets=[asset for d in per_topology for asset in d.assets],
        asset_checks=[check for d in per_topology for check in d.asset_checks] + list(cluster.asset_checks),
        jobs=cluster.all_jobs,
        sensors=list(cluster.sensors),
        schedules=schedules,
        resources=dict(cluster.resources),
    )
