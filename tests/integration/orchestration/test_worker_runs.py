"""Worker runs and the heartbeat sensor with real workers: real ZooKeeper, real Spark.

* A worker run (``stream_ops_worker``) starts a real ``stream-ops worker`` process (its own
  Spark, the Spark settings of ``LazyPySparkResource``) with the allow-listed environment: the
  run's secrets are in none of its processes, a pass-through variable is; terminating the run
  (status CANCELING) or interrupting its op stops the worker and releases its tasks; a worker
  whose parent is SIGKILLed stops cleanly at the end of its stdin.
* The sensor test kills a real worker *process* (SIGKILL) mid-run: the next ticks show the
  stream assets down and request a rebalance naming the lost tasks and a worker run; the
  requested runs (a worker run, then the rebalance) bring the topology back to healthy with
  advancing txids and exact counts.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster_pyspark import LazyPySparkResource
from process_tree import process_tree, secrets_shown
from pyspark.sql import SparkSession

from stream_ops.config import ZooKeeperConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.dsl.streams import Topology
from stream_ops.examples.wordcount import SAMPLE_SENTENCES
from stream_ops.local_stack import expected_word_counts, wait_for_counts
from stream_ops.nimbus.assignment import live_workers
from stream_ops.nimbus.status import describe_topology
from stream_ops.nimbus.submission import submit
from stream_ops.orchestration import (
    StreamClusterResource,
    ZooKeeperResource,
    build_heartbeat_sensor,
    build_jobs,
    build_worker_relaunch_sensor,
    worker_run_config,
)
from stream_ops.orchestration.worker_process import worker_launch
from stream_ops.ports import free_port
from stream_ops.runtime.processes import kill_group, spawn, stop_process, worker_command
from stream_ops.topics.producer import produce

HEARTBEAT_TIMEOUT_S = 3.0
WORKER_RUN = worker_run_config()
#: Seconds a worker process may take to register (Python, then a JVM, on a loaded machine).
REGISTER_TIMEOUT_S = 90
STREAM = dg.AssetKey(["stream_ops", "wordcount", "sentences"])
KEYED = dg.AssetKey(["stream_ops", "wordcount", "count"])
#: Secrets a Dagster run's process holds, none of which a worker it starts may show.
RUN_SECRETS = {
    "DAGSTER_PG_PASSWORD": "pg-run-secret-5e2a",
    "STREAM_OPS_ZK_AUTH": "stream-ops:zk-run-secret-91c4",
    "STREAM_OPS_QUERY_TOKEN": "query-run-secret-0b7d33e1",
    "PGPASSWORD": "pg-libpq-secret-44f0",
}


def wait_until(condition: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.2) -> Any:
    """Poll ``condition`` until it returns something truthy (bounded)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)


@pytest.fixture
def fast_cluster(tmp_path: Path) -> StreamClusterResource:
    """Workers with small triggers and heartbeats, so the tests stay fast."""
    return StreamClusterResource(
        root=str(tmp_path / "cluster"), trigger_seconds=0.2, heartbeat_interval_s=0.5, poll_interval_s=0.2
    )


@pytest.fixture
def worker_resources(zookeeper_resource: ZooKeeperResource, fast_cluster: StreamClusterResource) -> dict[str, Any]:
    """The worker job's resources: the workers' Spark settings in a ``LazyPySparkResource`` (no
    session in this process)."""
    return {
        "zookeeper": zookeeper_resource,
        "stream_cluster": fast_cluster,
        "pyspark": LazyPySparkResource(spark_config={"spark.master": "local[2]"}),
    }


