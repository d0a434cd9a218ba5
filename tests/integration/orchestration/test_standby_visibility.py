"""Standby replicas are visible where operators look: /assignments, the topology status (CLI)
and the stream assets' observations, each with how many committed txids it is behind."""

from __future__ import annotations

import time

from click.testing import CliRunner

from stream_ops.cli import main
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import StandbyRecord
from stream_ops.dsl.build_plan import build_plan
from stream_ops.nimbus.assignment import read_assignment
from stream_ops.nimbus.status import describe_topology
from stream_ops.nimbus.submission import submit
from stream_ops.orchestration import observe_topology


def test_standbys_show_in_the_assignment_the_status_and_the_observations(
    zk_store, zk_config, sim_workers, wordcount, cluster_resource
):
    sim_workers.register()
    topology_id = submit(zk_store, cluster_resource.config(), wordcount, workers=2, standby_replicas=1)
    plan = build_plan(wordcount)
    keyed = [t.task_id for t in plan.tasks if plan.stage(t.stage).keeps_state]
    record = read_assignment(zk_store, topology_id)[0]
    assert sorted(record.standbys) == keyed  # only the stateful tasks have standbys
    for task_id in keyed:
        (standby,) = record.standbys[task_id]
        assert standby != record.tasks[task_id]
        sim_workers.beat(topology_id, task_id, worker_id=record.tasks[task_id], committed_txid=7)
    reporting, silent = keyed[0], keyed[1]
    worker = record.standbys[reporting][0]
    progress = StandbyRecord(worker_id=worker, applied_txid=5, applied_epoch=1, time=time.time(), keys=42)
    zk_store.ensure_path(ZkPaths.standbys(topology_id))
    zk_store.create_json(ZkPaths.standby(topology_id, reporting, worker), progress.to_json_obj(), ephemeral=True)

    status = describe_topology(zk_store, topology_id)
    by_task = {t.task_id: t for t in status.tasks}
    assert [(s.worker_id, s.applied_txid, s.lag_txids, s.keys) for s in by_task[reporting].standbys] == [(worker, 5, 2, 42)]
    assert [(s.applied_txid, s.lag_txids) for s in by_task[silent].standbys] == [(None, None)]

    (keyed_obs,) = [o for o in observe_topology(status) if o.asset_key.path[-1] == "count"]
    shown = keyed_obs.metadata["standbys"].value
    assert shown[str(reporting)] == [{"worker": worker, "applied_txid": 5, "lag_txids": 2}]
    assert f"{worker} (lag 2)" in keyed_obs.metadata["tasks"].value

    result = CliRunner().invoke(
        main,
        ["--zookeeper", zk_config.hosts, "--chroot", zk_config.chroot, "--home", cluster_resource.root, "status", "wordcount"],
        catch_exceptions=False,
    )
    assert f"task {reporting} standbys: {worker} (lag 2)" in result.output, result.output
