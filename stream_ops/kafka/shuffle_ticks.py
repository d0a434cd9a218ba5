"""Tick rows into a task's own shuffle partition, when its shuffle is kept in Kafka.

A window or trigger stage needs a batch now and then although no data arrives (its
processing-time windows close); with the file shuffle the task writes a tick file into its own
queue, with the Kafka shuffle it produces the same tick row into its own partition. A tick is
written outside any transaction (an idempotent producer, acknowledged by all in-sync replicas),
so ``read_committed`` readers see it at once; like a tick file it carries no data, and once a
batch read it its offset range holds it for every replay.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from stream_ops.errors import KafkaShuffleError
from stream_ops.kafka.client import client_config
from stream_ops.kafka.shuffle_options import KafkaShuffle
from stream_ops.kafka.shuffle_writer import encode_row

logger = logging.getLogger(__name__)


class TickProducer:
    """Writes tick rows into partitions of one shuffle topic (one producer, made at first use)."""

    def __init__(self, shuffle: KafkaShuffle, topic: str) -> None:
        self.shuffle = shuffle
        self.topic = topic
        self._producer: Any = None

    def send(self, partition: int, row: Mapping[str, Any]) -> None:
        """Write ``row`` to ``partition`` and wait for the brokers' acknowledgement.

        Raises:
            KafkaShuffleError: the row was refused or not acknowledged in the shuffle's timeout.
        """
        from confluent_kafka import Producer

        if self._producer is None:
            settings = {**self.shuffle.client_config(), "enable.idempotence": True, "acks": "all"}
            self._producer = Producer(client_config(self.shuffle.bootstrap, **settings))
        failures: list[str] = []

        def delivered(error: Any, _message: Any) -> None:
            if error is not None:
                failures.append(str(error))

        self._producer.produce(self.topic, value=encode_row(row), partition=partition, on_delivery=delivered)
        left = self._producer.flush(self.shuffle.timeout_s)
        if left or failures:
            reason = failures[0] if failures else "not acknowledged in time"
            raise KafkaShuffleError(f"tick into {self.topic!r} partition {partition}: {reason}")
        logger.debug("tick into %s partition %d", self.topic, partition)

    def close(self) -> None:
        """Drop the producer (a tick is flushed when it is sent)."""
        self._producer = None
