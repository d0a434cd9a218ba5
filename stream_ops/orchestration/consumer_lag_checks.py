"""The ``consumer_lag`` checks of the Kafka source assets, declared once per code location.

The heartbeat sensor evaluates them on every tick (:mod:`stream_ops.orchestration.sensors`);
:func:`build_consumer_lag_checks` declares them, so they show on the source assets' pages, and
makes them executable on demand: executed in a run, the check reads the reading topologies from
ZooKeeper and the topics' offsets from the brokers now, with the rule of
:func:`~stream_ops.orchestration.consumer_lag.evaluate_consumer_lag`.

A topic may be read by several topologies (one source asset), so the checks are built once per
code location over every topology's watches
(:func:`~stream_ops.orchestration.definitions.build_cluster_definitions`), never per topology.

Note: this module does not use ``from __future__ import annotations`` because Dagster reads
the resource parameters' annotations of the decorated function at definition time.
"""

from collections.abc import Iterator, Sequence

import dagster as dg

from stream_ops.errors import TopologyNotFoundError
from stream_ops.kafka.offsets import EndOffsets
from stream_ops.nimbus.status import describe_topology
from stream_ops.nimbus.submission import find_topology_id
from stream_ops.orchestration.consumer_lag import (
    CONSUMER_LAG,
    KafkaSourceWatch,
    TopologyLag,
    consumer_lag_check_spec,
    consumer_lag_events,
    evaluate_consumer_lag,
)
from stream_ops.orchestration.kafka_offsets import TickOffsets, read_topology_lags
from stream_ops.orchestration.resources import ZooKeeperResource

__all__ = ["CONSUMER_LAG_CHECKS_NAME", "build_consumer_lag_checks"]

#: The op name of the code location's consumer-lag checks.
CONSUMER_LAG_CHECKS_NAME = "stream_ops_consumer_lag_checks"


def build_consumer_lag_checks(
    watches: Sequence[KafkaSourceWatch], *, kafka_timeout_s: float = 2.0
) -> dg.AssetChecksDefinition | None:
    """The ``consumer_lag`` check of every Kafka source asset ``watches`` name (None: no Kafka source).

    Args:
        watches: Every topology's Kafka source watches (several may name one asset).
        kafka_timeout_s: Longest wait for one topic's offsets when executed on demand.

    Returns:
        A multi-asset check requiring the ``zookeeper`` resource, or None without watches.
    """
    keys = list(dict.fromkeys(w.asset_key for w in watches))
    if not keys:
        return None
    by_topology: dict[str, list[KafkaSourceWatch]] = {}
    for watch in watches:
        by_topology.setdefault(watch.topology_name, []).append(watch)

    @dg.multi_asset_check(
        name=CONSUMER_LAG_CHECKS_NAME,
        specs=[consumer_lag_check_spec(key) for key in keys],
        description="Consumer lag of every Kafka topic the stream_ops topologies read: broker end offsets less the "
        "offsets committed in ZooKeeper, against each topology's threshold.",
        can_subset=True,
    )
    def _consumer_lag(context: dg.AssetCheckExecutionContext, zookeeper: ZooKeeperResource) -> Iterator[dg.AssetCheckResult]:
        wanted = set(context.selected_asset_check_keys)
        offsets = TickOffsets(EndOffsets(timeout_s=kafka_timeout_s))
        lags: list[TopologyLag] = []
        with zookeeper.store() as store:
            for name, topology_watches in by_topology.items():
                if not any(dg.AssetCheckKey(w.asset_key, CONSUMER_LAG) in wanted for w in topology_watches):
                    continue
                topology_id = find_topology_id(store, name, missing_ok=True)
                if topology_id is None:
                    continue
                try:
                    status = describe_topology(store, topology_id)
                except TopologyNotFoundError:  # killed meanwhile
                    continue
                lags.extend(read_topology_lags(status, topology_watches, offsets))
        _, outcomes = consumer_lag_events(lags)
        evaluated = set()
        for outcome in outcomes:
            check_key = dg.AssetCheckKey(outcome.asset_key, CONSUMER_LAG)
            if check_key in wanted:
                evaluated.add(check_key)
                yield outcome.to_result()
        for check_key in sorted(wanted - evaluated, key=lambda k: k.asset_key.to_user_string()):
            context.log.info(f"no live topology reads {check_key.asset_key.to_user_string()}")
            yield evaluate_consumer_lag(check_key.asset_key, []).to_result()

    return _consumer_lag
