"""Join, processing-element and Trident-state topologies on a real worker (Spark + ZooKeeper).

Each operator also survives a move of its task mid-window: the worker running it stops (its
tasks are released), a second worker takes them over and rebuilds the operator state (join
window buffer, processing elements) from the state topic.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from stream_ops.errors import QueryError
from stream_ops.examples.counter_pe import build_counter
from stream_ops.examples.uuid_join import build_uuid_join
from stream_ops.examples.wordcount_db import build_wordcount_db
from stream_ops.local_stack import wait_for_counts
from stream_ops.nimbus import describe_topology, live_workers, submit
from stream_ops.nimbus.assignment import reassign
from stream_ops.runtime.query_client import query_state
from stream_ops.topics.producer import produce


@pytest.fixture
def workers(worker_pool):
    return worker_pool


def _move_everything(zk_store, workers, topology_id, old, wait_until):
    """Start a second worker, stop the first: the monitor's reassignment, done by hand."""
    new = workers.start()
    wait_until(lambda: new.worker_id in live_workers(zk_store), 30, "new worker registered")
    workers.stop(old)
    wait_until(lambda: old.worker_id not in live_workers(zk_store), 30, "old worker gone")
    reassign(zk_store, topology_id)
    wait_until(
        lambda: all(t.owner == new.worker_id for t in describe_topology(zk_store, topology_id).tasks),
        60,
        "tasks owned by the new worker",
    )
    return new


def test_uuid_join_counts_joined_words_across_a_move_mid_window(workers, zk_store, tmp_path, wait_until):
    first = workers.start()
    wait_until(lambda: live_workers(zk_store), 30, "worker registered")
    topology = build_uuid_join(tmp_path / "in", window=8)
    topology_id = submit(zk_store, workers.cluster, topology, workers=1)
    spout1, spout2 = (c.source.topic for c in topology.chains)
    words = {"u1": "how", "u2": "are", "u3": "how", "u4": "you"}
    # Half of the window (4 of 8 records) arrives before the move ...
    produce(spout1, [{"uuid": u, "word": w} for u, w in words.items()])
    wait_until(
        lambda: all(t.committed_txid >= 0 for t in describe_topology(zk_store, topology_id).tasks if t.stage == 2),
        60,
        "join task committed the first half",
    )
    _move_everything(zk_store, workers, topology_id, first, wait_until)
    # ... the rest after it: the new owner must have restored the buffered half.
    produce(spout2, [{"uuid": u, "timestamp": i} for i, u in enumerate(words)])
    wait_for_counts(zk_store, topology.name, "joined_words", {"how": 2, "are": 1, "you": 1}, timeout_s=60)


def test_counter_pe_keeps_its_count_across_a_move(workers, zk_store, tmp_path, wait_until):
    first = workers.start()
    wait_until(lambda: live_workers(zk_store), 30, "worker registered")
    topology = build_counter(tmp_path / "in")
    topology_id = submit(zk_store, workers.cluster, topology, workers=1)
    topic = topology.chains[0].source.topic
    produce(topic, [{"sentence": "how are you how are you how"}])  # how x3 -> emits 3; are/you x2 -> nothing yet
    wait_for_counts(zk_store, topology.name, "latest", {"how": 3}, timeout_s=60)
    assert query_state(zk_store, topology.name, "latest", [["are"]]) == {"are": None}
    _move_everything(zk_store, workers, topology_id, first, wait_until)
    produce(topic, [{"sentence": "are you"}])  # third event of are/you on the new owner: emits 3
    wait_for_counts(zk_store, topology.name, "latest", {"how": 3, "are": 3, "you": 3}, timeout_s=60)


@pytest.mark.parametrize("kind", ["transactional", "opaque", "non-transactional"])
def test_wordcount_db_partition_persist_and_state_query(workers, zk_store, tmp_path, kind, wait_until):
    workers.start()
    wait_until(lambda: live_workers(zk_store), 30, "worker registered")
    topology = build_wordcount_db(tmp_path / "in", kind=kind)
    submit(zk_store, workers.cluster, topology, workers=1)
    sentences, questions = (c.source.topic for c in topology.chains)
    text = ["how are you", "how do you do", "nice to meet you"]
    produce(sentences, [{"sentence": s} for s in text])
    truth = Counter(w for s in text for w in s.split())
    db = tmp_path / "in" / "db"
    wait_until(lambda: db.exists() and len(list(db.glob("*.sqlite"))) == 2, 60, "databases written")

    def answered():
        produce(questions, [{"word": w} for w in ("how", "you", "nice")])
        time.sleep(1.0)
        try:
            found = query_state(zk_store, topology.name, "answers", [["how"], ["you"], ["nice"]])
        except QueryError:
            return False
        return found == {"how": truth["how"], "you": truth["you"], "nice": truth["nice"]}

    wait_until(answered, 60, "state_query answers equal the counts")


def test_time_trigger_fires_without_new_data(workers, zk_store, tmp_path, wait_until):
    from stream_ops.operators import Trigger

    workers.start()
    wait_until(lambda: live_workers(zk_store), 30, "worker registered")
    topology = build_counter(tmp_path / "in", name="pe-timer", trigger=Trigger.every(1.0))
    submit(zk_store, workers.cluster, topology, workers=1)
    produce(topology.chains[0].source.topic, [{"sentence": "how are"}])
    # Only one event per key ever arrives: the counts can only come from tick-driven batches.
    wait_for_counts(zk_store, topology.name, "latest", {"how": 1, "are": 1}, timeout_s=60)
