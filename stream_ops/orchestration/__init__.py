"""stream_ops.orchestration: the Dagster control room (the only package that imports dagster).

Public API:

* Resources: :class:`ZooKeeperResource`, :class:`StreamClusterResource` (with the settings of
  Dagster-launched workers), :func:`pyspark_resource` (dagster-pyspark's ``LazyPySparkResource``).
* Naming: :class:`StreamOpsTranslator`.
* Assets: :func:`topology_assets` -> :class:`TopologyDefinitions` (submission asset, stream
  assets with their checks, queue-partitioned state assets); :func:`state_assets`.
* Checks: :func:`build_stream_checks`, :func:`evaluate_stage_checks`.
* Observations: :func:`observe_topology`, :data:`OBSERVATION_FIELDS`; on demand:
  :func:`build_stream_observer` and :func:`build_observe_job` (which the heartbeat sensor targets).
* Lineage: :func:`source_asset_specs` (Kafka topics, FileTopics and directories upstream of
  the source stages), :func:`merge_source_specs`.
* Health: :func:`build_health_asset`, :func:`health_events`, :data:`TOPOLOGY_HEALTH`,
  :data:`TASKS_TABLE_SCHEMA`.
* Jobs: :func:`build_jobs` (worker, rebalance, activate, deactivate, kill, compact state).
* Sensors: :func:`build_heartbeat_sensor` (cursor :class:`HeartbeatCursor`),
  :func:`build_worker_relaunch_sensor`.
* Schedules: :func:`build_rebalance_schedule`, :func:`build_compaction_schedule`.
* Wiring: :func:`build_definitions`, made of :func:`build_cluster_definitions` (jobs, sensors,
  resources: once per code location) and, per topology, :func:`topology_assets` and
  :func:`build_topology_schedules`.
* Component: :class:`StreamTopologyComponent` (``stream_ops.StreamTopologyComponent`` in a
  ``dg`` project's ``defs.yaml``), :func:`cluster_resources_from_env`,
  :class:`TopologyNamingTranslator`.

Example:
    >>> from stream_ops.orchestration import build_definitions, StreamClusterResource, ZooKeeperResource
    >>> defs = build_definitions(  # doctest: +SKIP
    ...     topologies=[topology],
    ...     zookeeper=ZooKeeperResource(hosts="127.0.0.1:2181", chroot="/stream_ops"),
    ...     stream_cluster=StreamClusterResource(root="/srv/stream_ops"),
    ... )
"""

from stream_ops.orchestration.assets import (
    STREAM_CLUSTER_RESOURCE_KEY,
    ZOOKEEPER_RESOURCE_KEY,
    TopologyDefinitions,
    topology_assets,
)
from stream_ops.orchestration.checks import (
    HEARTBEAT_FRESHNESS,
    TXID_PROGRESS,
    CheckOutcome,
    build_stream_checks,
    evaluate_stage_checks,
    evaluate_topology_checks,
    stream_checks_op_name,
)
from stream_ops.orchestration.component import (
    StreamTopologyComponent,
    StreamTopologyScaffolder,
    TopologyNamingTranslator,
    cluster_resources_from_env,
)
from stream_ops.orchestration.consumer_lag import (
    CONSUMER_LAG,
    DEFAULT_CONSUMER_LAG_THRESHOLD,
    KafkaSourceWatch,
    evaluate_consumer_lag,
    kafka_source_watches,
)
from stream_ops.orchestration.consumer_lag_checks import build_consumer_lag_checks
from stream_ops.orchestration.cursor import HeartbeatCursor, TopologyCursor
from stream_ops.orchestration.definitions import (
    StreamClusterDefinitions,
    build_cluster_definitions,
    build_definitions,
    build_topology_schedules,
)
from stream_ops.orchestration.health import (
    TASKS_TABLE_SCHEMA,
    TOPOLOGY_HEALTH,
    build_health_asset,
    health_events,
    health_metadata,
)
from stream_ops.orchestration.jobs import (
    ACTIVATE_JOB_NAME,
    COMPACT_STATE_JOB_NAME,
    DEACTIVATE_JOB_NAME,
    KILL_JOB_NAME,
    REBALANCE_JOB_NAME,
    WORKER_JOB_NAME,
    StreamOpsJobs,
    build_jobs,
    compact_run_config,
    rebalance_run_config,
    worker_run_config,
)
from stream_ops.orchestration.lineage import merge_source_specs, source_asset_specs
from stream_ops.orchestration.observations import (
    OBSERVATION_FIELDS,
    observation_schema,
    observe_absent_topology,
    observe_topology,
    stage_health,
)
from stream_ops.orchestration.resources import (
    PYSPARK_RESOURCE_KEY,
    StreamClusterResource,
    ZooKeeperResource,
    pyspark_resource,
)
from stream_ops.orchestration.schedules import build_compaction_schedule, build_rebalance_schedule
from stream_ops.orchestration.sensors import (
    DEFAULT_HEARTBEAT_SENSOR_NAME,
    DEFAULT_RELAUNCH_SENSOR_NAME,
    HeartbeatTick,
    RebalanceNeed,
    build_heartbeat_sensor,
    build_worker_relaunch_sensor,
    observe_tick,
    rebalance_run_key,
    workers_to_launch,
)
from stream_ops.orchestration.state import state_assets
from stream_ops.orchestration.stream_observer import OBSERVE_JOB_NAME, build_observe_job, build_stream_observer
from stream_ops.orchestration.translator import StreamOpsTranslator

