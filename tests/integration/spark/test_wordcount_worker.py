"""Word count through a real worker: real ZooKeeper, real Spark, exact counts, dead letters."""

from __future__ import annotations

import time

import pytest

from stream_ops import MapState, OpaqueMapState, TransactionalMapState
from stream_ops.coordination.paths import ZkPaths
from stream_ops.examples.wordcount import SAMPLE_SENTENCES, build_wordcount
from stream_ops.local_stack import expected_word_counts, wait_for_counts
from stream_ops.nimbus import describe_topology, submit
from stream_ops.runtime.worker import Worker
from stream_ops.state.state_topic import StateTopicQueue
from stream_ops.topics.producer import produce
from stream_ops.topology.layout import TopologyLayout


@pytest.fixture
def worker(worker_pool, zk_store, wait_until) -> Worker:
    """One in-process worker, registered."""
    w = worker_pool.start()
    wait_until(lambda: w.worker_id in zk_store.children(ZkPaths.WORKERS), 30, "worker registered")
    return w


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


def test_rebalance_moves_tasks_and_deactivate_activate_pause_and_resume(worker, worker_pool, zk_store, tmp_path, wait_until):
    from stream_ops.nimbus import activate, deactivate, live_workers
    from stream_ops.nimbus.rebalance import rebalance

    topology = build_wordcount(tmp_path / "input")
    topology_id = submit(zk_store, worker.cluster, topology, workers=2)
    topic = topology.chains[0].source.topic
    sent = list(SAMPLE_SENTENCES)
    produce(topic, ({"sentence": s} for s in sent))
    wait_for_counts(zk_store, "wordcount", "words", expected_word_counts(sent), timeout_s=60)

    second = worker_pool.start()
    wait_until(lambda: len(live_workers(zk_store)) == 2, 30, "second worker registered")
    rebalance(zk_store, topology_id)
    wait_until(lambda: len(second.running_tasks) == 2 and len(worker.running_tasks) == 2, 60, "two tasks moved")
    owners = {t.task_id: t.owner for t in describe_topology(zk_store, topology_id).tasks}
    assert sorted(set(owners.values())) == sorted([worker.worker_id, second.worker_id])

    more = ["how are you"] * 4
    produce(topic, ({"sentence": s} for s in more))
    sent += more
    wait_for_counts(zk_store, "wordcount", "words", expected_word_counts(sent), timeout_s=60)

    deactivate(zk_store, "wordcount")
    wait_until(lambda: not worker.running_tasks and not second.running_tasks, 30, "tasks stopped")
    # a runner leaves running_tasks when its stop starts; its owner node goes when the stop ends
    wait_until(lambda: all(t.owner is None for t in describe_topology(zk_store, topology_id).tasks), 30, "owners released")
    paused = ["nice to meet you"] * 3
    produce(topic, ({"sentence": s} for s in paused))
    sent += paused
    activate(zk_store, "wordcount")
    wait_for_counts(zk_store, "wordcount", "words", expected_word_counts(sent), timeout_s=60)
