"""Small confluent-kafka helpers: a topic's partition count and a partition's end offset.

The clients log through Python's ``logging`` (logger ``stream_ops.kafka.librdkafka``), not
librdkafka's own stderr lines, so a broker that is down does not flood a worker's output.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from stream_ops.errors import KafkaServerError

logger = logging.getLogger(__name__)
_client_logger = logging.getLogger("stream_ops.kafka.librdkafka")


def client_config(bootstrap: str, **extra: Any) -> dict[str, Any]:
    """confluent-kafka settings reaching ``bootstrap``, logging through :mod:`logging`."""
    return {"bootstrap.servers": bootstrap, "logger": _client_logger, **extra}


def partition_count(bootstrap: str, topic: str, *, timeout_s: float = 10.0) -> int:
    """How many partitions ``topic`` has on the cluster at ``bootstrap``.

    Raises:
        KafkaServerError: the cluster did not answer in ``timeout_s`` or has no such topic.
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(client_config(bootstrap))
    try:
        metadata = admin.list_topics(topic=topic, timeout=timeout_s)
    except KafkaException as e:
        raise KafkaServerError(f"Kafka at {bootstrap} did not answer in {timeout_s:.0f} s: {e}") from e
    found = metadata.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        why = f" ({found.error})" if found is not None and found.error is not None else ""
        raise KafkaServerError(f"Kafka at {bootstrap} has no topic {topic!r}{why}")
    return len(found.partitions)


class OffsetReader:
    """Reads partitions' end offsets with one consumer per bootstrap, shared by threads (a lock
    serialises the calls: a confluent-kafka client is not documented as thread-safe)."""

    def __init__(self) -> None:
        self._consumers: dict[str, Any] = {}
        self._lock = threading.Lock()

    def watermarks(self, bootstrap: str, topic: str, partition: int, *, timeout_s: float = 2.0) -> tuple[int, int] | None:
        """(low, high) offsets of the partition (high: the offset the next record gets), None
        when the broker does not answer in time."""
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        with self._lock:
            consumer = self._consumers.get(bootstrap)
            if consumer is None:
                config = client_config(bootstrap, **{"group.id": "stream-ops-offsets", "enable.auto.commit": False})
                consumer = self._consumers[bootstrap] = Consumer(config)
            try:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout_s, cached=False)
            except KafkaException as e:
                logger.debug("end offset of %s-%d at %s not read: %s", topic, partition, bootstrap, e)
                return None
        return int(low), int(high)
