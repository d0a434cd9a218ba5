"""stream_ops.orchestration: the Dagster control room (the only package that imports dagster).

Public API:

* Resources: :class:`ZooKeeperResource`, :class:`StreamClusterResource`.
* Naming: :class:`StreamOpsTranslator`.
* Assets: :func:`topology_assets` -> :class:`TopologyDefinitions`.
* Observations: :func:`observe_topology`, :data:`OBSERVATION_FIELDS`.
* Sensor: :func:`build_heartbeat_sensor`, its cursor :class:`HeartbeatCursor`.
* Wiring: :func:`build_definitions`.

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
from stream_ops.orchestration.cursor import HeartbeatCursor, TopologyCursor
from stream_ops.orchestration.definitions import build_definitions
from stream_ops.orchestration.observations import (
    OBSERVATION_FIELDS,
    observation_schema,
    observe_absent_topology,
    observe_topology,
    stage_health,
)
from stream_ops.orchestration.resources import StreamClusterResource, ZooKeeperResource
from stream_ops.orchestration.sensors import (
    DEFAULT_HEARTBEAT_SENSOR_NAME,
    HeartbeatTick,
    build_heartbeat_sensor,
    observe_tick,
)
from stream_ops.orchestration.translator import StreamOpsTranslator

__all__ = [
    "DEFAULT_HEARTBEAT_SENSOR_NAME",
    "OBSERVATION_FIELDS",
    "STREAM_CLUSTER_RESOURCE_KEY",
    "ZOOKEEPER_RESOURCE_KEY",
    "HeartbeatCursor",
    "HeartbeatTick",
    "StreamClusterResource",
    "StreamOpsTranslator",
    "TopologyCursor",
    "TopologyDefinitions",
    "ZooKeeperResource",
    "build_definitions",
    "build_heartbeat_sensor",
    "observation_schema",
    "observe_absent_topology",
    "observe_tick",
    "observe_topology",
    "stage_health",
    "topology_assets",
]