class WorkerRun:
    """A worker run executing in-process on a thread, as a run worker would execute it."""

    def __init__(self, instance: dg.DagsterInstance, resources: dict[str, Any]) -> None:
        self.instance = instance
        self.job = build_jobs(topology_names=["wordcount"]).worker
        self.result: Any = None
        known = {r.dagster_run.run_id for r in instance.get_run_records()}
        self.thread = threading.Thread(target=self._execute, args=(resources,), daemon=True)
        self.thread.start()
        self.run_id: str = wait_until(lambda: self._new_run_id(known), 30, "the worker run to start")

    def _execute(self, resources: dict[str, Any]) -> None:
        self.result = self.job.execute_in_process(
            run_config=WORKER_RUN, resources=resources, instance=self.instance, raise_on_error=False
        )

    def _new_run_id(self, known: set[str]) -> str | None:
        fresh = [r.dagster_run.run_id for r in self.instance.get_run_records() if r.dagster_run.run_id not in known]
        return fresh[0] if fresh else None

    def worker_id(self, store: ZkStore) -> str | None:
        """The id of the worker this run registered, once it has."""
        for worker_id, record in live_workers(store).items():
            if record.launched_by == f"dagster:{self.run_id}":
                return worker_id
        return None

    def terminate(self, timeout_s: float = 60.0) -> Any:
        """What terminating the run from the UI does first: mark it CANCELING."""
        run = self.instance.get_run_by_id(self.run_id)
        assert run is not None
        self.instance.report_run_canceling(run)
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "the worker run did not end after being terminated"
        return self.result


def _owners(store: ZkStore, topology_id: str) -> list[str]:
    return store.children(ZkPaths.owners(topology_id))


def test_worker_run_runs_tasks_without_the_runs_secrets_and_releases_them_when_terminated(
    worker_resources: dict[str, Any],
    wordcount: Topology,
    zk_store: ZkStore,
    fast_cluster: StreamClusterResource,
    spark: SparkSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What dagster.sh gives a run's process, and a variable the operator passes to topologies.
    for name, value in RUN_SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TOPOLOGY_API_KEY", "passed-through-7d1f")
    passing = StreamClusterResource(
        root=fast_cluster.root,
        trigger_seconds=0.2,
        heartbeat_interval_s=0.5,
        poll_interval_s=0.2,
        worker_pass_env=["TOPOLOGY_API_KEY"],
    )
    with dg.DagsterInstance.ephemeral() as instance:
        run = WorkerRun(instance, {**worker_resources, "stream_cluster": passing})
        worker_id = wait_until(lambda: run.worker_id(zk_store), REGISTER_TIMEOUT_S, "the worker to register")
        topology_id = submit(zk_store, fast_cluster.config(), wordcount, workers=1)  # assigned to the live worker
        sentences = list(SAMPLE_SENTENCES) * 2
        produce(wordcount.chains[0].source.topic, ({"sentence": s} for s in sentences))
        wait_for_counts(zk_store, "wordcount", "words", expected_word_counts(sentences), timeout_s=60)
        assert {t.owner for t in describe_topology(zk_store, topology_id).tasks} == {worker_id}

        worker_pid = live_workers(zk_store)[worker_id].pid
        assert worker_pid != os.getpid()  # topology code runs outside the run's process
        tree = process_tree(worker_pid)
        assert {"stream-ops worker", "Spark JVM"} <= {view.kind for view in tree}
        assert secrets_shown(tree, RUN_SECRETS) == []
        assert b"TOPOLOGY_API_KEY=passed-through-7d1f" in tree[0].environ

        result = run.terminate()

        assert result.success
        assert result.output_for_node("run_worker")["stopped_because"] == "run is being terminated"
        assert _owners(zk_store, topology_id) == []  # every task released at once
        assert worker_id not in live_workers(zk_store)
        assert not spark.sparkContext._jsc.sc().isStopped()  # shared session left running


def test_interrupting_the_worker_op_stops_the_worker(
    worker_resources: dict[str, Any], wordcount: Topology, zk_store: ZkStore, fast_cluster: StreamClusterResource
) -> None:
    """What a run worker does when the run is terminated: SIGINT -> DagsterExecutionInterruptedError in the op."""
    job = build_jobs(topology_names=["wordcount"]).worker
    owned = threading.Event()
    submitted: list[str] = []
    pids: list[int] = []

    def interrupt_once_tasks_run() -> None:
        try:
            workers = wait_until(lambda: live_workers(zk_store), REGISTER_TIMEOUT_S, "the worker to register")
            pids.extend(record.pid for record in workers.values())
            submitted.append(submit(zk_store, fast_cluster.config(), wordcount, workers=1))
            wait_until(lambda: len(_owners(zk_store, submitted[0])) == 4, 60, "the worker to own every task")
            owned.set()
        finally:
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_once_tasks_run, daemon=True).start()
    result = job.execute_in_process(run_config=WORKER_RUN, resources=worker_resources, raise_on_error=False)

    assert owned.is_set()
    assert not result.success  # interrupted
    assert "DagsterExecutionInterruptedError" in str(result.all_events)
    assert _owners(zk_store, submitted[0]) == []
    assert live_workers(zk_store) == {}
    assert pids and not any(_running(pid) for pid in pids)  # the op waited for its worker process to end


