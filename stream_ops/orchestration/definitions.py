"""Wire topologies, resources and the heartbeat sensor into one :class:`dagster.Definitions`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg

from stream_ops.orchestration.assets import (
    STREAM_CLUSTER_RESOURCE_KEY,
    ZOOKEEPER_RESOURCE_KEY,
    topology_assets,
)
from stream_ops.orchestration.resources import StreamClusterResource, ZooKeeperResource
from stream_ops.orchestration.sensors import DEFAULT_HEARTBEAT_SENSOR_NAME, build_heartbeat_sensor
from stream_ops.orchestration.translator import StreamOpsTranslator
from stream_ops.topology.dsl import Topology

__all__ = ["build_definitions"]


def build_definitions(
    *,
    topologies: Sequence[Topology],
    zookeeper: ZooKeeperResource,
    stream_cluster: StreamClusterResource,
    workers: int = 2,
    conf: Mapping[str, Any] | None = None,
    translator: StreamOpsTranslator | None = None,
    heartbeat_timeout_s: float = 10.0,
    heartbeat_interval_s: int = 5,
    heartbeat_sensor_name: str = DEFAULT_HEARTBEAT_SENSOR_NAME,
    heartbeat_sensor_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.RUNNING,
) -> dg.Definitions:
    """The Dagster control room for ``topologies``.

    Per topology: a submission asset and one observed stream asset per stage
    (:func:`topology_assets`); one heartbeat sensor over all of them
    (:func:`build_heartbeat_sensor`); the ``zookeeper`` and ``stream_cluster`` resources.

    The heartbeat sensor runs by default: it only reads ZooKeeper, and skips its tick (with the
    reason) while ZooKeeper is unreachable.

    Args:
        topologies: The topologies to submit and observe (names must be unique).
        zookeeper: Where the cluster's coordination data lives.
        stream_cluster: Where the cluster's files live.
        workers: Worker slots each topology asks for at submission.
        conf: Topology configuration stored with each submission.
        translator: Naming of keys and groups; default :class:`StreamOpsTranslator`.
        heartbeat_timeout_s: A task is alive if owned and its heartbeat is at most this old.
        heartbeat_interval_s: Seconds between heartbeat sensor ticks.
        heartbeat_sensor_name: Name of the heartbeat sensor.
        heartbeat_sensor_status: Whether the heartbeat sensor runs as soon as the code loads.

    Returns:
        The definitions, ready to be a code location's ``defs``.

    Raises:
        ValueError: No topologies, or two share a name.

    Example:
        >>> defs = build_definitions(  # doctest: +SKIP
        ...     topologies=[wordcount.topology()],
        ...     zookeeper=ZooKeeperResource(hosts="127.0.0.1:2181"),
        ...     stream_cluster=StreamClusterResource(root="/srv/stream_ops"),
        ... )
    """
    names = [t.name for t in topologies]
    if not names:
        raise ValueError("build_definitions: give at least one topology")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"build_definitions: several topologies are named {duplicates}; names must be unique")
    translator = translator or StreamOpsTranslator()
    per_topology = [
        topology_assets(topology=t, workers=workers, conf=conf, translator=translator) for t in topologies
    ]
    sensor = build_heartbeat_sensor(
        topology_names=names,
        translator=translator,
        minimum_interval_seconds=heartbeat_interval_s,
        heartbeat_timeout_s=heartbeat_timeout_s,
        name=heartbeat_sensor_name,
        default_status=heartbeat_sensor_status,
    )
    return dg.Definitions(
        assets=[asset for d in per_topology for asset in d.assets],
        sensors=[sensor],
        resources={ZOOKEEPER_RESOURCE_KEY: zookeeper, STREAM_CLUSTER_RESOURCE_KEY: stream_cluster},
    )
