"""The heartbeat sensor: observe every topology's stream assets on each tick.

Each tick opens one ZooKeeper session through the ``zookeeper`` resource, finds the live
submission of each configured topology name, reads
:func:`~stream_ops.nimbus.status.describe_topology` and records one
:class:`dagster.AssetObservation` per stage (:func:`observe_topology`). The cursor
(:class:`HeartbeatCursor`) remembers committed txids and lost tasks per topology.

A tick is bounded in wall-clock time: once ``tick_budget_s`` has passed, the remaining
topologies are left for the next tick, which starts with the least recently observed ones.
No run is requested yet; ``TopologyCursor.lost_since`` is kept for the rebalance trigger.

Note: this module does not use ``from __future__ import annotations`` because Dagster reads
the resource parameters' annotations of the decorated function at definition time.
"""

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import dagster as dg

from stream_ops.coordination.store import ZkStore
from stream_ops.errors import CoordinationError, StreamOpsError, TopologyNotFoundError
from stream_ops.nimbus.status import describe_topology
from stream_ops.nimbus.submission import find_topology_id
from stream_ops.orchestration.cursor import HeartbeatCursor, TopologyCursor
from stream_ops.orchestration.observations import observe_absent_topology, observe_topology
from stream_ops.orchestration.resources import ZooKeeperResource
from stream_ops.orchestration.translator import StreamOpsTranslator

__all__ = ["DEFAULT_HEARTBEAT_SENSOR_NAME", "HeartbeatTick", "build_heartbeat_sensor", "observe_tick"]

logger = logging.getLogger(__name__)

DEFAULT_HEARTBEAT_SENSOR_NAME = "stream_ops_heartbeat_sensor"


@dataclass(frozen=True)
class HeartbeatTick:
    """The outcome of one heartbeat tick.

    Attributes:
        asset_events: Observations to record, in topology then stage order.
        cursor: The cursor to store for the next tick.
        observed: Topology names observed (live submission found and read).
        absent: Topology names without a live submission.
        deferred: Topology names left for the next tick because the time budget ran out.
        failed: Topology name -> error message for topologies that could not be read.
    """

    asset_events: list[dg.AssetObservation]
    cursor: HeartbeatCursor
    observed: list[str] = field(default_factory=list)
    absent: list[str] = field(default_factory=list)
    deferred: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


def observe_tick(
    store: ZkStore,
    cursor: HeartbeatCursor,
    *,
    topology_names: Sequence[str],
    translator: StreamOpsTranslator,
    heartbeat_timeout_s: float,
    tick_budget_s: float,
    clock: Callable[[], float] = time.monotonic,
    wall_clock: Callable[[], float] = time.time,
    log: logging.Logger | logging.LoggerAdapter = logger,  # type: ignore[type-arg]
) -> HeartbeatTick:
    """Observe the given topologies once (the body of a heartbeat sensor tick).

    Args:
        store: A connected store.
        cursor: The previous tick's cursor.
        topology_names: Topologies to observe, by name.
        translator: Maps (topology, stage) to asset keys.
        heartbeat_timeout_s: A task is alive if owned and its heartbeat is at most this old.
        tick_budget_s: Stop starting new topologies once this much time has passed.
        clock: Monotonic clock for the budget (injectable for tests).
        wall_clock: Unix time, for heartbeat ages and the cursor's timestamps.
        log: Where to log state changes (the sensor passes ``context.log``).

    Returns:
        The observations and the new cursor.
    """
    started = clock()
    # Least recently observed first, so a topology deferred by the budget goes first next time.
    order = sorted(
        topology_names,
        key=lambda n: cursor.topologies[n].observed_at if n in cursor.topologies else float("-inf"),
    )
    events: list[dg.AssetObservation] = []
    observed: list[str] = []
    absent: list[str] = []
    deferred: list[str] = []
    failed: dict[str, str] = {}
    new_cursor = cursor
    for index, name in enumerate(order):
        if clock() - started >= tick_budget_s:
            deferred.extend(order[index:])
            log.warning(
                f"heartbeat tick used its {tick_budget_s:g}s budget; {len(deferred)} topologies "
                f"left for the next tick: {', '.join(deferred)}"
            )
            break
        previous = new_cursor.topologies.get(name)
        try:
            topology_id = find_topology_id(store, name, missing_ok=True)
            status = describe_topology(store, topology_id, clock=wall_clock) if topology_id else None
        except TopologyNotFoundError:
            status = None  # killed between the lookup and the read
        except (StreamOpsError, ValueError) as e:  # ValueError: a znode with an unexpected record
            failed[name] = str(e)
            log.warning(f"cannot read topology {name!r} from ZooKeeper: {e}; keeping its last cursor")
            continue
        if status is None:
            absent.append(name)
            if previous is not None:
                log.info(f"topology {name!r} ({previous.topology_id}) has no live submission any more")
                events.extend(
                    observe_absent_topology(
                        name, previous.stages, last_topology_id=previous.topology_id, translator=translator
                    )
                )
                new_cursor = new_cursor.with_topology(name, None)
            continue

        same_submission = previous is not None and previous.topology_id == status.topology_id
        events.extend(
            observe_topology(
                status,
                translator=translator,
                heartbeat_timeout_s=heartbeat_timeout_s,
                previous_txids=previous.committed_txids if same_submission and previous else None,
            )
        )
        now = wall_clock()
        old_lost = previous.lost_since if same_submission and previous else {}
        health = status.health(heartbeat_timeout_s)
        entry = TopologyCursor(
            topology_id=status.topology_id,
            stages=tuple(dict.fromkeys(t.stage_name for t in sorted(status.tasks, key=lambda t: t.stage))),
            committed_txids={t.task_id: t.committed_txid for t in status.tasks},
            lost_since={
                t.task_id: old_lost.get(t.task_id, now) for t in status.tasks if not t.alive(heartbeat_timeout_s)
            },
            health=health,
            observed_at=now,
        )
        if not same_submission or previous is None or previous.health != health:
            lost = sorted(entry.lost_since)
            log.info(
                f"topology {name!r} ({status.topology_id}) is {health}"
                + (f"; lost tasks {lost}" if lost and health != "inactive" else "")
            )
        new_cursor = new_cursor.with_topology(name, entry)
        observed.append(name)
    return HeartbeatTick(
        asset_events=events, cursor=new_cursor, observed=observed, absent=absent, deferred=deferred, failed=failed
    )


