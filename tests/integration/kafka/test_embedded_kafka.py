"""The embedded Kafka broker: it starts from the fetched jars, serves producers and consumers,
and stops with its whole process group."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from stream_ops import Count, OpaqueMapState, Topology
from stream_ops.dsl.build_plan import build_plan
from stream_ops.errors import KafkaServerError, SourceError
from stream_ops.kafka.embedded import EmbeddedKafka, random_cluster_id
from stream_ops.sources import KafkaTopic, source_spec

logger = logging.getLogger(__name__)


def test_the_broker_serves_producers_and_consumers(kafka: EmbeddedKafka, topic_name: str) -> None:
    logger.info("the session's broker was ready %.2f s after its JVM started", kafka.started_in_s)
    kafka.create_topic(topic_name, partitions=2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "enable.idempotence": True})
    sent = {(p, f"k{i}", f"v{i}") for i in range(10) for p in (i % 2,)}
    for partition, key, value in sorted(sent):
        producer.produce(topic_name, key=key, value=value, partition=partition)
    assert producer.flush(30) == 0

    consumer = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": topic_name, "auto.offset.reset": "earliest"})
    try:
        # explicit start offsets: no committed offsets to fetch from a group coordinator
        consumer.assign([TopicPartition(topic_name, 0, 0), TopicPartition(topic_name, 1, 0)])
        received: set[tuple[int, str, str]] = set()
        for _ in range(100):
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                received.add((message.partition(), message.key().decode(), message.value().decode()))
            if len(received) == len(sent):
                break
        assert received == sent
        assert [consumer.get_watermark_offsets(TopicPartition(topic_name, p), timeout=10) for p in (0, 1)] == [(0, 5), (0, 5)]
    finally:
        consumer.close()


def test_a_kafka_source_reads_the_partition_count_from_the_broker_when_the_plan_is_built(
    kafka: EmbeddedKafka, topic_name: str
) -> None:
    kafka.create_topic(topic_name, partitions=3)
    assert source_spec(KafkaTopic(kafka.bootstrap_servers, topic_name), ["a"]).queues is None  # defined: not asked yet
    topology = Topology("kafka-partitions")
    topology.source("lines", KafkaTopic(kafka.bootstrap_servers, topic_name), schema=["a"]).group_by("a").persistent_aggregate(
        Count(), out="n", state=OpaqueMapState
    )
    plan = build_plan(topology)
    assert [stage.queues for stage in plan.stages] == [3, 3] and plan.stages[0].source.queues == 3  # type: ignore[union-attr]
    missing = Topology("kafka-missing")
    missing.source("lines", KafkaTopic(kafka.bootstrap_servers, "missing-topic"), schema=["a"]).print()
    with pytest.raises(SourceError, match="has no topic 'missing-topic'.*create the topic"):
        build_plan(missing)


def test_creating_an_existing_topic_says_so(kafka: EmbeddedKafka, topic_name: str) -> None:
    kafka.create_topic(topic_name)
    with pytest.raises(KafkaServerError, match="already exists"):
        kafka.create_topic(topic_name)


def test_a_broker_starts_formatted_and_stops_with_its_process_group(tmp_path: Path, kafka_broker_jars: list[Path]) -> None:
    broker = EmbeddedKafka(tmp_path / "kafka", jars=kafka_broker_jars)
    with broker:
        pid, port = broker.pid, broker.port
        assert pid is not None and broker.is_serving()
        assert broker.cluster_id is not None and (broker.log_dir / "meta.properties").exists()
        assert broker.started_in_s is not None and broker.started_in_s < 60
        logger.info("a fresh broker was ready %.2f s after its JVM started", broker.started_in_s)
    assert not broker.running
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # no process of the group is left
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0


def test_cluster_ids_look_like_kafkas() -> None:
    ids = {random_cluster_id() for _ in range(50)}
    assert len(ids) == 50
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)