__all__ = [
    "ACTIVATE_JOB_NAME",
    "CONSUMER_LAG",
    "DEFAULT_CONSUMER_LAG_THRESHOLD",
    "KafkaSourceWatch",
    "build_consumer_lag_checks",
    "evaluate_consumer_lag",
    "kafka_source_watches",
    "COMPACT_STATE_JOB_NAME",
    "DEACTIVATE_JOB_NAME",
    "DEFAULT_HEARTBEAT_SENSOR_NAME",
    "DEFAULT_RELAUNCH_SENSOR_NAME",
    "HEARTBEAT_FRESHNESS",
    "KILL_JOB_NAME",
    "OBSERVATION_FIELDS",
    "OBSERVE_JOB_NAME",
    "PYSPARK_RESOURCE_KEY",
    "REBALANCE_JOB_NAME",
    "STREAM_CLUSTER_RESOURCE_KEY",
    "TASKS_TABLE_SCHEMA",
    "TOPOLOGY_HEALTH",
    "TXID_PROGRESS",
    "WORKER_JOB_NAME",
    "ZOOKEEPER_RESOURCE_KEY",
    "CheckOutcome",
    "HeartbeatCursor",
    "HeartbeatTick",
    "RebalanceNeed",
    "StreamClusterDefinitions",
    "StreamClusterResource",
    "StreamOpsJobs",
    "StreamOpsTranslator",
    "StreamTopologyComponent",
    "StreamTopologyScaffolder",
    "TopologyCursor",
    "TopologyDefinitions",
    "TopologyNamingTranslator",
    "ZooKeeperResource",
    "build_cluster_definitions",
    "build_compaction_schedule",
    "build_definitions",
    "build_health_asset",
    "build_heartbeat_sensor",
    "build_jobs",
    "build_observe_job",
    "build_rebalance_schedule",
    "build_stream_checks",
    "build_stream_observer",
    "build_topology_schedules",
    "cluster_resources_from_env",
    "build_worker_relaunch_sensor",
    "compact_run_config",
    "evaluate_stage_checks",
    "evaluate_topology_checks",
    "health_events",
    "health_metadata",
    "merge_source_specs",
    "observation_schema",
    "observe_absent_topology",
    "observe_tick",
    "observe_topology",
    "pyspark_resource",
    "rebalance_run_config",
    "rebalance_run_key",
    "source_asset_specs",
    "stage_health",
    "state_assets",
    "stream_checks_op_name",
    "topology_assets",
    "worker_run_config",
    "workers_to_launch",
]