_RUN_PROCESS = """
import json, sys, time
from stream_ops.runtime.processes import start_worker
from stream_ops.runtime.worker_pipe import WorkerSecrets
spec = json.loads(sys.stdin.readline())
with open(spec["log"], "ab") as log:
    worker = start_worker(spec["command"], env=spec["env"], secrets=WorkerSecrets(), output=log.fileno())
print(worker.pid, flush=True)
time.sleep(600)
"""


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (an exited one nobody reaped yet is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def test_the_worker_of_a_killed_run_process_stops_cleanly(
    zk_config: ZooKeeperConfig, zk_store: ZkStore, fast_cluster: StreamClusterResource, tmp_path: Path
) -> None:
    """A run's process SIGKILLed: the worker it started (as the op starts it) reaches the end of its
    stdin and stops as on SIGTERM, unregistering at once."""
    settings = fast_cluster.worker_settings(port=free_port(), launched_by="dagster:killed-run")
    launch = worker_launch(zk_config, fast_cluster.config(), settings, {"spark.master": "local[1]"})
    log = tmp_path / "worker.log"
    run_process = subprocess.Popen(
        [sys.executable, "-c", _RUN_PROCESS], stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True
    )
    assert run_process.stdin is not None and run_process.stdout is not None
    run_process.stdin.write(json.dumps({"command": launch.command, "env": launch.env, "log": str(log)}).encode() + b"\n")
    run_process.stdin.flush()
    worker_pid = int(run_process.stdout.readline())
    try:
        wait_until(lambda: settings.worker_id in live_workers(zk_store), REGISTER_TIMEOUT_S, f"the worker to register ({log})")
        kill_group(run_process)
        run_process.wait(10)
        wait_until(lambda: not _running(worker_pid), 60, "the worker to exit after its run's process was killed")
        output = log.read_text(errors="replace")
        assert "stdin closed: the process that started this worker is gone; stopping" in output
        assert f"worker {settings.worker_id} stopped" in output  # a clean stop, not a death
        assert settings.worker_id not in live_workers(zk_store)
    finally:
        kill_group(run_process)
        if _running(worker_pid):
            os.killpg(worker_pid, signal.SIGKILL)


def test_a_worker_process_that_fails_fails_the_run_with_its_output(worker_resources: dict[str, Any]) -> None:
    # A Spark setting without a key: the worker process refuses it at start (a usage error).
    pyspark = LazyPySparkResource(spark_config={**worker_resources["pyspark"].spark_config, "": "no-key"})
    result = build_jobs(topology_names=["wordcount"]).worker.execute_in_process(
        run_config=WORKER_RUN, resources={**worker_resources, "pyspark": pyspark}, raise_on_error=False
    )
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    message = str(failure.step_failure_data.error)
    assert "(exit code 2)" in message and "'=no-key' is not KEY=VALUE" in message


def test_failed_worker_runs_are_relaunched_a_bounded_number_of_times(
    worker_resources: dict[str, Any],
) -> None:
    jobs = build_jobs(topology_names=["wordcount"])
    unreachable = ZooKeeperResource(hosts=f"127.0.0.1:{free_port()}", connect_timeout_s=0.5, session_timeout_s=1.0, insecure=True)
    sensor = build_worker_relaunch_sensor(worker_job=jobs.worker, max_relaunches=2)
    with dg.DagsterInstance.ephemeral() as instance:
        failed = jobs.worker.execute_in_process(
            run_config=WORKER_RUN,
            resources={**worker_resources, "zookeeper": unreachable},
            instance=instance,
            raise_on_error=False,
            tags={"stream_ops/relaunch_attempt": "1"},
        )
        assert not failed.success
        [failure] = [e for e in failed.all_events if e.event_type == dg.DagsterEventType.RUN_FAILURE]

        def evaluate(run: dg.DagsterRun) -> Any:
            context = dg.build_run_status_sensor_context(
                sensor_name=sensor.name, dagster_instance=instance, dagster_run=run, dagster_event=failure
            ).for_run_failure()
            return sensor(context)

        request = evaluate(failed.dagster_run)
        assert isinstance(request, dg.RunRequest)
        assert request.run_key == f"relaunch-{failed.run_id}"
        assert request.run_config == failed.dagster_run.run_config
        assert request.tags["stream_ops/relaunch_attempt"] == "2"
        assert request.tags["stream_ops/relaunch_of"] == failed.run_id

        gave_up = evaluate(failed.dagster_run.with_tags({**failed.dagster_run.tags, "stream_ops/relaunch_attempt": "2"}))
        assert isinstance(gave_up, dg.SkipReason)
        assert "not relaunching" in str(gave_up.skip_message)


def test_worker_run_refuses_a_tree_without_credentials_unless_insecure(
    worker_resources: dict[str, Any], zk_config: ZooKeeperConfig, zk_store: ZkStore
) -> None:
    # The resource's default is secure: without auth_digest a worker run needs insecure=True.
    secure_default = ZooKeeperResource(
        hosts=zk_config.hosts,
        chroot=zk_config.chroot,
        session_timeout_s=zk_config.session_timeout_s,
        connect_timeout_s=zk_config.connect_timeout_s,
    )
    jobs = build_jobs(topology_names=["wordcount"])
    result = jobs.worker.execute_in_process(
        run_config=WORKER_RUN, resources={**worker_resources, "zookeeper": secure_default}, raise_on_error=False
    )
    assert not result.success
    assert "refusing to start the worker without ZooKeeper credentials" in str(result.all_events)
    assert live_workers(zk_store) == {}


# --- the heartbeat sensor with a worker killed for real ------------------------------------------


@pytest.fixture
def worker_process(zk_config: ZooKeeperConfig, fast_cluster: StreamClusterResource, tmp_path: Path) -> Iterator[Any]:
    """A real ``stream-ops worker`` process (what LocalStack.start_worker starts)."""
    command = worker_command(
        zk_config,
        Path(fast_cluster.root),
        host="127.0.0.1",
        port=free_port(),
        extra_args=["--trigger-seconds", "0.2", "--heartbeat-interval", "0.5", "--insecure"],
    )
    process = spawn(command, tmp_path / "worker.log")
    yield process
    stop_process(process)


def _observations(result: dg.SensorResult) -> dict[dg.AssetKey, dict[str, Any]]:
    return {
        e.asset_key: {k: v.value for k, v in e.metadata.items()}
        for e in result.asset_events or []
        if isinstance(e, dg.AssetObservation)
    }


def test_sensor_repairs_a_topology_whose_worker_was_killed(
    worker_process: Any,
    worker_resources: dict[str, Any],
    wordcount: Topology,
    zk_store: ZkStore,
    fast_cluster: StreamClusterResource,
    tmp_path: Path,
) -> None:
    jobs = build_jobs(topology_names=["wordcount"])
    sensor = build_heartbeat_sensor(
        topology_names=["wordcount"],
        heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
        launch_grace_s=1.0,
        rebalance_job=jobs.rebalance,
        worker_job=jobs.worker,
    )
    sensor_resources = {"zookeeper": worker_resources["zookeeper"]}
    topic = wordcount.chains[0].source.topic
    wait_until(
        lambda: live_workers(zk_store), REGISTER_TIMEOUT_S, f"the worker process to register (log {tmp_path / 'worker.log'})"
    )
    topology_id = submit(zk_store, fast_cluster.config(), wordcount, workers=1)
    first = list(SAMPLE_SENTENCES) * 2
    produce(topic, ({"sentence": s} for s in first))
    wait_for_counts(zk_store, "wordcount", "words", expected_word_counts(first), timeout_s=90)

    with dg.DagsterInstance.ephemeral() as instance:
        cursor: str | None = None

        def tick() -> dg.SensorResult:
            nonlocal cursor
            with dg.build_sensor_context(resources=sensor_resources, cursor=cursor, instance=instance) as context:
                result = sensor(context)
            cursor = result.cursor
            return result

        healthy = tick()
        assert _observations(healthy)[KEYED]["health"] == "healthy"
        assert not healthy.run_requests

        kill_group(worker_process, signal.SIGKILL)  # mid-run: queries and heartbeats stop dead
        worker_process.wait(10)

        def tick_if_down() -> dg.SensorResult | None:
            result = tick()
            return result if _observations(result)[STREAM]["health"] == "down" else None

        down = wait_until(tick_if_down, 30, "the sensor to see the stream down", interval_s=0.5)
        observed = _observations(down)
        assert observed[STREAM]["health"] == observed[KEYED]["health"] == "down"
        assert observed[STREAM]["topology_id"] == topology_id
        rebalances = [r for r in down.run_requests or [] if r.job_name == "stream_ops_rebalance"]
        assert len(rebalances) == 1
        epoch = describe_topology(zk_store, topology_id).assignment_epoch  # nothing reassigned it meanwhile
        assert re.fullmatch(rf"rebalance-{topology_id}-tasks-0-1-2-3-epoch-{epoch}-slots-[01]", str(rebalances[0].run_key))
        assert rebalances[0].run_config["ops"]["rebalance_topology"]["config"]["lost_tasks"] == [0, 1, 2, 3]
        failed_checks = [e for e in down.asset_events or [] if isinstance(e, dg.AssetCheckEvaluation) and not e.passed]
        assert {(e.asset_key, e.check_name) for e in failed_checks} >= {(STREAM, "heartbeat_freshness")}

        # Once the dead worker's session has expired, the sensor also asks for a worker.
        launch = wait_until(
            lambda: [r for r in tick().run_requests or [] if r.job_name == "stream_ops_worker"],
            30,
            "a worker launch request",
            interval_s=0.5,
        )
        assert len(launch) == 1

        # What the daemon would launch: the worker run, then the rebalance run.
        run = WorkerRun(instance, worker_resources)
        new_worker = wait_until(lambda: run.worker_id(zk_store), REGISTER_TIMEOUT_S, "the new worker to register")
        rebalance = jobs.rebalance.execute_in_process(
            run_config=rebalances[0].run_config, resources=sensor_resources, instance=instance
        )
        assert rebalance.success
        assert rebalance.output_for_node("rebalance_topology")["moved"]

        second = ["how are you", "nice to meet you"] * 5
        produce(topic, ({"sentence": s} for s in second))

        before = {key: meta["committed_txid"] for key, meta in observed.items()}  # at the "down" tick
        progress = {key: 0 for key in before}
        last: dict[dg.AssetKey, dict[str, Any]] = {}

        def healthy_and_advanced() -> bool:
            nonlocal last
            last = _observations(tick())
            for key, meta in last.items():
                progress[key] += meta.get("txids_committed_since_last_tick", 0)
            advanced = all(
                all(txid > before[key][task] for task, txid in meta["committed_txid"].items()) for key, meta in last.items()
            )
            return advanced and all(m["health"] == "healthy" for m in last.values())

        try:
            wait_until(healthy_and_advanced, 90, "healthy stream assets with advanced txids", interval_s=1.0)
        except AssertionError as e:
            raise AssertionError(f"{e}; last observation: {last}") from None
        assert all(p > 0 for p in progress.values()), progress  # the ticks reported the progress
        assert {t.owner for t in describe_topology(zk_store, topology_id).tasks} == {new_worker}
        wait_for_counts(zk_store, "wordcount", "words", expected_word_counts(first + second), timeout_s=60)

        result = run.terminate()
        assert result.success
        assert _owners(zk_store, topology_id) == []
