"""Kafka in, Kafka out, under faults: a word count reading a Kafka topic, shuffling through
Kafka, keeping its state topic in Kafka and writing its ``new_values()`` to a Kafka topic
(exactly-once sink) keeps exact results while workers are
SIGKILLed, a worker is frozen past its ZooKeeper session (and thaws as a zombie) and the
nimbus process is SIGKILLed and restarted.

At the end the queried counts equal the ground truth computed from what was produced, and the
output topic read ``read_committed`` holds, per word, strictly increasing counts ending at the
ground truth: a batch delivered twice (a replay, a zombie's transaction) would repeat a count,
a lost one would leave the last count short.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from e2e_helpers import skip_without_kafka_jars, wait_for

from stream_ops import Count, OpaqueMapState, Topology
from stream_ops.coordination.store import ZkStore
from stream_ops.examples.wordcount import SAMPLE_SENTENCES
from stream_ops.kafka.client import client_config
from stream_ops.kafka.producing import produce_json
from stream_ops.kafka.shuffle_options import KafkaShuffle
from stream_ops.local_stack import LocalStack, expected_word_counts, wait_for_counts
from stream_ops.nimbus import describe_topology, submit
from stream_ops.runtime.processes import kill_group, spawn, stop_process
from stream_ops.sources import KafkaTopic
from stream_ops.state import KafkaStateTopic

SESSION_TIMEOUT_S = 4.0
PARTITIONS = 2
INPUT, OUTPUT = "sentences", "word-counts"


@pytest.fixture(scope="module", autouse=True)
def _kafka_jars() -> None:
    skip_without_kafka_jars()


def _topology(bootstrap: str) -> Topology:
    t = Topology("kafka_faults")
    words = t.source("sentences", KafkaTopic(bootstrap, INPUT, partitions=PARTITIONS), schema={"sentence": "string"}).select_expr(
        "explode(split(sentence, ' ')) AS word"
    )
    counts = words.group_by("word").persistent_aggregate(Count(), out="count", state=OpaqueMapState)
    t.query("words", counts)
    counts.new_values().to_kafka(bootstrap, OUTPUT, key="word")
    return t


def _feeder(bootstrap: str, sent: list[str], stop: threading.Event) -> None:
    i = 0
    while not stop.is_set():
        batch = list(SAMPLE_SENTENCES)[i % 8 :] + [f"unique{i} how"]
        produce_json(bootstrap, INPUT, ({"sentence": s} for s in batch), partitions=PARTITIONS)
        sent.extend(batch)
        i += 1
        time.sleep(0.1)


def _start_nimbus(stack: LocalStack) -> object:
    cmd = [sys.executable, "-m", "stream_ops.cli", "nimbus", "--insecure", "--interval", "0.5", "--task-timeout", "5"]
    return spawn(cmd, stack.home / "logs" / "nimbus.log", stack.env())


def _output_counts(bootstrap: str) -> dict[str, list[int]]:
    """Every count written per word, in offset order, as a ``read_committed`` consumer sees them."""
    consumer = Consumer(
        client_config(bootstrap, **{"group.id": "check", "isolation.level": "read_committed", "enable.auto.commit": False})
    )
    ends = [consumer.get_watermark_offsets(TopicPartition(OUTPUT, p), timeout=10)[1] for p in range(PARTITIONS)]
    consumer.assign([TopicPartition(OUTPUT, p, 0) for p in range(PARTITIONS)])
    seen: dict[str, list[int]] = defaultdict(list)
    positions = [0] * PARTITIONS
    deadline = time.monotonic() + 60
    while any(positions[p] < ends[p] for p in range(PARTITIONS)) and time.monotonic() < deadline:
        for message in consumer.consume(1000, timeout=0.5):
            if message.error() is not None:
                continue
            positions[message.partition()] = message.offset() + 1
            seen[message.key().decode()].append(int(json.loads(message.value())["count"]))
        # transaction markers hold offsets too: the committed position may stop short of the end
        positions = [max(positions[p], consumer.position([TopicPartition(OUTPUT, p)])[0].offset) for p in range(PARTITIONS)]
    consumer.close()
    return dict(seen)


def test_kafka_word_count_stays_exact_through_kills_a_zombie_and_a_nimbus_restart(tmp_path: Path, wait_until) -> None:
    args = ["--trigger-seconds", "0.3", "--heartbeat-interval", "0.5"]
    with LocalStack(
        home=tmp_path / "home", workers=3, worker_args=args, session_timeout_s=SESSION_TIMEOUT_S, nimbus=False, kafka=True
    ) as stack:
        assert stack.kafka_broker is not None
        bootstrap = stack.kafka_broker.bootstrap_servers
        stack.kafka_broker.create_topic(INPUT, PARTITIONS)
        stack.kafka_broker.create_topic(OUTPUT, PARTITIONS)
        nimbus = _start_nimbus(stack)
        topology = _topology(bootstrap)
        sent: list[str] = []
        stop = threading.Event()
        with ZkStore.connect(stack.zk_config) as store:
            on_kafka = {**KafkaStateTopic(bootstrap=bootstrap).to_conf(), **KafkaShuffle(bootstrap=bootstrap).to_conf()}
            topology_id = submit(store, stack.cluster, topology, workers=3, conf=on_kafka)
            feeder = threading.Thread(target=_feeder, args=(bootstrap, sent, stop))
            feeder.start()
            try:
                wait_until(
                    lambda: all(t.committed_txid >= 0 for t in describe_topology(store, topology_id).tasks), 90, "first commits"
                )

                # 1. SIGKILL a worker mid-stream.
                victim = stack.worker_processes[0]
                stack.kill_worker(victim)
                wait_until(
                    lambda: all(t.assigned_to != victim.worker_id for t in describe_topology(store, topology_id).tasks),
                    30,
                    "reassignment",
                )

                # 2. SIGKILL the nimbus and start another: the new one takes over the monitoring.
                kill_group(nimbus)
                nimbus.wait(10)
                nimbus = _start_nimbus(stack)
                time.sleep(2.0)

                # 3. Freeze a worker past its session: its tasks move; thawed, it is a zombie whose
                #    commits ZooKeeper refuses and whose Kafka transactions are fenced.
                frozen = stack.worker_processes[0]
                os.killpg(frozen.proc.pid, signal.SIGSTOP)
                try:
                    wait_until(
                        lambda: all(t.assigned_to != frozen.worker_id for t in describe_topology(store, topology_id).tasks),
                        40,
                        "reassignment after session expiry",
                    )
                finally:
                    os.killpg(frozen.proc.pid, signal.SIGCONT)

                # 4. Restart the killed worker on its slot.
                stack.start_worker(port=victim.port)
                time.sleep(3.0)
            finally:
                stop.set()
                feeder.join()

            expected = expected_word_counts(sent)
            wait_for_counts(store, topology.name, "words", expected, timeout_s=180, query_config=stack.query)
            epochs = [t.owner_epoch or 0 for t in describe_topology(store, topology_id).tasks]
            assert max(epochs) >= 2, "tasks really changed owners"
            data_files = [
                p
                for p in stack.home.rglob("*")
                if p.suffix in (".jsonl", ".arrow", ".parquet")
                and any(part.startswith(("state-", "shuffle-")) for part in p.parts)
            ]
            assert data_files == [], "the state topic or the shuffle went to files"

            seen = wait_for(
                lambda: (
                    (found := _output_counts(bootstrap))
                    and all(found.get(w, [0])[-1] == n for w, n in expected.items())
                    and found
                ),
                120,
                "the output topic to reach the ground truth",
            )
        stop_process(nimbus)
    assert set(seen) == set(expected)
    for word, counts in seen.items():
        assert counts == sorted(set(counts)), f"{word}: a count written twice or out of order: {counts}"
        assert counts[-1] == expected[word]
