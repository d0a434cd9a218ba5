"""Topologies reading Kafka through real worker processes (Spark with the Kafka connector) and
a real ZooKeeper: a two-partition topic counted exactly per key, offsets recorded with each
commit, lag measured, a value that is not JSON sent to the dead letters, and counts written
back to Kafka through the exactly-once sink."""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

from confluent_kafka import Producer
from topic_reader import read_messages

from stream_ops import Count, OpaqueMapState, Topology
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import TransactionalRecord
from stream_ops.kafka.embedded import EmbeddedKafka
from stream_ops.local_stack import wait_for_counts
from stream_ops.nimbus import describe_topology, submit
from stream_ops.sources import KafkaTopic
from stream_ops.topology.layout import TopologyLayout

TIMEOUT_S = 120


def _produce(kafka: EmbeddedKafka, topic: str, values: list[tuple[int, str | None]]) -> None:
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for partition, value in values:
        producer.produce(topic, value=value, partition=partition)
    assert producer.flush(30) == 0


def _word_count(name: str, kafka: EmbeddedKafka, topic: str) -> Topology:
    topology = Topology(name)
    words = topology.source("words", KafkaTopic(kafka.bootstrap_servers, topic), schema={"word": "string"})
    counts = words.group_by("word").persistent_aggregate(Count(), out="count", state=OpaqueMapState)
    topology.query("counts", counts)
    return topology


def _wait(predicate: Any, what: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.3)


def test_a_two_partition_topic_is_counted_exactly_per_key(kafka, kafka_workers, kafka_store, topic_name) -> None:
    kafka.create_topic(topic_name, partitions=2)
    first = [(0, "how"), (1, "are"), (0, "you"), (1, "how"), (0, "how"), (1, "you")]
    _produce(kafka, topic_name, [(p, json.dumps({"word": w})) for p, w in first])
    topology = _word_count("kafka-count", kafka, topic_name)
    source = topology.chains[0].source
    assert source is not None and source.spec.queues is None  # read from the broker when submitted, below
    topology_id = submit(kafka_store, kafka_workers.cluster, topology, workers=1)
    wait_for_counts(kafka_store, topology.name, "counts", dict(Counter(w for _, w in first)), timeout_s=TIMEOUT_S)

    second = [(1, "how"), (0, "nice"), (1, "nice"), (0, "day")]
    _produce(kafka, topic_name, [(p, json.dumps({"word": w})) for p, w in second])
    truth = Counter(w for _, w in first + second)
    wait_for_counts(kafka_store, topology.name, "counts", dict(truth), timeout_s=TIMEOUT_S)

    # Each source task committed Spark's end offset of its own partition with its last txid.
    source_tasks = [t for t in describe_topology(kafka_store, topology_id).tasks if t.stage == 0]
    assert sorted(t.queue for t in source_tasks) == [0, 1]
    ends = {0: 5, 1: 5}

    def offsets_committed() -> bool:
        for task in source_tasks:
            found = kafka_store.get_json(ZkPaths.transactional_task(topology_id, task.task_id))
            record = TransactionalRecord.model_validate(found[0]) if found else None
            if record is None or record.offsets != [{topic_name: {str(task.queue): ends[task.queue]}}]:
                return False
        return True

    _wait(offsets_committed, "the source tasks' commits to record their partitions' end offsets")

    # Lag: the partitions' end offsets less what the queries read, in the heartbeats.
    def lag_records() -> list[int | None]:
        return [t.lag_records for t in describe_topology(kafka_store, topology_id).tasks if t.stage == 0]

    _wait(lambda: lag_records() == [0, 0], "both source tasks to report no lag")


def test_a_value_that_does_not_parse_is_a_dead_letter(kafka, kafka_workers, kafka_store, topic_name) -> None:
    kafka.create_topic(topic_name, partitions=2)
    values = [
        (0, json.dumps({"word": "fine"})),
        (1, "not json at all"),
        (1, json.dumps({"word": "fine"})),
        (0, '{"word": "cut sh'),
        (1, None),  # a tombstone: a record whose fields are null
    ]
    _produce(kafka, topic_name, values)
    topology = Topology("kafka-dead")
    words = topology.source("words", KafkaTopic(kafka.bootstrap_servers, topic_name, partitions=2), schema={"word": "string"})
    counts = words.group_by("word").persistent_aggregate(Count(), out="count", state=OpaqueMapState)
    topology.query("counts", counts)
    topology_id = submit(kafka_store, kafka_workers.cluster, topology, workers=1)
    wait_for_counts(kafka_store, topology.name, "counts", {"fine": 2}, timeout_s=TIMEOUT_S)

    letters = TopologyLayout(kafka_workers.cluster, topology_id).dead_letter_topic()
    found: list[dict[str, Any]] = []

    def two_letters() -> bool:
        found[:] = [record for queue in range(letters.queues) for _, _, record in letters.read_queue(queue)]
        return len(found) >= 2

    _wait(two_letters, "two dead letters")
    assert sorted(r["record"] for r in found) == sorted(["not json at all", '{"word": "cut sh'])
    assert all(r["error"] == "does not parse against the source schema" and r["topology"] == topology_id for r in found)
    _wait(
        lambda: sum(t.dead_letters for t in describe_topology(kafka_store, topology_id).tasks) == 2,
        "the heartbeats to count two dead letters",
    )


