"""Asset checks executed in a run (from ZooKeeper + observation history) and resource settings."""

from __future__ import annotations

import sys
from typing import Any

import dagster as dg
import pytest

from stream_ops.config import QueryConfig
from stream_ops.coordination.store import ZkStore
from stream_ops.dsl.streams import Topology
from stream_ops.nimbus.status import TaskStatus
from stream_ops.nimbus.submission import submit
from stream_ops.orchestration import (
    StreamClusterResource,
    build_definitions,
    build_heartbeat_sensor,
    pyspark_resource,
    topology_assets,
)
from stream_ops.orchestration.checks import stalled_from_observations
from stream_ops.spark.jvm_classes import jvm_classes_jar

SOURCE = dg.AssetKey(["stream_ops", "wordcount", "sentences"])
KEYED = dg.AssetKey(["stream_ops", "wordcount", "count"])


def _beat_all(sim_workers: Any, topology_id: str, committed: int, **kwargs: Any) -> None:
    for task_id in range(4):
        sim_workers.beat(topology_id, task_id, committed_txid=committed, **kwargs)


def _run_checks(
    wordcount: Topology, resources: dict[str, Any], instance: dg.DagsterInstance, progress_timeout_s: float = 30.0
) -> dict[tuple[str, str], Any]:
    definitions = topology_assets(topology=wordcount, heartbeat_timeout_s=10.0, progress_timeout_s=progress_timeout_s)
    defs = dg.Definitions(
        assets=definitions.stream_specs,
        asset_checks=definitions.asset_checks,
        jobs=[dg.define_asset_job("checks", selection=dg.AssetSelection.checks_for_assets(SOURCE, KEYED))],
        resources=resources,
    )
    result = defs.resolve_job_def("checks").execute_in_process(instance=instance)
    assert result.success
    return {(e.asset_key.path[-1], e.check_name): e for e in result.get_asset_check_evaluations()}


def test_checks_executed_in_a_run_read_zookeeper_and_the_observation_history(
    wordcount: Topology,
    resources: dict[str, Any],
    zk_store: ZkStore,
    cluster_resource: StreamClusterResource,
    sim_workers: Any,
) -> None:
    topology_id = submit(zk_store, cluster_resource.config(), wordcount, workers=2)
    _beat_all(sim_workers, topology_id, committed=5, lag_files=2)
    sensor = build_heartbeat_sensor(topology_names=["wordcount"])
    with dg.DagsterInstance.ephemeral() as instance:
        with dg.build_sensor_context(resources={"zookeeper": resources["zookeeper"]}, instance=instance) as context:
            observed = sensor(context)
        # Record the tick's observations as the sensor daemon does.
        for event in observed.asset_events or []:
            if isinstance(event, dg.AssetObservation):
                instance.report_runless_asset_event(event)

        fresh = _run_checks(wordcount, resources, instance)
        assert set(fresh) == {(s, c) for s in ("sentences", "count") for c in ("heartbeat_freshness", "txid_progress")}
        assert all(e.passed for e in fresh.values())  # the same txids were observed only a moment ago

        # With lag and no commit since that observation, a short enough limit is exceeded.
        stalled = _run_checks(wordcount, resources, instance, progress_timeout_s=0.001)
        progress = stalled[("count", "txid_progress")]
        assert not progress.passed and progress.severity == dg.AssetCheckSeverity.WARN
        assert set(progress.metadata["stalled_tasks"].value) == {"2", "3"}

        sim_workers.kill_task(topology_id, 0)
        later = _run_checks(wordcount, resources, instance)
        assert not later[("sentences", "heartbeat_freshness")].passed
        assert later[("sentences", "heartbeat_freshness")].metadata["lost_tasks"].value == [0]
        assert later[("count", "heartbeat_freshness")].passed


def test_stalled_time_comes_from_the_oldest_observation_with_the_same_txid() -> None:
    def task(task_id: int, committed: int) -> TaskStatus:
        return TaskStatus(
            task_id=task_id,
            stage=0,
            stage_name="s",
            queue=task_id,
            assigned_to="w",
            owner="w",
            owner_epoch=1,
            heartbeat_age_s=0.1,
            committed_txid=committed,
            txid_in_flight=None,
            rows_per_s=0,
            rows_out_per_s=0,
            lag_files=3,
            state_keys=0,
            dead_letters=0,
        )

    history = [  # newest first
        (100.0, {"topology_id": "t-1", "committed_txid": {"0": 7, "1": 4}}),
        (90.0, {"topology_id": "t-1", "committed_txid": {"0": 7, "1": 3}}),
        (80.0, {"topology_id": "t-1", "committed_txid": {"0": 7, "1": 3}}),
        (70.0, {"topology_id": "t-0", "committed_txid": {"0": 7, "1": 3}}),  # another submission
    ]
    stalled = stalled_from_observations([task(0, 7), task(1, 5), task(2, 1)], history, topology_id="t-1", now=130.0)
    assert stalled == {0: 50.0, 1: 0.0, 2: None}