def build_heartbeat_sensor(
    *,
    topology_names: Sequence[str],
    translator: StreamOpsTranslator | None = None,
    minimum_interval_seconds: int = 5,
    heartbeat_timeout_s: float = 10.0,
    tick_budget_s: float = 20.0,
    name: str = DEFAULT_HEARTBEAT_SENSOR_NAME,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
) -> dg.SensorDefinition:
    """A sensor recording an observation per stage of each topology on every tick.

    Requires the ``zookeeper`` resource. When ZooKeeper cannot be reached the tick is skipped
    (with the reason) and the cursor is kept.

    Args:
        topology_names: Topologies to observe, by name.
        translator: Maps (topology, stage) to asset keys; must match the one given to
            :func:`~stream_ops.orchestration.assets.topology_assets`.
        minimum_interval_seconds: Seconds between ticks.
        heartbeat_timeout_s: A task is alive if owned and its heartbeat is at most this old.
        tick_budget_s: Wall-clock budget per tick for observing topologies (connecting to
            ZooKeeper is bounded separately by the resource's ``connect_timeout_s``).
        name: The sensor's name (deterministic; change it only with the definitions).
        default_status: Whether the sensor runs as soon as the code location loads.

    Returns:
        The sensor definition.

    Raises:
        ValueError: No or duplicate topology names, or a non-positive interval, timeout or budget.

    Example:
        >>> sensor = build_heartbeat_sensor(topology_names=["wordcount"], heartbeat_timeout_s=10.0)
        >>> sensor.name
        'stream_ops_heartbeat_sensor'
    """
    names = list(topology_names)
    if not names:
        raise ValueError("build_heartbeat_sensor: give at least one topology name in topology_names")
    if len(set(names)) != len(names):
        raise ValueError(f"build_heartbeat_sensor: topology_names has duplicates: {names}")
    if minimum_interval_seconds < 1:
        raise ValueError(f"build_heartbeat_sensor: minimum_interval_seconds must be >= 1, got {minimum_interval_seconds}")
    if heartbeat_timeout_s <= 0 or tick_budget_s <= 0:
        raise ValueError(
            f"build_heartbeat_sensor: heartbeat_timeout_s ({heartbeat_timeout_s}) and tick_budget_s "
            f"({tick_budget_s}) must be positive"
        )
    translator = translator or StreamOpsTranslator()

    @dg.sensor(
        name=name,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description=(
            f"Observes the stream assets of {', '.join(names)} from ZooKeeper every {minimum_interval_seconds}s: "
            f"health (heartbeat timeout {heartbeat_timeout_s:g}s), heartbeat ages, committed txids, rows/s, lag, "
            "dead letters."
        ),
    )
    def _heartbeat_sensor(context: dg.SensorEvaluationContext, zookeeper: ZooKeeperResource) -> dg.SensorResult:
        cursor = HeartbeatCursor.parse(context.cursor)
        try:
            with zookeeper.store() as store:
                tick = observe_tick(
                    store,
                    cursor,
                    topology_names=names,
                    translator=translator,
                    heartbeat_timeout_s=heartbeat_timeout_s,
                    tick_budget_s=tick_budget_s,
                    log=context.log,
                )
        except CoordinationError as e:
            context.log.warning(f"ZooKeeper unavailable, skipping this tick: {e}")
            return dg.SensorResult(skip_reason=f"ZooKeeper unavailable: {e}")
        if not tick.asset_events:
            reason = "no live submission of " + ", ".join(names)
            if tick.failed:
                reason = "could not read " + ", ".join(f"{n} ({m})" for n, m in tick.failed.items())
            return dg.SensorResult(skip_reason=reason, cursor=tick.cursor.to_json())
        return dg.SensorResult(asset_events=tick.asset_events, cursor=tick.cursor.to_json())

    return _heartbeat_sensor
