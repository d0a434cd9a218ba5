"""Fixtures of the Kafka tests: the fetched jars, one embedded broker per session, and worker
processes whose Spark has the Kafka connector.

The jars are fetched once with Maven (``tests/run.sh`` already did); when they cannot be fetched
(no Maven, no repository reachable) every test here is skipped and says why. The shared
in-process SparkSession of ``tests/integration/conftest.py`` is built without ``spark.jars`` and
Spark cannot add a data source to a running driver for other threads (``ADD JAR`` reaches only
the calling thread's class loader), so topologies reading Kafka run in ``stream-ops worker``
processes started with ``--spark-conf spark.jars=...``, as a deployment would run them.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from stream_ops.config import ClusterConfig, ZooKeeperConfig
from stream_ops.coordination.embedded import EmbeddedZooKeeper
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import KafkaJarsError
from stream_ops.kafka.embedded import EmbeddedKafka
from stream_ops.kafka.jars import broker_jars, spark_kafka_jars
from stream_ops.local_stack import WorkerProcess
from stream_ops.nimbus import kill
from stream_ops.ports import free_port
from stream_ops.runtime.processes import spawn, stop_process, worker_command

WORKER_START_TIMEOUT_S = 120.0


@pytest.fixture(scope="session")
def kafka_broker_jars() -> list[Path]:
    try:
        return broker_jars()
    except KafkaJarsError as e:
        if os.environ.get("CI"):
            raise  # CI fetched them in its install step: not having them is a failure there
        pytest.skip(f"the Kafka broker jars cannot be fetched here: {e}")


@pytest.fixture(scope="session")
def connector_jars() -> list[Path]:
    try:
        return spark_kafka_jars()
    except KafkaJarsError as e:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"Spark's Kafka connector jars cannot be fetched here: {e}")


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory, kafka_broker_jars: list[Path]) -> Iterator[EmbeddedKafka]:
    """One real Kafka broker (KRaft, broker and controller in one JVM) for the whole session."""
    broker = EmbeddedKafka(tmp_path_factory.mktemp("kafka"), jars=kafka_broker_jars)
    broker.start(timeout_s=120)
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def topic_name() -> str:
    """A fresh topic name per test (the broker is shared)."""
    return f"t-{uuid.uuid4().hex[:12]}"


@dataclass
class KafkaWorkers:
    """``stream-ops worker`` processes with the connector, on a chroot of their own."""

    zk_config: ZooKeeperConfig
    cluster: ClusterConfig
    connector: list[Path]
    processes: list[WorkerProcess]

    def start(self) -> WorkerProcess:
        port = free_port()
        args = [
            "--insecure",
            "--spark-master",
            "local[2]",
            "--trigger-seconds",
            "0.5",
            "--heartbeat-interval",
            "0.5",
            "--spark-conf",
            "spark.jars=" + ",".join(str(jar) for jar in self.connector),
        ]
        command = worker_command(self.zk_config, self.cluster.root, host="127.0.0.1", port=port, extra_args=args)
        log = self.cluster.root / "logs" / f"worker-{port}.log"
        worker = WorkerProcess(port, log, spawn(command, log))
        self.processes.append(worker)
        return worker

    def stop_all(self) -> None:
        for worker in self.processes:
            stop_process(worker.proc)
        self.processes.clear()


@pytest.fixture(scope="session")
def kafka_workers(
    zookeeper: EmbeddedZooKeeper, connector_jars: list[Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KafkaWorkers]:
    """One worker process for every test that needs one (a Spark JVM starts in ~15 s on 2
    cores), registered before the fixture returns; each test's topologies are killed after it
    (:func:`kafka_store`), so the next test has the worker to itself."""
    from stream_ops.nimbus.assignment import live_workers

    zk_config = ZooKeeperConfig(
        hosts=zookeeper.hosts, chroot=f"/kafka-{uuid.uuid4().hex}", session_timeout_s=6.0, connect_timeout_s=5.0, insecure=True
    )
    workers = KafkaWorkers(zk_config, ClusterConfig(root=tmp_path_factory.mktemp("kafka-cluster")), connector_jars, [])
    worker = workers.start()
    try:
        deadline = time.monotonic() + WORKER_START_TIMEOUT_S
        with ZkStore.connect(zk_config) as store:
            while worker.worker_id not in live_workers(store):
                assert worker.proc.poll() is None, f"the worker exited: {worker.log.read_text(errors='replace')[-3000:]}"
                assert time.monotonic() < deadline, f"the worker did not register in {WORKER_START_TIMEOUT_S:.0f} s"
                time.sleep(0.2)
        yield workers
    finally:
        workers.stop_all()


@pytest.fixture
def kafka_store(kafka_workers: KafkaWorkers) -> Iterator[ZkStore]:
    """A store on the Kafka workers' chroot; the topologies a test submitted are killed after it."""
    store = ZkStore.connect(kafka_workers.zk_config)
    try:
        yield store
    finally:
        try:
            for topology_id in store.children(ZkPaths.STORMS):
                kill(store, topology_id)
        finally:
            store.close()
