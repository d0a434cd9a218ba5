"""The health overview, on-demand observation and plotted metrics against a real ZooKeeper.

Workers are simulated (``sim_workers``); the Dagster instance is ephemeral.
"""

from __future__ import annotations

from typing import Any

import dagster as dg

from stream_ops.coordination.store import ZkStore
from stream_ops.dsl.streams import Topology
from stream_ops.nimbus.submission import submit
from stream_ops.orchestration import (
    OBSERVE_JOB_NAME,
    TOPOLOGY_HEALTH,
    StreamClusterResource,
    ZooKeeperResource,
    build_definitions,
)

SOURCE = dg.AssetKey(["stream_ops", "wordcount", "sentences"])
KEYED = dg.AssetKey(["stream_ops", "wordcount", "count"])
HEALTH = dg.AssetKey(["stream_ops", "wordcount", "health"])


def _defs(wordcount: Topology, zookeeper: ZooKeeperResource, cluster: StreamClusterResource) -> dg.Definitions:
    return build_definitions(topologies=[wordcount], zookeeper=zookeeper, stream_cluster=cluster, repair=False)


def _tick(defs: dg.Definitions, instance: dg.DagsterInstance, cursor: str | None = None) -> dg.SensorResult:
    sensor = defs.resolve_sensor_def("stream_ops_heartbeat_sensor")
    assert defs.resources is not None
    with dg.build_sensor_context(
        resources={"zookeeper": defs.resources["zookeeper"]}, definitions=defs, instance=instance, cursor=cursor
    ) as context:
        result = sensor(context)
    assert isinstance(result, dg.SensorResult)
    return result


def test_the_sensor_reports_the_health_table_and_check_every_tick(
    wordcount: Topology,
    zookeeper_resource: ZooKeeperResource,
    cluster_resource: StreamClusterResource,
    zk_store: ZkStore,
    sim_workers: Any,
) -> None:
    topology_id = submit(zk_store, cluster_resource.config(), wordcount, workers=2)
    sim_workers.register()
    for task_id in range(4):
        sim_workers.beat(topology_id, task_id, committed_txid=7 + task_id, rows_per_s=3.0, lag_files=1, dead_letters=2)
    defs = _defs(wordcount, zookeeper_resource, cluster_resource)
    with dg.DagsterInstance.ephemeral() as instance:
        first = _tick(defs, instance)
        (report,) = [e for e in first.asset_events or [] if isinstance(e, dg.AssetMaterialization)]
        assert report.asset_key == HEALTH
        meta = report.metadata
        assert meta["health"].value == "healthy" and meta["topology_id"].value == topology_id
        rows = [r.data for r in meta["tasks"].value.records]  # type: ignore[attr-defined]
        assert [(r["task"], r["owner"], r["committed_txid"], r["lag_files"]) for r in rows] == [
            (task_id, "127.0.0.1:6700", 7 + task_id, 1) for task_id in range(4)
        ]
        assert all(r["heartbeat_age_s"] is not None and r["alive"] for r in rows)
        assert isinstance(meta["max_committed_txid"], dg.IntMetadataValue) and meta["max_committed_txid"].value == 10
        assert isinstance(meta["dead_letters"], dg.IntMetadataValue) and meta["dead_letters"].value == 8
        (check,) = [e for e in first.asset_events or [] if isinstance(e, dg.AssetCheckEvaluation) and e.asset_key == HEALTH]
        assert (check.check_name, check.passed) == (TOPOLOGY_HEALTH, True)

        # Every task's worker dies: down, and the check fails with severity ERROR.
        for task_id in range(4):
            sim_workers.kill_task(topology_id, task_id)
        down = _tick(defs, instance, cursor=first.cursor)
        (report,) = [e for e in down.asset_events or [] if isinstance(e, dg.AssetMaterialization)]
        assert report.metadata["health"].value == "down"
        assert report.description is not None and report.description.startswith("down")
        (check,) = [e for e in down.asset_events or [] if isinstance(e, dg.AssetCheckEvaluation) and e.asset_key == HEALTH]
        assert (check.passed, check.severity) == (False, dg.AssetCheckSeverity.ERROR)


def test_observe_job_and_health_asset_read_zookeeper_on_demand(
    wordcount: Topology,
    zookeeper_resource: ZooKeeperResource,
    cluster_resource: StreamClusterResource,
    zk_store: ZkStore,
    sim_workers: Any,
) -> None:
    topology_id = submit(zk_store, cluster_resource.config(), wordcount, workers=2)
    sim_workers.register()
    for task_id in range(4):
        sim_workers.beat(topology_id, task_id, committed_txid=4, rows_per_s=1.5, rows_out_per_s=0.5)
    defs = _defs(wordcount, zookeeper_resource, cluster_resource)
    with dg.DagsterInstance.ephemeral() as instance:
        observed = defs.resolve_job_def(OBSERVE_JOB_NAME).execute_in_process(instance=instance)
        assert observed.success
        for key in (SOURCE, KEYED):
            (record,) = instance.fetch_observations(key, limit=5).records
            observation = record.asset_observation
            assert observation is not None
            meta = observation.metadata
            assert meta["topology_id"].value == topology_id and meta["health"].value == "healthy"
            # What the Plots tab draws: numbers, not text.
            for name in ("rows_per_s_in", "rows_per_s_out", "max_heartbeat_age_s"):
                assert isinstance(meta[name], dg.FloatMetadataValue), name
            for name in ("lag_records", "min_committed_txid", "max_committed_txid", "dead_letters", "tasks_alive"):
                assert isinstance(meta[name], dg.IntMetadataValue), name
            assert meta["rows_per_s_in"].value == 3.0 and meta["max_committed_txid"].value == 4

        materialized = defs.resolve_implicit_global_asset_job_def().execute_in_process(
            instance=instance, asset_selection=[HEALTH]
        )
        assert materialized.success
        (event,) = materialized.get_asset_materialization_events()
        metadata = event.materialization.metadata
        assert metadata["health"].value == "healthy" and metadata["tasks_total"].value == 4
        (evaluation,) = materialized.get_asset_check_evaluations()
        assert (evaluation.check_name, evaluation.passed) == (TOPOLOGY_HEALTH, True)
