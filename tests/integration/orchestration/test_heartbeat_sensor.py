"""The heartbeat sensor against a real ZooKeeper, with simulated task heartbeats."""

from __future__ import annotations

import itertools
from typing import Any

import dagster as dg
import pytest

from stream_ops.coordination.embedded import free_port
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.nimbus.submission import deactivate, kill, submit
from stream_ops.orchestration import (
    HeartbeatCursor,
    StreamClusterResource,
    StreamOpsTranslator,
    TopologyCursor,
    ZooKeeperResource,
    build_definitions,
    build_heartbeat_sensor,
    observe_tick,
)
from stream_ops.topology.dsl import Topology

SOURCE = dg.AssetKey(["stream_ops", "wordcount", "sentences"])
KEYED = dg.AssetKey(["stream_ops", "wordcount", "count"])
# Task ids of the 2-queue word count: stage 0 (sentences) has 0 and 1, stage 1 (count) 2 and 3.
SOURCE_TASKS = (0, 1)
KEYED_TASKS = (2, 3)


@pytest.fixture
def topology_id(wordcount: Topology, zk_store: ZkStore, cluster_resource: StreamClusterResource) -> str:
    return submit(zk_store, cluster_resource.config(), wordcount, workers=2)


@pytest.fixture
def sensor() -> dg.SensorDefinition:
    return build_heartbeat_sensor(topology_names=["wordcount"], heartbeat_timeout_s=10.0)


def _tick(
    sensor: dg.SensorDefinition, resources: dict[str, Any], cursor: str | None = None, **kwargs: Any
) -> dg.SensorResult:
    with dg.build_sensor_context(resources=resources, cursor=cursor, **kwargs) as context:
        result = sensor(context)
    assert isinstance(result, dg.SensorResult)
    assert not result.run_requests
    return result


def _by_key(result: dg.SensorResult) -> dict[dg.AssetKey, dict[str, Any]]:
    events = result.asset_events or []
    assert all(isinstance(e, dg.AssetObservation) for e in events)
    return {e.asset_key: {k: v.value for k, v in e.metadata.items()} for e in events}


def _beat_all(sim_workers: Any, topology_id: str, committed: int = 5, **kwargs: Any) -> None:
    for task_id in (*SOURCE_TASKS, *KEYED_TASKS):
        sim_workers.beat(topology_id, task_id, committed_txid=committed + task_id, **kwargs)


def test_all_tasks_beating_is_healthy(
    sensor: dg.SensorDefinition, resources: dict[str, Any], topology_id: str, sim_workers: Any
) -> None:
    _beat_all(sim_workers, topology_id, rows_per_s=10.0, rows_out_per_s=4.5, lag_files=1, state_keys=7, dead_letters=2)

    obs = _by_key(_tick(sensor, resources))

    assert set(obs) == {SOURCE, KEYED}
    source, keyed = obs[SOURCE], obs[KEYED]
    for meta in (source, keyed):
        assert meta["topology_id"] == topology_id
        assert meta["status"] == "ACTIVE"
        assert meta["health"] == meta["topology_health"] == "healthy"
        assert (meta["tasks_alive"], meta["tasks_total"]) == (2, 2)
        assert meta["lost_tasks"] == []
        assert meta["rows_per_s_in"] == pytest.approx(20.0)
        assert meta["rows_per_s_out"] == pytest.approx(9.0)
        assert (meta["lag_files"], meta["state_keys"], meta["dead_letters"]) == (2, 14, 4)
        assert all(0 <= age < 10 for age in meta["heartbeat_age_s"].values())
        assert "txids_committed_since_last_tick" not in meta  # first tick: no previous txids
    assert source["committed_txid"] == {"0": 5, "1": 6}
    assert keyed["committed_txid"] == {"2": 7, "3": 8}
    assert (source["min_committed_txid"], keyed["min_committed_txid"]) == (5, 7)
    assert set(source["heartbeat_age_s"]) == {"0", "1"}
    assert "| 2 | 0 | yes | 127.0.0.1:6700 |" in keyed["tasks"]


