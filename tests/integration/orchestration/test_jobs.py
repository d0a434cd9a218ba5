"""The Nimbus-verb jobs and the schedules against a real ZooKeeper (workers simulated)."""

from __future__ import annotations

import threading
from typing import Any

import dagster as dg
import pytest

from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.dsl.streams import Topology
from stream_ops.nimbus.assignment import read_assignment
from stream_ops.nimbus.status import describe_topology
from stream_ops.nimbus.submission import find_topology_id, read_storm, submit
from stream_ops.orchestration import (
    StreamClusterResource,
    build_compaction_schedule,
    build_jobs,
    build_rebalance_schedule,
    rebalance_run_config,
)

WORKERS = ("127.0.0.1:6700", "127.0.0.1:6701")  # the slots sim_workers registers


@pytest.fixture
def jobs() -> Any:
    return build_jobs(topology_names=["wordcount"])


@pytest.fixture
def topology_id(wordcount: Topology, zk_store: ZkStore, cluster_resource: StreamClusterResource, sim_workers: Any) -> str:
    sim_workers.register()
    return submit(zk_store, cluster_resource.config(), wordcount, workers=2)


def _run(job: dg.JobDefinition, resources: dict[str, Any], run_config: dict[str, Any] | None = None) -> Any:
    result = job.execute_in_process(run_config=run_config, resources=resources)
    assert result.success
    [node] = job.graph.node_names()
    return result, result.output_for_node(node)


def _fingerprints(store: ZkStore, topology_id: str) -> dict[int, int | None]:
    """Task -> heartbeat fingerprint, as the heartbeat sensor records it."""
    return {t.task_id: t.heartbeat_fingerprint for t in describe_topology(store, topology_id).tasks}


def _output_metadata(result: Any) -> dict[str, Any]:
    [event] = [e for e in result.all_node_events if e.event_type_value == "STEP_OUTPUT"]
    return {k: v.value for k, v in event.step_output_data.metadata.items()}


def test_deactivate_activate_and_kill(jobs: Any, resources: dict[str, Any], topology_id: str, zk_store: ZkStore) -> None:
    # The launchpad default is the code location's first topology.
    _, out = _run(jobs.deactivate, resources)
    assert out == topology_id
    assert read_storm(zk_store, topology_id).status == "INACTIVE"

    _run(jobs.activate, resources, {"ops": {"activate_topology": {"config": {"topology": topology_id}}}})
    assert read_storm(zk_store, topology_id).status == "ACTIVE"

    _run(jobs.kill, resources, {"ops": {"kill_topology": {"config": {"topology": "wordcount"}}}})
    assert find_topology_id(zk_store, "wordcount", missing_ok=True) is None
    assert not zk_store.exists(ZkPaths.storm(topology_id))


def test_verb_on_a_missing_topology_fails_with_the_reason(jobs: Any, resources: dict[str, Any]) -> None:
    result = jobs.kill.execute_in_process(
        run_config={"ops": {"kill_topology": {"config": {"topology": "nope"}}}}, resources=resources, raise_on_error=False
    )
    assert not result.success
    assert "no running topology named 'nope'" in str(result.all_events)


def test_rebalance_moves_lost_tasks_off_a_stale_slot(
    jobs: Any, resources: dict[str, Any], topology_id: str, zk_store: ZkStore, sim_workers: Any
) -> None:
    before, epoch = read_assignment(zk_store, topology_id)  # type: ignore[misc]
    stale_slot = WORKERS[0]
    on_stale = sorted(t for t, w in before.tasks.items() if w == stale_slot)
    assert on_stale, before.tasks
    for task_id, worker in before.tasks.items():
        sim_workers.beat(topology_id, task_id, worker_id=worker, age_s=60.0 if worker == stale_slot else 0.0)

    # What the sensor saw when it judged them lost: these very heartbeats, unchanged since.
    seen = _fingerprints(zk_store, topology_id)
    result, out = _run(
        jobs.rebalance,
        resources,
        rebalance_run_config(topology_id, lost_tasks=on_stale, lost_heartbeats={t: seen[t] for t in on_stale}),
    )

    after, new_epoch = read_assignment(zk_store, topology_id)  # type: ignore[misc]
    assert set(after.tasks.values()) == {WORKERS[1]}  # the bad slot is left out
    assert new_epoch == epoch + 1
    assert out["how"] == "reassign (lost tasks)"
    meta = _output_metadata(result)
    assert meta["excluded_slots"] == [stale_slot]
    assert set(meta["moved_tasks"]) == {str(t) for t in on_stale}


def test_rebalance_of_recovered_tasks_does_nothing(
    jobs: Any, resources: dict[str, Any], topology_id: str, zk_store: ZkStore, sim_workers: Any
) -> None:
    before, epoch = read_assignment(zk_store, topology_id)  # type: ignore[misc]
    for task_id, worker in before.tasks.items():
        sim_workers.beat(topology_id, task_id, worker_id=worker)
    seen = _fingerprints(zk_store, topology_id)  # the sensor judged them lost with these beats...
    for task_id, worker in before.tasks.items():
        sim_workers.beat(topology_id, task_id, worker_id=worker)  # ...and they beat again since

    run_config = rebalance_run_config(topology_id, lost_tasks=[0, 1], lost_heartbeats={0: seen[0], 1: seen[1]})
    _, out = _run(jobs.rebalance, resources, run_config)

    assert out["how"] == "nothing (recovered)"
    assert read_assignment(zk_store, topology_id) == (before, epoch)


