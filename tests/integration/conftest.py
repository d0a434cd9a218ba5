"""Fixtures for integration tests: one local SparkSession for the whole test session, and
in-process workers sharing it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from stream_ops.config import ClusterConfig, ZooKeeperConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.ports import free_port
from stream_ops.runtime.worker import Worker, WorkerSettings
from stream_ops.spark.session import create_spark_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """A real ``local[2]`` SparkSession shared by every integration test."""
    session = create_spark_session(master="local[2]", app_name="stream-ops-tests")
    try:
        yield session
    finally:
        session.stop()


class WorkerPool:
    """Workers run on threads of the test process, all on the shared SparkSession."""

    def __init__(self, zk_config: ZooKeeperConfig, cluster: ClusterConfig, spark: SparkSession) -> None:
        self.zk_config, self.cluster, self.spark = zk_config, cluster, spark
        self.running: list[tuple[Worker, threading.Event, threading.Thread]] = []

    def start(self) -> Worker:
        settings = WorkerSettings(host="127.0.0.1", port=free_port(), trigger_seconds=0.2, heartbeat_interval_s=0.5)
        worker = Worker(self.zk_config, self.cluster, settings, spark_factory=lambda: self.spark)
        stop = threading.Event()
        thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
        thread.start()
        self.running.append((worker, stop, thread))
        self._wait_registered(worker, thread)
        return worker

    def _wait_registered(self, worker: Worker, thread: threading.Thread, timeout_s: float = 60.0) -> None:
        """Until ``worker`` is in ``/workers``: a topology submitted before that has its tasks
        assigned to nobody (these tests run no nimbus)."""
        deadline = time.monotonic() + timeout_s
        with ZkStore.connect(self.zk_config) as store:
            while not store.exists(ZkPaths.worker(worker.worker_id)):
                assert thread.is_alive(), f"worker {worker.worker_id} stopped before it registered"
                assert time.monotonic() < deadline, f"worker {worker.worker_id} did not register within {timeout_s:.0f} s"
                time.sleep(0.02)

    def stop(self, worker: Worker) -> None:
        """Stop a worker cleanly (its tasks are released)."""
        for entry in list(self.running):
            if entry[0] is worker:
                entry[1].set()
                entry[2].join(60)
                self.running.remove(entry)

    def stop_all(self) -> None:
        for worker, _, _ in list(self.running):
            self.stop(worker)


@pytest.fixture
def worker_pool(zk_config: ZooKeeperConfig, tmp_path, spark: SparkSession) -> Iterator[WorkerPool]:
    """Start in-process workers with ``worker_pool.start()``; all are stopped afterwards."""
    pool = WorkerPool(zk_config, ClusterConfig(root=tmp_path / "cluster"), spark)
    yield pool
    pool.stop_all()
