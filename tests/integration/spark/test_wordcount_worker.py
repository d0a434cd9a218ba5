"""Word count through a real worker: real ZooKeeper, real Spark, exact counts, dead letters."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stream_ops import MapState, OpaqueMapState, TransactionalMapState
from stream_ops.config import ClusterConfig, ZooKeeperConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.examples.wordcount import SAMPLE_SENTENCES, build_wordcount
from stream_ops.layout import TopologyLayout
from stream_ops.local_stack import expected_word_counts, free_port, wait_for_counts
from stream_ops.nimbus import describe_topology, submit
from stream_ops.runtime.worker import Worker, WorkerSettings
from stream_ops.state.changelog import StateTopicQueue
from stream_ops.topics.producer import produce


@pytest.fixture
def worker(zk_config: ZooKeeperConfig, tmp_path: Path, spark) -> Iterator[Worker]:
    settings = WorkerSettings(host="127.0.0.1", port=free_port(), trigger_seconds=0.2, heartbeat_interval_s=0.5)
    w = Worker(zk_config, ClusterConfig(root=tmp_path / "cluster"), settings, spark_factory=lambda: spark)
    stop = threading.Event()
    thread = threading.Thread(target=w.run, args=(stop,), daemon=True)
    thread.start()
    with ZkStore.connect(zk_config) as store:
        deadline = time.monotonic() + 30
        while not store.children(ZkPaths.WORKERS):
            assert time.monotonic() < deadline, "worker did not register"
            time.sleep(0.1)
    yield w
    stop.set()
    thread.join(60)
    assert not thread.is_alive()


@pytest.mark.parametrize("state", [OpaqueMapState, TransactionalMapState, MapState])
def test_counts_equal_ground_truth_and_state_topic_replays_them(worker, zk_store, tmp_path, state):
    cluster = worker.cluster
    topology = build_wordcount(tmp_path / "input", state=state)
    topology_id = submit(zk_store, cluster, topology, workers=1)
    topic = topology.chains[0].source.topic

    first = list(SAMPLE_SENTENCES) * 3
    second = ["how are you", "what a good day"] * 5
    produce(topic, ({"sentence": s} for s in first))
    wait_for_counts(zk_store, "wordcount", "words", expected_word_counts(first), timeout_s=60)
    produce(topic, ({"sentence": s} for s in second))
    expected = expected_word_counts(first + second)
    wait_for_counts(zk_store, "wordcount", "words", expected, timeout_s=60)

    status = describe_topology(zk_store, topology_id)
    assert status.health() == "healthy"
    assert all(t.committed_txid >= 0 for t in status.tasks)
    assert {t.owner for t in status.tasks} == {worker.worker_id}

    # The state topic alone (what a new owner replays) gives the same counts.
    plan_stage = worker._plans[topology_id].stage(1)
    layout = TopologyLayout(cluster, topology_id)
    replayed: dict[str, int] = {}
    for task in status.tasks:
        if task.stage != 1:
            continue
        queue = StateTopicQueue(layout.state_topic(plan_stage), task.queue)
        for key, value in queue.replay(task.committed_txid).items():
            replayed[key[0]] = getattr(value, "curr", getattr(value, "val", value))
    assert replayed == expected


def test_bad_records_go_to_the_dead_letter_topic(worker, zk_store, tmp_path):
    topology = build_wordcount(tmp_path / "input", queues=1)
    topology_id = submit(zk_store, worker.cluster, topology, workers=1)
    topic = topology.chains[0].source.topic
    topic.write_file(0, "bad.jsonl", [{"sentence": "how are you"}])
    (topic.queue_path(0) / ".tmp").write_text("")  # hidden files are ignored
    (topic.queue_path(0) / "broken.jsonl").write_text('{"sentence": "nice day"}\nnot json at all\n{"other": 1}\n')
    wait_for_counts(zk_store, "wordcount", "words", {"how": 1, "nice": 1, "day": 1}, timeout_s=60)

    letters = TopologyLayout(worker.cluster, topology_id).dead_letter_topic()
    deadline = time.monotonic() + 10
    records = []
    while time.monotonic() < deadline and len(records) < 2:
        records = [r for _, _, r in letters.read_queue(0)]
        time.sleep(0.2)
    reasons = sorted(r["error"] for r in records)
    assert len(records) == 2
    assert "does not parse" in reasons[1] or "does not parse" in reasons[0]
    assert any("split" in r for r in reasons)
    assert all(r["topology"] == topology_id and r["txid"] >= 0 for r in records)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        dead = sum(t.dead_letters for t in describe_topology(zk_store, topology_id).tasks)
        if dead == 2:
            break
        time.sleep(0.2)
    assert dead == 2


def _start_worker(zk_config, cluster, spark):
    settings = WorkerSettings(host="127.0.0.1", port=free_port(), trigger_seconds=0.2, heartbeat_interval_s=0.5)
    w = Worker(zk_config, cluster, settings, spark_factory=lambda: spark)
    stop = threading.Event()
    thread = threading.Thread(target=w.run, args=(stop,), daemon=True)
    thread.start()
    return w, stop, thread


def _wait(predicate, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(0.1)


def test_rebalance_moves_tasks_and_deactivate_activate_pause_and_resume(worker, zk_store, zk_config, tmp_path, spark):
    from stream_ops.nimbus import activate, deactivate, live_workers
    from stream_ops.nimbus.rebalance import rebalance

    topology = build_wordcount(tmp_path / "input")
    topology_id = submit(zk_store, worker.cluster, topology, workers=2)
    topic = topology.chains[0].source.topic
    sent = list(SAMPLE_SENTENCES)
    produce(topic, ({"sentence": s} for s in sent))
    wait_for_counts(zk_store, "wordcount", "words", expected_word_counts(sent), timeout_s=60)

    second, stop, thread = _start_worker(zk_config, worker.cluster, spark)
    try:
        _wait(lambda: len(live_workers(zk_store)) == 2, 30, "second worker registered")
        rebalance(zk_store, topology_id)
        _wait(lambda: len(second.running_tasks) == 2 and len(worker.running_tasks) == 2, 60, "two tasks moved")
        owners = {t.task_id: t.owner for t in describe_topology(zk_store, topology_id).tasks}
        assert sorted(set(owners.values())) == sorted([worker.worker_id, second.worker_id])

        more = ["how are you"] * 4
        produce(topic, ({"sentence": s} for s in more))
        sent += more
        wait_for_counts(zk_store, "wordcount", "words", expected_word_counts(sent), timeout_s=60)

        deactivate(zk_store, "wordcount")
        _wait(lambda: not worker.running_tasks and not second.running_tasks, 30, "tasks stopped")
        assert all(t.owner is None for t in describe_topology(zk_store, topology_id).tasks)
        paused = ["nice to meet you"] * 3
        produce(topic, ({"sentence": s} for s in paused))
        sent += paused
        activate(zk_store, "wordcount")
        wait_for_counts(zk_store, "wordcount", "words", expected_word_counts(sent), timeout_s=60)
    finally:
        stop.set()
        thread.join(60)
