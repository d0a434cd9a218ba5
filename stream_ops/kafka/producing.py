"""Writing records to a Kafka topic from Python: the local stack's and the demo's feeder."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from stream_ops.errors import KafkaServerError
from stream_ops.kafka.client import client_config


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