def test_cluster_resource_maps_worker_settings_and_spark_config() -> None:
    cluster = StreamClusterResource(
        root="/srv/so",
        trigger_seconds=0.5,
        heartbeat_interval_s=1.5,
        spark_master="local[2]",
        spark_conf={"spark.sql.shuffle.partitions": "4"},
        worker_host="10.0.0.5",
    )
    settings = cluster.worker_settings(port=6712, launched_by="dagster:run-1")
    assert (settings.worker_id, settings.trigger_seconds, settings.heartbeat_interval_s) == ("10.0.0.5:6712", 0.5, 1.5)
    assert (settings.spark_master, settings.launched_by) == ("local[2]", "dagster:run-1")
    assert settings.query == QueryConfig()  # the token is derived from the ZooKeeper credentials
    spark = pyspark_resource(cluster).spark_config
    assert spark["spark.master"] == "local[2]"
    assert spark["spark.sql.shuffle.partitions"] == "4"  # overrides stream_ops' default
    assert spark["spark.pyspark.python"] == sys.executable
    # stream_ops' JVM classes (the shuffle-queue source among them) are on the driver's class
    # path, as for CLI workers: a Dagster worker runs the tasks they started
    assert spark["spark.driver.extraClassPath"].endswith(str(jvm_classes_jar()))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"heartbeat_interval_s": 0}, "heartbeat_interval_s: Input should be greater than 0"),
        ({"worker_capacity": 0}, "worker_capacity: Input should be greater than or equal to 1"),
        ({"max_files_per_trigger": 0}, "max_files_per_trigger"),
        ({"dist_dir": ""}, "dist_dir must be a directory path"),
        ({"query_token": "too-short"}, "query_token: the query token must be at least 16"),
        ({"query_tls_cert": "/etc/so/worker.pem"}, "give both tls_cert and tls_key"),
    ],
)
def test_cluster_resource_validation_names_the_field(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(Exception, match=message):
        StreamClusterResource(**kwargs)


def test_cluster_resource_gives_workers_the_query_token_and_tls() -> None:
    token = "a-query-token-for-dagster-workers"
    cluster = StreamClusterResource(
        query_token=token,
        query_tls_cert="/etc/so/worker.pem",
        query_tls_key="/etc/so/worker.key",
        query_tls_ca="/etc/so/ca.pem",
    )
    query = cluster.worker_settings(port=6712).query
    assert query.token is not None and query.token.get_secret_value() == token
    assert (str(query.tls_cert), str(query.tls_key), str(query.tls_ca)) == (
        "/etc/so/worker.pem",
        "/etc/so/worker.key",
        "/etc/so/ca.pem",
    )
    assert query == cluster.query_config()
    assert token not in repr(cluster) and token not in repr(query)
    with pytest.raises(Exception) as caught:
        StreamClusterResource(query_token="short-secret")
    assert "short-secret" not in str(caught.value)


def test_definitions_bind_spark_only_to_worker_runs(wordcount: Topology, resources: dict[str, Any]) -> None:
    defs = build_definitions(
        topologies=[wordcount],
        zookeeper=resources["zookeeper"],
        stream_cluster=resources["stream_cluster"],
        schedule_status=dg.DefaultScheduleStatus.RUNNING,
    )
    defs.validate_loadable(defs)
    assert set(defs.resources) == {"zookeeper", "stream_cluster", "pyspark"}
    assert {s.name: s.default_status for s in defs.schedules} == {
        "stream_ops_rebalance_wordcount": dg.DefaultScheduleStatus.RUNNING,
        "stream_ops_compact_state_wordcount": dg.DefaultScheduleStatus.RUNNING,
    }
    assert {s.name for s in defs.sensors} == {"stream_ops_heartbeat_sensor", "stream_ops_worker_relaunch_sensor"}
    assert {j.name for j in defs.resolve_all_job_defs()} >= {
        "stream_ops_worker",
        "stream_ops_rebalance",
        "stream_ops_activate",
        "stream_ops_deactivate",
        "stream_ops_kill",
        "stream_ops_compact_state",
    }
    heartbeat = defs.resolve_sensor_def("stream_ops_heartbeat_sensor")
    # The observe job is a target it never requests: it makes the UI list the sensor on the stream assets.
    assert {t.job_name for t in heartbeat.targets} == {"stream_ops_rebalance", "stream_ops_worker", "stream_ops_observe"}
