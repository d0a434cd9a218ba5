"""Reading a whole Kafka topic in the tests, as a ``read_committed`` (or ``read_uncommitted``) consumer would."""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import Consumer, TopicPartition


@dataclass(frozen=True)
class Message:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]


def read_messages(bootstrap: str, topic: str, *, committed: bool = True, timeout_s: float = 40.0) -> list[Message]:
    """Every message of ``topic`` up to the end of each partition (for ``read_committed``, the
    last stable offset), in partition and offset order."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "test-reader",
            "isolation.level": "read_committed" if committed else "read_uncommitted",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,
        }
    )
    try:
        partitions = len(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        found: list[Message] = []
        at_end: set[int] = set()
        for _ in range(int(timeout_s / 0.2)):
            for message in consumer.consume(num_messages=1000, timeout=0.2):
                if message.error():
                    at_end.add(message.partition())
                    continue
                at_end.discard(message.partition())
                headers = {k: v for k, v in message.headers() or []}
                found.append(Message(message.partition(), message.offset(), message.key(), message.value(), headers))
            if len(at_end) == partitions:
                return sorted(found, key=lambda m: (m.partition, m.offset))
        raise AssertionError(
            f"{topic} was not read to its end in {timeout_s} s: {sorted(at_end)} of {partitions} partitions at the end"
        )
    finally:
        consumer.close()