def test_rebalance_without_fingerprints_watches_the_heartbeats_itself(
    jobs: Any, resources: dict[str, Any], topology_id: str, zk_store: ZkStore, sim_workers: Any
) -> None:
    """A rebalance started by hand with lost_tasks only: the op judges by the tracker's rule on its
    own clock, watching for heartbeat_timeout_s; a task that beats meanwhile is alive, whatever
    time its worker writes into the heartbeat."""
    before, epoch = read_assignment(zk_store, topology_id)  # type: ignore[misc]
    for task_id, worker in before.tasks.items():
        sim_workers.beat(topology_id, task_id, worker_id=worker, age_s=3600.0)  # a clock an hour behind
    stop = threading.Event()

    def keep_beating() -> None:
        while not stop.wait(0.2):
            for task_id, worker in before.tasks.items():
                sim_workers.beat(topology_id, task_id, worker_id=worker, age_s=3600.0)

    beating = threading.Thread(target=keep_beating, daemon=True)
    beating.start()
    try:
        _, out = _run(jobs.rebalance, resources, rebalance_run_config(topology_id, lost_tasks=[0, 1], heartbeat_timeout_s=1.5))
    finally:
        stop.set()
        beating.join()
    assert out["how"] == "nothing (recovered)"
    assert read_assignment(zk_store, topology_id) == (before, epoch)

    # Nothing beats now: after the watch the tasks are still lost and move.
    _, out = _run(jobs.rebalance, resources, rebalance_run_config(topology_id, lost_tasks=[0], heartbeat_timeout_s=1.0))
    assert out["how"] == "reassign (lost tasks)"


def test_storm_rebalance_stores_the_new_worker_count(
    jobs: Any, resources: dict[str, Any], topology_id: str, zk_store: ZkStore
) -> None:
    _, out = _run(jobs.rebalance, resources, rebalance_run_config("wordcount", workers=1))

    assert out["how"] == "rebalance"
    storm = read_storm(zk_store, topology_id)
    assert (storm.workers, storm.status) == (1, "ACTIVE")
    after, _ = read_assignment(zk_store, topology_id)  # type: ignore[misc]
    assert len(set(after.tasks.values())) == 1


def test_rebalance_schedule_spreads_tasks_onto_a_new_worker(
    jobs: Any,
    resources: dict[str, Any],
    wordcount: Topology,
    zk_store: ZkStore,
    cluster_resource: StreamClusterResource,
    sim_workers: Any,
) -> None:
    sim_workers.register(WORKERS[:1])
    topology_id = submit(zk_store, cluster_resource.config(), wordcount, workers=2)
    assert set(read_assignment(zk_store, topology_id)[0].tasks.values()) == {WORKERS[0]}  # type: ignore[index]
    sim_workers.register(WORKERS[1:])  # a worker joins later

    schedule = build_rebalance_schedule(topology_name="wordcount", rebalance_job=jobs.rebalance)
    assert schedule.name == "stream_ops_rebalance_wordcount"
    with dg.build_schedule_context() as context:
        [request] = schedule.evaluate_tick(context).run_requests  # type: ignore[misc]
    assert request.run_config["ops"]["rebalance_topology"]["config"]["quiesce"] is False
    _, out = _run(jobs.rebalance, resources, request.run_config)

    assert out["how"] == "reassign"
    tasks = read_assignment(zk_store, topology_id)[0].tasks  # type: ignore[index]
    assert sorted(tasks.values()).count(WORKERS[1]) == 2  # an even split, two tasks moved
    assert read_storm(zk_store, topology_id).status == "ACTIVE"


def test_compaction_schedule_requests_the_compact_job(jobs: Any) -> None:
    schedule = build_compaction_schedule(topology_name="wordcount", compact_job=jobs.compact_state, cron_schedule="0 3 * * *")
    with dg.build_schedule_context() as context:
        [request] = schedule.evaluate_tick(context).run_requests  # type: ignore[misc]
    assert schedule.cron_schedule == "0 3 * * *"
    assert request.run_config == {"ops": {"compact_state": {"config": {"topology": "wordcount", "stages": [], "queues": []}}}}


def test_jobs_need_only_the_resources_they_use(jobs: Any) -> None:
    """Only worker runs start a SparkSession (through the pyspark resource)."""

    def needs(job: dg.JobDefinition) -> set[str]:
        return set(job.required_resource_keys) - {"io_manager"}

    assert needs(jobs.worker) == {"zookeeper", "stream_cluster", "pyspark"}
    for job in (jobs.rebalance, jobs.activate, jobs.deactivate, jobs.kill):
        assert needs(job) == {"zookeeper"}
    assert needs(jobs.compact_state) == {"zookeeper", "stream_cluster"}