def test_lost_heartbeats_degrade_then_down(
    sensor: dg.SensorDefinition, resources: dict[str, Any], topology_id: str, sim_workers: Any
) -> None:
    _beat_all(sim_workers, topology_id)
    sim_workers.kill_task(topology_id, 0)
    sim_workers.beat(topology_id, 3, age_s=60.0)  # a stale heartbeat counts as lost

    first = _tick(sensor, resources)
    obs = _by_key(first)

    assert obs[SOURCE]["health"] == "degraded"
    assert obs[SOURCE]["lost_tasks"] == [0]
    assert obs[SOURCE]["heartbeat_age_s"]["0"] is None
    assert obs[KEYED]["health"] == "degraded"
    assert obs[KEYED]["lost_tasks"] == [3]
    assert obs[KEYED]["heartbeat_age_s"]["3"] >= 60.0
    assert obs[SOURCE]["topology_health"] == "degraded"
    cursor = HeartbeatCursor.parse(first.cursor)
    lost_since = cursor.topologies["wordcount"].lost_since
    assert set(lost_since) == {0, 3}

    for task_id in (1, 2, 3):
        sim_workers.kill_task(topology_id, task_id)
    second = _tick(sensor, resources, cursor=first.cursor)
    obs = _by_key(second)

    assert obs[SOURCE]["health"] == obs[KEYED]["health"] == "down"
    assert (obs[SOURCE]["tasks_alive"], obs[KEYED]["tasks_alive"]) == (0, 0)
    later = HeartbeatCursor.parse(second.cursor).topologies["wordcount"]
    assert set(later.lost_since) == {0, 1, 2, 3}
    assert later.lost_since[0] == lost_since[0]  # first time lost is kept across ticks
    assert later.health == "down"


def test_no_heartbeats_at_all_is_down(
    sensor: dg.SensorDefinition, resources: dict[str, Any], topology_id: str
) -> None:
    obs = _by_key(_tick(sensor, resources))
    assert obs[SOURCE]["health"] == obs[KEYED]["health"] == "down"
    assert obs[SOURCE]["committed_txid"] == {"0": -1, "1": -1}


def test_deactivated_topology_is_inactive(
    sensor: dg.SensorDefinition, resources: dict[str, Any], topology_id: str, zk_store: ZkStore, sim_workers: Any
) -> None:
    _beat_all(sim_workers, topology_id)
    deactivate(zk_store, "wordcount")

    obs = _by_key(_tick(sensor, resources))

    assert obs[SOURCE]["status"] == "INACTIVE"
    assert obs[SOURCE]["health"] == obs[KEYED]["topology_health"] == "inactive"


def test_cursor_reports_txid_progress_between_ticks(
    sensor: dg.SensorDefinition, resources: dict[str, Any], topology_id: str, sim_workers: Any
) -> None:
    _beat_all(sim_workers, topology_id, committed=5)
    first = _tick(sensor, resources)
    stored = HeartbeatCursor.parse(first.cursor)
    assert stored.topologies["wordcount"].committed_txids == {0: 5, 1: 6, 2: 7, 3: 8}
    assert stored.topologies["wordcount"].stages == ("sentences", "count")
    assert HeartbeatCursor.parse(stored.to_json()) == stored

    _beat_all(sim_workers, topology_id, committed=8)  # every task committed 3 more batches
    obs = _by_key(_tick(sensor, resources, cursor=first.cursor))

    assert obs[SOURCE]["txids_committed_since_last_tick"] == 6
    assert obs[KEYED]["txids_committed_since_last_tick"] == 6


def test_garbage_cursor_resets_safely(
    sensor: dg.SensorDefinition, resources: dict[str, Any], topology_id: str, sim_workers: Any
) -> None:
    _beat_all(sim_workers, topology_id)
    for garbage in ("not json", '{"version": 99}', '{"topologies": {"wordcount": 3}}'):
        result = _tick(sensor, resources, cursor=garbage)
        assert set(_by_key(result)) == {SOURCE, KEYED}
        assert HeartbeatCursor.parse(result.cursor).topologies["wordcount"].topology_id == topology_id


def test_resubmission_resets_the_topology_cursor(
    sensor: dg.SensorDefinition, resources: dict[str, Any], topology_id: str, sim_workers: Any
) -> None:
    stale = HeartbeatCursor().with_topology(
        "wordcount", TopologyCursor(topology_id="wordcount-0-1", committed_txids={0: 100}, health="healthy")
    )
    _beat_all(sim_workers, topology_id)

    result = _tick(sensor, resources, cursor=stale.to_json())

    assert "txids_committed_since_last_tick" not in _by_key(result)[SOURCE]
    assert HeartbeatCursor.parse(result.cursor).topologies["wordcount"].topology_id == topology_id


def test_killed_topology_is_marked_inactive_once(
    sensor: dg.SensorDefinition, resources: dict[str, Any], topology_id: str, zk_store: ZkStore, sim_workers: Any
) -> None:
    _beat_all(sim_workers, topology_id)
    first = _tick(sensor, resources)
    kill(zk_store, "wordcount")

    second = _tick(sensor, resources, cursor=first.cursor)
    obs = _by_key(second)
    assert set(obs) == {SOURCE, KEYED}
    assert all(m["status"] == "NOT_SUBMITTED" and m["health"] == "inactive" for m in obs.values())
    assert obs[SOURCE]["topology_id"] == topology_id
    assert HeartbeatCursor.parse(second.cursor).topologies == {}

    third = _tick(sensor, resources, cursor=second.cursor)
    assert not third.asset_events
    assert "no live submission" in str(third.skip_reason)