def test_a_source_starts_at_a_timestamp_and_reports_its_lag_while_it_catches_up(
    kafka, kafka_workers, kafka_store, topic_name
) -> None:
    kafka.create_topic(topic_name, partitions=1)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    start = 1_700_000_000_000
    for i in range(16):  # timestamps start-8 s ... start+7 s: the first eight are before the start
        producer.produce(topic_name, value=json.dumps({"word": "old" if i < 8 else "new"}), timestamp=start + (i - 8) * 1000)
    assert producer.flush(30) == 0
    topology = Topology("kafka-from-ts")
    source = KafkaTopic(
        kafka.bootstrap_servers, topic_name, starting_offsets={"timestamp": start}, max_offsets_per_trigger=2, partitions=1
    )
    words = topology.source("words", source, schema={"word": "string"})
    topology.query("counts", words.group_by("word").persistent_aggregate(Count(), out="count", state=OpaqueMapState))
    topology_id = submit(kafka_store, kafka_workers.cluster, topology, workers=1)

    # Two records per batch: the heartbeats see records left to read before the last batch.
    seen: set[int] = set()

    def caught_up() -> bool:
        lag = [t.lag_records for t in describe_topology(kafka_store, topology_id).tasks if t.stage == 0][0]
        if lag is not None:
            seen.add(lag)
        return lag == 0

    _wait(caught_up, "the source task to read up to the end")
    assert max(seen) > 0, f"no lag was ever reported: {seen}"
    wait_for_counts(kafka_store, topology.name, "counts", {"new": 8, "old": None}, timeout_s=TIMEOUT_S)


def test_kafka_to_count_to_kafka_writes_every_new_value_once_for_read_committed_consumers(
    kafka, kafka_workers, kafka_store, topic_name
) -> None:
    kafka.create_topic(topic_name, partitions=2)
    out = f"{topic_name}-counts"
    topology = Topology("kafka-to-kafka")
    words = topology.source("words", KafkaTopic(kafka.bootstrap_servers, topic_name), schema={"word": "string"})
    counts = words.group_by("word").persistent_aggregate(Count(), out="count", state=OpaqueMapState)
    counts.new_values().to_kafka(kafka.bootstrap_servers, out, key="word", partitions=2, name="counts-out")
    topology.query("counts", counts)
    submit(kafka_store, kafka_workers.cluster, topology, workers=1)

    first = [(0, "how"), (1, "are"), (0, "you"), (1, "how"), (0, "how")]
    second = [(1, "you"), (0, "nice"), (1, "how")]
    _produce(kafka, topic_name, [(p, json.dumps({"word": w})) for p, w in first])
    wait_for_counts(kafka_store, topology.name, "counts", dict(Counter(w for _, w in first)), timeout_s=TIMEOUT_S)
    _produce(kafka, topic_name, [(p, json.dumps({"word": w})) for p, w in second])
    truth = Counter(w for _, w in first + second)
    wait_for_counts(kafka_store, topology.name, "counts", dict(truth), timeout_s=TIMEOUT_S)

    # new_values() emits each updated key's count once per batch: per key (one partition, in
    # order) the counts rise strictly, a doubled batch would repeat one, and the last is the truth.
    per_word: dict[str, list[int]] = {}

    def delivered() -> bool:
        per_word.clear()
        for message in read_messages(kafka.bootstrap_servers, out):
            record = json.loads(message.value or b"")
            assert message.key == record["word"].encode()
            per_word.setdefault(record["word"], []).append(record["count"])
        return {w: c[-1] for w, c in per_word.items()} == dict(truth)

    _wait(delivered, "the Kafka sink to deliver the final counts")
    for word, seen in per_word.items():
        assert seen == sorted(set(seen)), f"{word}: counts {seen} repeat or fall"


def test_client_settings_reach_spark_and_env_values_are_read_on_the_worker(kafka, kafka_workers, kafka_store, topic_name) -> None:
    kafka.create_topic(topic_name, partitions=1)
    _produce(kafka, topic_name, [(0, json.dumps({"word": w})) for w in ("a", "b", "a")])

    def count(name: str, **settings: Any) -> Topology:
        topology = Topology(name)
        source = KafkaTopic(kafka.bootstrap_servers, topic_name, partitions=1, **settings)
        words = topology.source("words", source, schema={"word": "string"})
        topology.query("counts", words.group_by("word").persistent_aggregate(Count(), out="count", state=OpaqueMapState))
        return topology

    given = count(
        "kafka-settings",
        spark_options={"security.protocol": "PLAINTEXT", "kafka.client.id": "stream-ops-settings-test"},
        client_config={"client.id": "env:PATH"},
    )
    submit(kafka_store, kafka_workers.cluster, given, workers=1)
    wait_for_counts(kafka_store, given.name, "counts", {"a": 2, "b": 1}, timeout_s=TIMEOUT_S)

    # A setting naming a variable the worker does not have stops the task with that reason.
    missing = count("kafka-settings-missing", spark_options={"security.protocol": "env:STREAM_OPS_TEST_UNSET_VARIABLE"})
    topology_id = submit(kafka_store, kafka_workers.cluster, missing, workers=1)

    def reason() -> str:
        return " ".join(t.last_error or "" for t in describe_topology(kafka_store, topology_id).tasks)

    _wait(lambda: "STREAM_OPS_TEST_UNSET_VARIABLE" in reason(), "the task to fail naming the unset variable")
    assert "which is not set" in reason()
