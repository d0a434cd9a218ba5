"""A worker's start-up: its SparkSession starts while it connects to ZooKeeper, and the tasks
assigned to it start together, each still taking ownership under its own epoch.

Real ZooKeeper, the shared SparkSession, an in-process worker.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stream_ops.config import ClusterConfig, ZooKeeperConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import OwnerRecord
from stream_ops.coordination.store import ZkStore
from stream_ops.examples.wordcount import build_wordcount
from stream_ops.local_stack import expected_word_counts, wait_for_counts
from stream_ops.nimbus import describe_topology, submit
from stream_ops.nimbus.assignment import reassign
from stream_ops.ports import free_port
from stream_ops.runtime import task_runner
from stream_ops.runtime.worker import Worker, WorkerSettings
from stream_ops.topics.producer import produce

SENTENCES = ["how are you", "nice to meet you", "what a good day", "how do you do"]
TASKS = 4  # the word count: 2 source tasks, 2 keyed tasks


@pytest.fixture
def run_worker(zk_config: ZooKeeperConfig, tmp_path: Path, spark: Any) -> Iterator[Any]:
    """``run_worker(**settings)`` starts one in-process worker on the shared session; all stop afterwards."""
    running: list[tuple[threading.Event, threading.Thread]] = []

    def start(spark_factory: Any = None, **settings: Any) -> Worker:
        worker = Worker(
            zk_config,
            ClusterConfig(root=tmp_path / "cluster"),
            WorkerSettings(
                **{"host": "127.0.0.1", "port": free_port(), "trigger_seconds": 0.2, "heartbeat_interval_s": 0.5, **settings}
            ),
            spark_factory=spark_factory or (lambda: spark),
        )
        stop = threading.Event()
        thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
        thread.start()
        running.append((stop, thread))
        return worker

    yield start
    for stop, thread in running:
        stop.set()
        thread.join(60)


def _owner(store: ZkStore, topology_id: str, task_id: int) -> OwnerRecord | None:
    found = store.get_json(ZkPaths.owner(topology_id, task_id))
    return None if found is None else OwnerRecord.model_validate(found[0])


def test_spark_session_starts_while_the_worker_connects_to_zookeeper(
    run_worker: Any, zk_store: ZkStore, spark: Any, monkeypatch: pytest.MonkeyPatch, wait_until: Any
) -> None:
    creating = threading.Event()
    real_connect = ZkStore.connect

    def factory() -> Any:
        creating.set()
        return spark

    def connect(config: ZooKeeperConfig, **kwargs: Any) -> ZkStore:
        # A worker that connected first and created its session afterwards never gets here.
        if not creating.wait(10):
            raise AssertionError("the SparkSession was not being created while the worker connected to ZooKeeper")
        return real_connect(config, **kwargs)

    monkeypatch.setattr(ZkStore, "connect", connect)
    worker = run_worker(spark_factory=factory)
    wait_until(lambda: worker.worker_id in zk_store.children(ZkPaths.WORKERS), 30, "the worker to register")
    assert worker.spark is spark


def test_assigned_tasks_start_together_and_count_exactly(
    run_worker: Any, zk_store: ZkStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every task's query start waits until all four are starting: one after another, the first
    # would wait alone until the barrier breaks, and its task would fail to start.
    barrier = threading.Barrier(TASKS, timeout=30)
    real_start_query = task_runner.TaskRunner.start_query

    def start_query(self: task_runner.TaskRunner) -> None:
        barrier.wait()
        real_start_query(self)

    monkeypatch.setattr(task_runner.TaskRunner, "start_query", start_query)
    worker = run_worker(start_concurrency=TASKS)
    topology = build_wordcount(tmp_path / "input", queues=2)
    topology_id = submit(zk_store, worker.cluster, topology, workers=1)
    produce(topology.chains[0].source.topic, ({"sentence": s} for s in SENTENCES))

    wait_for_counts(zk_store, topology.name, "words", expected_word_counts(SENTENCES), timeout_s=90)
    assert not barrier.broken
    assert worker.running_tasks == [(topology_id, task) for task in range(TASKS)]
    for task in range(TASKS):
        owner = _owner(zk_store, topology_id, task)
        assert owner is not None and (owner.worker_id, owner.epoch) == (worker.worker_id, 1)


def test_a_task_still_owned_elsewhere_waits_while_the_others_start(
    run_worker: Any, zk_config: ZooKeeperConfig, zk_store: ZkStore, tmp_path: Path, wait_until: Any
) -> None:
    topology = build_wordcount(tmp_path / "input", queues=2)
    topology_id = submit(zk_store, ClusterConfig(root=tmp_path / "cluster"), topology, workers=1)  # no worker yet
    # A zombie: another session still holds task 3's owner node (epoch 0, as a dying worker's).
    zombie = ZkStore.connect(zk_config)
    try:
        zombie.create_json(
            ZkPaths.owner(topology_id, 3), OwnerRecord(worker_id="zombie:1", epoch=0, since=0.0).to_json_obj(), ephemeral=True
        )
        worker = run_worker(start_concurrency=TASKS)
        wait_until(lambda: worker.worker_id in zk_store.children(ZkPaths.WORKERS), 30, "the worker to register")
        reassign(zk_store, topology_id)  # what the nimbus does: all four tasks onto the worker
        wait_until(lambda: len(worker.running_tasks) == TASKS - 1, 60, "the three free tasks to start")
        assert (topology_id, 3) not in worker.running_tasks
        owner = _owner(zk_store, topology_id, 3)
        assert owner is not None and owner.worker_id == "zombie:1"
    finally:
        zombie.close()  # its ephemeral owner node goes: the watch on it starts the task
    wait_until(lambda: len(worker.running_tasks) == TASKS, 30, "task 3 to start once its owner left")
    owner = _owner(zk_store, topology_id, 3)
    assert owner is not None and (owner.worker_id, owner.epoch) == (worker.worker_id, 1)
    produce(topology.chains[0].source.topic, ({"sentence": s} for s in SENTENCES))
    wait_for_counts(zk_store, topology.name, "words", expected_word_counts(SENTENCES), timeout_s=90)


def test_a_started_task_is_alive_before_its_first_heartbeat_interval(
    run_worker: Any, zk_store: ZkStore, tmp_path: Path, wait_until: Any
) -> None:
    worker = run_worker(heartbeat_interval_s=600.0)
    wait_until(lambda: worker.worker_id in zk_store.children(ZkPaths.WORKERS), 30, "the worker to register")
    topology = build_wordcount(tmp_path / "input", queues=2)
    topology_id = submit(zk_store, worker.cluster, topology, workers=1)
    wait_until(lambda: len(worker.running_tasks) == TASKS, 60, "the four tasks to start")
    wait_until(lambda: describe_topology(zk_store, topology_id).health() == "healthy", 10, "every task's first heartbeat")
