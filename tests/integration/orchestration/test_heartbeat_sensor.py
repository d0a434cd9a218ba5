"""The heartbeat sensor against a real ZooKeeper, with simulated task heartbeats."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import dagster as dg
import pytest

from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.dsl.streams import Topology
from stream_ops.nimbus.assignment import read_assignment
from stream_ops.nimbus.submission import deactivate, kill, submit
from stream_ops.orchestration import (
    HeartbeatCursor,
    StreamClusterResource,
    StreamOpsTranslator,
    TopologyCursor,
    ZooKeeperResource,
    build_definitions,
    build_heartbeat_sensor,
    build_jobs,
    observe_tick,
    rebalance_run_key,
    workers_to_launch,
)
from stream_ops.ports import free_port

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


def _tick(sensor: dg.SensorDefinition, resources: dict[str, Any], cursor: str | None = None, **kwargs: Any) -> dg.SensorResult:
    with dg.build_sensor_context(resources=resources, cursor=cursor, **kwargs) as context:
        result = sensor(context)
    assert isinstance(result, dg.SensorResult)
    assert not result.run_requests
    return result


def _by_key(result: dg.SensorResult) -> dict[dg.AssetKey, dict[str, Any]]:
    """Observation metadata values by asset key."""
    events = result.asset_events or []
    assert all(isinstance(e, (dg.AssetObservation, dg.AssetCheckEvaluation)) for e in events)
    return {e.asset_key: {k: v.value for k, v in e.metadata.items()} for e in events if isinstance(e, dg.AssetObservation)}


def _checks(result: dg.SensorResult) -> dict[tuple[dg.AssetKey, str], dg.AssetCheckEvaluation]:
    """Check evaluations by (asset key, check name)."""
    return {(e.asset_key, e.check_name): e for e in result.asset_events or [] if isinstance(e, dg.AssetCheckEvaluation)}


def _beat_all(sim_workers: Any, topology_id: str, committed: int = 5, **kwargs: Any) -> None:
    for task_id in (*SOURCE_TASKS, *KEYED_TASKS):
        sim_workers.beat(topology_id, task_id, committed_txid=committed + task_id, **kwargs)


def _unchanged_for(cursor: str | None, seconds: float, tasks: tuple[int, ...] = (*SOURCE_TASKS, *KEYED_TASKS)) -> str:
    """The cursor as if the sensor had seen ``tasks``' current heartbeats ``seconds`` earlier
    (what ticks over that time would have left in it, without sleeping)."""
    entry = HeartbeatCursor.parse(cursor).topologies["wordcount"]
    beats = {t: (fp, at - seconds if t in tasks else at) for t, (fp, at) in entry.heartbeats.items()}
    return HeartbeatCursor().with_topology("wordcount", entry.model_copy(update={"heartbeats": beats})).to_json()


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
    seen = _tick(sensor, resources)
    sim_workers.kill_task(topology_id, 0)
    # Task 3's heartbeat stays as the sensor saw it 60 s ago: stale by the sensor's clock.
    first = _tick(sensor, resources, cursor=_unchanged_for(seen.cursor, 60.0, tasks=(3,)))
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


def test_no_heartbeats_at_all_is_down(sensor: dg.SensorDefinition, resources: dict[str, Any], topology_id: str) -> None:
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
            instance.report_runless_asset_event(event)  # observations and check evaluations alike
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
    assert keys == {
        dg.AssetKey(["stream_ops", "wordcount", "submission"]),
        SOURCE,
        KEYED,
        dg.AssetKey(["stream_ops", "wordcount", "count_state"]),
        dg.AssetKey(["stream_ops", "wordcount", "health"]),
        dg.AssetKey(["stream_ops", "topic", "input", "sentences"]),
    }
    sensor_def = defs.resolve_sensor_def("stream_ops_heartbeat_sensor")
    assert sensor_def.default_status == dg.DefaultSensorStatus.RUNNING
    assert sensor_def.minimum_interval_seconds == 5

    _beat_all(sim_workers, topology_id)
    # What the sensor daemon builds: only the resources the sensor requires (no SparkSession).
    assert sensor_def.required_resource_keys == {"zookeeper"}
    with dg.build_sensor_context(resources={"zookeeper": defs.resources["zookeeper"]}, definitions=defs) as context:
        result = sensor_def(context)
    health = dg.AssetKey(["stream_ops", "wordcount", "health"])
    assert {e.asset_key for e in result.asset_events} == {SOURCE, KEYED, health}
    (report,) = [e for e in result.asset_events if isinstance(e, dg.AssetMaterialization)]
    assert report.asset_key == health and report.metadata["health"].value == "healthy"
    assert {k.name for k in defs.resolve_asset_graph().asset_check_keys} == {
        "heartbeat_freshness",
        "txid_progress",
        "topology_health",
    }


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


# --- asset checks ---------------------------------------------------------------------------------


def test_checks_pass_while_healthy_and_fail_with_lost_heartbeats(
    sensor: dg.SensorDefinition, resources: dict[str, Any], topology_id: str, sim_workers: Any
) -> None:
    _beat_all(sim_workers, topology_id)
    healthy = _checks(_tick(sensor, resources))
    assert set(healthy) == {(k, c) for k in (SOURCE, KEYED) for c in ("heartbeat_freshness", "txid_progress")}
    assert all(e.passed for e in healthy.values())

    sim_workers.kill_task(topology_id, 0)
    degraded = _checks(_tick(sensor, resources))
    freshness = degraded[(SOURCE, "heartbeat_freshness")]
    assert not freshness.passed
    assert freshness.severity == dg.AssetCheckSeverity.WARN
    assert freshness.metadata["lost_tasks"].value == [0]
    assert "rebalance" in str(freshness.description)
    assert degraded[(KEYED, "heartbeat_freshness")].passed

    sim_workers.kill_task(topology_id, 1)
    down = _checks(_tick(sensor, resources))
    assert down[(SOURCE, "heartbeat_freshness")].severity == dg.AssetCheckSeverity.ERROR


def test_txid_progress_fails_when_input_waits_and_nothing_commits(
    resources: dict[str, Any], topology_id: str, sim_workers: Any
) -> None:
    sensor = build_heartbeat_sensor(topology_names=["wordcount"], progress_timeout_s=30.0)
    _beat_all(sim_workers, topology_id, committed=5, lag_files=3)
    first = _tick(sensor, resources)
    assert _checks(first)[(SOURCE, "txid_progress")].passed  # first sight counts as progress
    # Pretend the previous tick saw the same txids advance 100 s ago.
    entry = HeartbeatCursor.parse(first.cursor).topologies["wordcount"]
    old = entry.model_copy(update={"advanced_at": {t: at - 100 for t, at in entry.advanced_at.items()}})
    stalled_cursor = HeartbeatCursor().with_topology("wordcount", old).to_json()

    stalled = _checks(_tick(sensor, resources, cursor=stalled_cursor))
    check = stalled[(SOURCE, "txid_progress")]
    assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN
    assert set(check.metadata["stalled_tasks"].value) == {"0", "1"}

    _beat_all(sim_workers, topology_id, committed=5, lag_files=0)  # idle, nothing to commit
    assert _checks(_tick(sensor, resources, cursor=stalled_cursor))[(SOURCE, "txid_progress")].passed
    _beat_all(sim_workers, topology_id, committed=6, lag_files=3)  # committed since
    assert _checks(_tick(sensor, resources, cursor=stalled_cursor))[(SOURCE, "txid_progress")].passed


def test_inactive_topology_passes_its_checks(
    sensor: dg.SensorDefinition, resources: dict[str, Any], topology_id: str, zk_store: ZkStore
) -> None:
    deactivate(zk_store, "wordcount")
    checks = _checks(_tick(sensor, resources))
    assert all(e.passed and "INACTIVE" in str(e.description) for e in checks.values())


# --- run requests ---------------------------------------------------------------------------------


@pytest.fixture
def jobs() -> Any:
    return build_jobs(topology_names=["wordcount"])


def _repair_sensor(jobs: Any, **kwargs: Any) -> dg.SensorDefinition:
    return build_heartbeat_sensor(
        topology_names=["wordcount"],
        heartbeat_timeout_s=10.0,
        rebalance_job=jobs.rebalance,
        worker_job=jobs.worker,
        **kwargs,
    )


def _requests(
    sensor: dg.SensorDefinition, resources: dict[str, Any], cursor: str | None = None, **kwargs: Any
) -> dg.SensorResult:
    with dg.build_sensor_context(resources=resources, cursor=cursor, **kwargs) as context:
        result = sensor(context)
    assert isinstance(result, dg.SensorResult)
    return result


def test_lost_tasks_request_a_rebalance_naming_them(
    jobs: Any, resources: dict[str, Any], topology_id: str, sim_workers: Any
) -> None:
    sim_workers.register()
    sensor = _repair_sensor(jobs, launch_grace_s=0.0)
    _beat_all(sim_workers, topology_id)
    assert not _requests(sensor, resources).run_requests

    first = _requests(sensor, resources)
    sim_workers.kill_task(topology_id, 0)
    result = _requests(sensor, resources, cursor=_unchanged_for(first.cursor, 60.0, tasks=(3,)))

    [request] = result.run_requests
    assert request.job_name == "stream_ops_rebalance"
    assert request.run_key == f"rebalance-{topology_id}-tasks-0-3-epoch-0-slots-2"
    config = request.run_config["ops"]["rebalance_topology"]["config"]
    assert config["topology"] == topology_id
    assert config["lost_tasks"] == [0, 3]
    heartbeat_3 = HeartbeatCursor.parse(first.cursor).topologies["wordcount"].heartbeats[3][0]
    assert config["lost_heartbeats"] == {"0": -1, "3": heartbeat_3}  # what the sensor saw: none, and the stale one
    assert request.tags["stream_ops/topology"] == "wordcount"
    assert rebalance_run_key(topology_id, [3, 0], 0, 2) == request.run_key


def test_a_fresh_assignment_gets_its_launch_grace(
    jobs: Any, resources: dict[str, Any], topology_id: str, sim_workers: Any
) -> None:
    sim_workers.register()
    sensor = _repair_sensor(jobs, launch_grace_s=60.0)
    # Nothing beats yet: a new submission's tasks are starting.
    first = _requests(sensor, resources)
    assert not first.run_requests
    assert _by_key(first)[SOURCE]["health"] == "down"

    # The same epoch, seen long enough ago: now the loss counts.
    entry = HeartbeatCursor.parse(first.cursor).topologies["wordcount"]
    aged = HeartbeatCursor().with_topology("wordcount", entry.model_copy(update={"epoch_seen_at": entry.epoch_seen_at - 61}))
    [request] = _requests(sensor, resources, cursor=aged.to_json()).run_requests
    assert request.run_key == f"rebalance-{topology_id}-tasks-0-1-2-3-epoch-0-slots-2"


def test_missing_workers_are_launched_once(jobs: Any, resources: dict[str, Any], topology_id: str, sim_workers: Any) -> None:
    sim_workers.register(("127.0.0.1:6700",))  # the topology wants 2
    _beat_all(sim_workers, topology_id)
    sensor = _repair_sensor(jobs)
    with dg.DagsterInstance.ephemeral() as instance:
        [launch] = _requests(sensor, resources, instance=instance).run_requests
        assert launch.job_name == "stream_ops_worker"
        assert launch.tags["stream_ops/role"] == "worker"

        # A worker run already created (not started, so not registered yet) covers the missing worker.
        instance.create_run_for_job(jobs.worker, run_config={})  # NOT_STARTED
        assert not _requests(sensor, resources, instance=instance).run_requests


def test_workers_to_launch_counts_registered_runs_once() -> None:
    from stream_ops.coordination.records import WorkerRecord

    def worker(port: int, launched_by: str) -> WorkerRecord:
        return WorkerRecord(
            worker_id=f"h:{port}", host="h", port=port, pid=1, capacity=1, started_at=0, launched_by=launched_by, tls=False
        )

    live = {"h:1": worker(1, "dagster:run-a"), "h:2": worker(2, "cli")}
    assert workers_to_launch(4, live, ["run-a"]) == 2  # run-a is already one of the live workers
    assert workers_to_launch(4, live, ["run-a", "run-b"]) == 1
    assert workers_to_launch(1, live, []) == 0


# --- one liveness rule: the sensor's own clock, never the worker's --------------------------------


@pytest.mark.parametrize("skew_s", [60.0, -60.0])
def test_a_skewed_worker_clock_changes_nothing_for_the_sensor(
    sensor: dg.SensorDefinition, resources: dict[str, Any], topology_id: str, sim_workers: Any, skew_s: float
) -> None:
    # age_s is how far behind the worker's clock stamps the beat: +60 behind, -60 ahead.
    _beat_all(sim_workers, topology_id, age_s=skew_s)
    first = _tick(sensor, resources)
    assert {m["health"] for m in _by_key(first).values()} == {"healthy"}
    assert {m["heartbeat_age_basis"] for m in _by_key(first).values()} == {"observed"}

    _beat_all(sim_workers, topology_id, age_s=skew_s)  # it keeps beating (9 s after the sensor's last look)
    again = _tick(sensor, resources, cursor=_unchanged_for(first.cursor, 9.0))
    beating = _by_key(again)
    assert {m["health"] for m in beating.values()} == {"healthy"}
    assert all(age == 0.0 for m in beating.values() for age in m["heartbeat_age_s"].values())

    # It stops: the heartbeats the sensor saw last are now 11 s unchanged by the sensor's clock.
    second = _tick(sensor, resources, cursor=_unchanged_for(again.cursor, 11.0))
    stopped = _by_key(second)
    assert {m["health"] for m in stopped.values()} == {"down"}
    assert all(age >= 11.0 for m in stopped.values() for age in m["heartbeat_age_s"].values())
    assert not _checks(second)[(SOURCE, "heartbeat_freshness")].passed


# --- spreading -------------------------------------------------------------------------------------


def _slots_seen_earlier(cursor: str | None, seconds: float) -> str:
    """The cursor as if the sensor had seen the current slots ``seconds`` earlier."""
    parsed = HeartbeatCursor.parse(cursor)
    slots = {slot: (identity, at - seconds) for slot, (identity, at) in parsed.slots.items()}
    return parsed.model_copy(update={"slots": slots}).to_json()


def test_a_crowded_topology_is_spread_once_a_joined_slot_is_stable(
    jobs: Any,
    resources: dict[str, Any],
    wordcount: Topology,
    zk_store: ZkStore,
    cluster_resource: StreamClusterResource,
    sim_workers: Any,
) -> None:
    sim_workers.register(("127.0.0.1:6700",))
    topology_id = submit(zk_store, cluster_resource.config(), wordcount, workers=2)
    assert set(read_assignment(zk_store, topology_id)[0].tasks.values()) == {"127.0.0.1:6700"}  # type: ignore[index]
    _beat_all(sim_workers, topology_id)
    sensor = _repair_sensor(jobs)
    sim_workers.register(("127.0.0.1:6701",))  # a second worker joins

    first = _requests(sensor, resources)
    assert not first.run_requests  # 6701 was just seen: not stable yet
    assert set(HeartbeatCursor.parse(first.cursor).slots) == {"127.0.0.1:6700", "127.0.0.1:6701"}

    second = _requests(sensor, resources, cursor=_slots_seen_earlier(first.cursor, 6.0))
    [request] = second.run_requests
    assert request.job_name == "stream_ops_rebalance"
    assert request.run_key == f"spread-{topology_id}-epoch-0-slots-2"
    config = request.run_config["ops"]["rebalance_topology"]["config"]
    assert config["spread_slots"] == ["127.0.0.1:6700", "127.0.0.1:6701"]
    assert "lost_tasks" not in config

    # Rate limit: until the run changed anything, the next ticks within the interval ask nothing.
    assert not _requests(sensor, resources, cursor=second.cursor).run_requests

    # What the daemon would launch: the op spreads with the library function the nimbus uses.
    result = jobs.rebalance.execute_in_process(run_config=request.run_config, resources=resources)
    assert result.success
    assert result.output_for_node("rebalance_topology")["how"] == "spread"
    tasks = read_assignment(zk_store, topology_id)[0].tasks  # type: ignore[index]
    assert sorted(Counter(tasks.values()).values()) == [2, 2]
    assert not _requests(sensor, resources, cursor=_slots_seen_earlier(second.cursor, 60.0)).run_requests
