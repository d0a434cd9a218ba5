"""Writing JSON records to a Kafka topic from Python, and reading them all back: the local stack's and
the demo's feeder and ground truth."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

from stream_ops.errors import KafkaServerError
from stream_ops.kafka.client import client_config, topic_partitions


def produce_json(
    bootstrap: str,
    topic: str,
    records: Iterable[Mapping[str, Any]],
    *,
    partitions: int | None = None,
    timeout_s: float = 30.0,
) -> int:
    """Write each record as a JSON value to ``topic`` and wait until the broker has them all.

    Args:
        bootstrap: the brokers.
        topic: an existing topic.
        records: the values.
        partitions: spread the records round-robin over partitions ``0..partitions-1``; None
            leaves the choice to the producer (sticky: one partition per batch of sends).
        timeout_s: how long to wait for the broker to acknowledge them.

    Returns:
        How many records were written.

    Raises:
        KafkaServerError: a record was refused, or not acknowledged in ``timeout_s``.
    """
    from confluent_kafka import KafkaError, Producer

    failures: list[str] = []

    def delivered(error: KafkaError | None, _message: Any) -> None:
        if error is not None:
            failures.append(str(error))

    producer = Producer(client_config(bootstrap, **{"enable.idempotence": True}))
    count = 0
    for count, record in enumerate(records, start=1):
        value = json.dumps(record, separators=(",", ":")).encode("utf-8")
        partition = -1 if partitions is None else (count - 1) % partitions  # -1: librdkafka's partitioner
        while True:
            try:
                producer.produce(topic, value=value, partition=partition, on_delivery=delivered)
                break
            except BufferError:  # the local queue is full: let the broker acknowledge some first
                producer.poll(0.1)
        producer.poll(0)
    left = producer.flush(timeout_s)
    if left or failures:
        reason = failures[0] if failures else f"{left} not acknowledged in {timeout_s:.0f} s"
        raise KafkaServerError(f"writing {count} records to {topic!r} at {bootstrap} failed: {reason}")
    return count


def read_json_records(bootstrap: str, topic: str, *, timeout_s: float = 30.0) -> list[Any]:
    """Every committed JSON value of ``topic`` from the start to its current end (no group joined).

    The demo's ground truth: what a topology reading the topic from the start must have counted.
    A topic that does not exist holds nothing. Values that are not JSON are skipped.

    Raises:
        KafkaServerError: the partitions could not be read to their end in ``timeout_s``.
    """
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    partitions = topic_partitions(bootstrap, topic, timeout_s=timeout_s)
    if not partitions:
        return []
    consumer = Consumer(
        client_config(
            bootstrap,
            **{
                "group.id": f"stream-ops-reader-{topic}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
            },
        )
    )
    values: list[Any] = []
    try:
        ends = {}
        for partition in range(partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout_s, cached=False)
            if high > low:
                ends[partition] = high
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        deadline = time.monotonic() + timeout_s
        while ends:
            if time.monotonic() > deadline:
                raise KafkaServerError(f"reading {topic!r} at {bootstrap}: partitions {sorted(ends)} not read to their end")
            for message in consumer.consume(num_messages=10_000, timeout=0.2):
                error = message.error()
                if error is not None and error.code() != KafkaError._PARTITION_EOF:
                    raise KafkaServerError(f"reading {topic!r} at {bootstrap}: {error}")
                if error is None:
                    try:
                        values.append(json.loads(message.value() or b""))
                    except ValueError:
                        pass
                partition = message.partition() or 0
                if (message.offset() or 0) + (error is None) >= ends.get(partition, 0):
                    ends.pop(partition, None)
    except KafkaException as e:
        raise KafkaServerError(f"reading {topic!r} at {bootstrap}: {e}") from e
    finally:
        consumer.close()
    return values