def test_unreachable_zookeeper_skips_the_tick(sensor: dg.SensorDefinition, resources: dict[str, Any]) -> None:
    unreachable = ZooKeeperResource(hosts=f"127.0.0.1:{free_port()}", connect_timeout_s=0.5, session_timeout_s=1.0)
    result = _tick(sensor, {**resources, "zookeeper": unreachable}, cursor="kept")
    assert "ZooKeeper unavailable" in str(result.skip_reason)
    assert result.cursor is None  # cursor left as it was


def test_tick_budget_defers_the_rest_to_the_next_tick(
    make_wordcount: Any, zk_store: ZkStore, cluster_resource: StreamClusterResource
) -> None:
    names = ["wc_a", "wc_b", "wc_c"]
    for name in names:
        submit(zk_store, cluster_resource.config(), make_wordcount(name=name), workers=1)
    ticks = itertools.count()
    fake_clock = lambda: float(next(ticks))  # noqa: E731 - each call advances one second
    kwargs: dict[str, Any] = dict(
        topology_names=names, translator=StreamOpsTranslator(), heartbeat_timeout_s=10.0, tick_budget_s=2.5
    )

    first = observe_tick(zk_store, HeartbeatCursor(), clock=fake_clock, **kwargs)
    assert first.observed == ["wc_a", "wc_b"]
    assert first.deferred == ["wc_c"]

    ticks = itertools.count()
    second = observe_tick(zk_store, first.cursor, clock=fake_clock, **kwargs)
    assert second.observed[0] == "wc_c"  # least recently observed goes first
    assert set(second.cursor.topologies) == set(names)


def test_observations_are_recorded_in_the_instance(
    sensor: dg.SensorDefinition, resources: dict[str, Any], topology_id: str, sim_workers: Any
) -> None:
    _beat_all(sim_workers, topology_id)
    with dg.DagsterInstance.ephemeral() as instance:
        result = _tick(sensor, resources, instance=instance)
        # What the sensor daemon does with a SensorResult's asset events.
        for event in result.asset_events or []:
            instance.report_runless_asset_event(event)
        sim_workers.kill_task(topology_id, 0)
        for event in _tick(sensor, resources, cursor=result.cursor, instance=instance).asset_events or []:
            instance.report_runless_asset_event(event)

        records = instance.fetch_observations(SOURCE, limit=10).records
        assert len(records) == 2
        newest, oldest = (r.asset_observation for r in records)
        assert newest is not None and oldest is not None
        assert newest.metadata["health"].value == "degraded"
        assert oldest.metadata["health"].value == "healthy"
        assert newest.metadata["topology_id"].value == topology_id
        assert len(instance.fetch_observations(KEYED, limit=10).records) == 2


def test_definitions_wire_sensor_assets_and_resources(
    wordcount: Topology,
    zookeeper_resource: ZooKeeperResource,
    cluster_resource: StreamClusterResource,
    topology_id: str,
    sim_workers: Any,
) -> None:
    defs = build_definitions(topologies=[wordcount], zookeeper=zookeeper_resource, stream_cluster=cluster_resource)
    defs.validate_loadable(defs)
    keys = {k for k in defs.resolve_all_asset_keys()}
    assert keys == {dg.AssetKey(["stream_ops", "wordcount", "submission"]), SOURCE, KEYED}
    sensor_def = defs.resolve_sensor_def("stream_ops_heartbeat_sensor")
    assert sensor_def.default_status == dg.DefaultSensorStatus.RUNNING
    assert sensor_def.minimum_interval_seconds == 5

    _beat_all(sim_workers, topology_id)
    with dg.build_sensor_context(resources=defs.resources, definitions=defs) as context:
        result = sensor_def(context)
    assert {e.asset_key for e in result.asset_events} == {SOURCE, KEYED}


def test_sensor_factory_validates_arguments() -> None:
    with pytest.raises(ValueError, match="at least one topology"):
        build_heartbeat_sensor(topology_names=[])
    with pytest.raises(ValueError, match="duplicates"):
        build_heartbeat_sensor(topology_names=["a", "a"])
    with pytest.raises(ValueError, match="must be positive"):
        build_heartbeat_sensor(topology_names=["a"], heartbeat_timeout_s=0)


def test_unreadable_topology_is_reported_not_fatal(
    sensor: dg.SensorDefinition, resources: dict[str, Any], topology_id: str, zk_store: ZkStore
) -> None:
    zk_store.create_json(ZkPaths.heartbeat(topology_id, 0), {"unexpected": True})

    result = _tick(sensor, resources)

    assert not result.asset_events
    assert "could not read wordcount" in str(result.skip_reason)
