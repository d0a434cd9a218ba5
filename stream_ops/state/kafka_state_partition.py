"""Reading and writing one partition of a Kafka state topic (confluent-kafka clients).

:class:`StatePartition` creates the topic if it is missing (and checks the settings the replay
rule relies on), appends a batch's records with an idempotent ``acks=all`` producer and returns
only once the brokers acknowledged every one of them, reads the records from an offset up to
the partition's end, and truncates the partition below an offset a snapshot covers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from stream_ops.errors import ConfigError, KafkaServerError, StateError, StateTopicTruncatedError
from stream_ops.kafka.client import client_config, ensure_topic, resolve_env_settings
from stream_ops.state.kafka_state_records import KafkaRecord, OutgoingRecord

logger = logging.getLogger(__name__)

TOPIC_CONFIG: dict[str, str] = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}
"""What a state topic must be: nothing is deleted by the brokers, only truncated by a compaction
once a snapshot covers it (see :mod:`stream_ops.state.kafka_state_topic`)."""

_READ_BATCH = 10_000
_POLL_S = 0.2


def resolved_client_config(config: Mapping[str, str]) -> dict[str, str]:
    """``config`` with each ``env:NAME`` value read from the environment (secrets stay out of the conf).

    Raises:
        ConfigError: a named variable is not set.
    """
    return resolve_env_settings(config, what="state topic client", error=ConfigError)


class StatePartition:
    """One partition of a Kafka state topic.

    Args:
        bootstrap: the brokers.
        topic: the state topic.
        partition: the partition (the queue).
        partitions: the topic's partitions (the stage's queues), to create it with.
        client: extra librdkafka settings (SASL, TLS), ``env:NAME`` values resolved.
        replication_factor: replicas to create the topic with (None: the brokers' default).
        timeout_s: how long a produce, read or admin call may take.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partition: int,
        *,
        partitions: int,
        client: Mapping[str, str] | None = None,
        replication_factor: int | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.partition = partition
        self.partitions = partitions
        self.client = dict(client or {})
        self.replication_factor = replication_factor
        self.timeout_s = timeout_s
        self._checked = False
        self._producer: Any = None
        self._consumer: Any = None

    @property
    def where(self) -> str:
        return f"kafka:{self.topic}/{self.partition}"

    # --- the topic ----------------------------------------------------------------------

    def ensure(self) -> None:
        """Create the topic if missing; check it has the partition and never deletes records by itself.

        Raises:
            ConfigError: the topic exists with a cleanup policy or retention that could delete
                records a restore needs, or too few partitions.
            KafkaServerError: the brokers did not answer.
        """
        if self._checked:
            return
        count = ensure_topic(
            self.bootstrap,
            self.topic,
            partitions=self.partitions,
            replication_factor=self.replication_factor,
            topic_config=TOPIC_CONFIG,
            config=self.client,
            timeout_s=self.timeout_s,
        )
        if count <= self.partition:
            raise ConfigError(f"state topic {self.topic!r} has {count} partitions; queue {self.partition} needs more")
        found = self._topic_config()
        wrong = {name: found.get(name) for name, value in TOPIC_CONFIG.items() if found.get(name) != value}
        if wrong:
            raise ConfigError(
                f"state topic {self.topic!r} has {wrong}, but must keep every record until a snapshot covers it "
                f"({TOPIC_CONFIG}): a key-compacted or time-limited topic can drop entries a restore needs. "
                f"Alter the topic's configuration to that, or delete it before the topology's first batch"
            )
        self._checked = True

    def _topic_config(self) -> dict[str, str]:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

        admin = AdminClient(client_config(self.bootstrap, **self.client))
        resource = ConfigResource(ResourceType.TOPIC, self.topic)
        try:
            entries = admin.describe_configs([resource], request_timeout=self.timeout_s)[resource].result(self.timeout_s)
        except KafkaException as e:
            raise KafkaServerError(f"Kafka at {self.bootstrap}: could not read the settings of {self.topic!r}: {e}") from e
        return {name: entry.value for name, entry in entries.items()}

    # --- writing ------------------------------------------------------------------------

    def append(self, records: list[OutgoingRecord]) -> int:
        """Produce ``records`` in order and wait until the brokers acknowledged all (``acks=all``).

        Returns:
            The bytes of their keys and values.

        Raises:
            StateError: a record was refused or not acknowledged in time; the batch is not
                durable. The producer is dropped (a new one is made for the next batch).
        """
        self.ensure()
        producer = self._producer
        if producer is None:
            from confluent_kafka import Producer

            settings = {
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 2,
                "message.timeout.ms": int(self.timeout_s * 1000),
            }
            producer = self._producer = Producer(client_config(self.bootstrap, **self.client, **settings))
        failures: list[str] = []

        def delivered(error: Any, _message: Any) -> None:
            if error is not None:
                failures.append(str(error))

        size = 0
        try:
            for record in records:
                size += len(record.key or b"") + len(record.value or b"")
                while True:
                    try:
                        producer.produce(
                            self.topic,
                            key=record.key,
                            value=record.value,
                            partition=self.partition,
                            headers=record.headers,
                            on_delivery=delivered,
                        )
                        break
                    except BufferError:  # the local queue is full: let it drain
                        producer.poll(0.05)
            left = producer.flush(self.timeout_s)
        except Exception as e:  # noqa: BLE001 - KafkaException, a record too large: the batch is not durable
            failures.append(f"{type(e).__name__}: {e}")
            left = 0
        if left or failures:
            self._drop_producer()
            reason = failures[0] if failures else f"{left} records not acknowledged in {self.timeout_s:.0f} s"
            raise StateError(f"state topic {self.where}: the batch is not durable ({reason}); it is not committed")
        return size

    def _drop_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.purge()
            producer.flush(0)

    # --- reading ------------------------------------------------------------------------

    def watermarks(self) -> tuple[int, int]:
        """(low, high): the first offset kept and the offset the next record gets.

        Raises:
            KafkaServerError: the brokers did not answer in time.
        """
        from confluent_kafka import KafkaException, TopicPartition

        consumer = self._reader()
        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(self.topic, self.partition), timeout=self.timeout_s, cached=False
            )
        except KafkaException as e:
            raise KafkaServerError(f"state topic {self.where}: offsets not read from {self.bootstrap}: {e}") from e
        return int(low), int(high)

    def read(self, start: int) -> tuple[list[KafkaRecord], int]:
        """Every record from offset ``start`` up to the partition's end now.

        Returns:
            (the records in offset order, the offset after the last one that was due).

        Raises:
            StateTopicTruncatedError: ``start`` is below the partition's first offset (compacted).
            StateError: the records were not all read in time.
        """
        from confluent_kafka import KafkaError, TopicPartition

        self.ensure()
        low, high = self.watermarks()
        if start < low:
            raise StateTopicTruncatedError(f"state topic {self.where} starts at offset {low} now, above {start}")
        if start >= high:
            return [], start
        consumer = self._reader()
        consumer.assign([TopicPartition(self.topic, self.partition, start)])
        records: list[KafkaRecord] = []
        deadline = time.monotonic() + self.timeout_s
        position = start
        try:
            while position < high:
                if time.monotonic() > deadline:  # no progress for timeout_s
                    raise StateError(
                        f"state topic {self.where}: read {len(records)} records up to offset {position} of {high} in "
                        f"{self.timeout_s:.0f} s; the brokers are too slow or unreachable"
                    )
                before = position
                for message in consumer.consume(num_messages=_READ_BATCH, timeout=_POLL_S):
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            position = max(position, high) if message.offset() >= high else position
                            continue
                        if error.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                            raise StateTopicTruncatedError(f"state topic {self.where} was truncated while being read")
                        raise StateError(f"state topic {self.where}: reading failed: {error}")
                    if message.offset() >= high:
                        position = high
                        break
                    records.append(KafkaRecord.from_message(message))
                    position = message.offset() + 1
                if position > before:
                    deadline = time.monotonic() + self.timeout_s
        finally:
            consumer.unassign()
        return records, high

    def _reader(self) -> Any:
        if self._consumer is None:
            from confluent_kafka import Consumer

            settings = {
                "group.id": f"stream-ops-state-{self.topic}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "error",
                "isolation.level": "read_uncommitted",
                "enable.partition.eof": True,
            }
            self._consumer = Consumer(client_config(self.bootstrap, **self.client, **settings))
        return self._consumer

    # --- compaction ---------------------------------------------------------------------

    def truncate(self, before: int) -> int:
        """Delete the records below offset ``before`` (a snapshot covers them); returns the new first offset.

        Raises:
            KafkaServerError: the brokers refused or did not answer.
        """
        from confluent_kafka import KafkaException, TopicPartition
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(client_config(self.bootstrap, **self.client))
        target = TopicPartition(self.topic, self.partition, before)
        try:
            futures = admin.delete_records([target], request_timeout=self.timeout_s, operation_timeout=self.timeout_s)
            deleted = next(iter(futures.values())).result(self.timeout_s)
        except KafkaException as e:
            raise KafkaServerError(f"state topic {self.where}: records below offset {before} not deleted: {e}") from e
        return int(deleted.low_watermark)

    def close(self) -> None:
        """Close the clients (flushing nothing: every append waited for its records)."""
        self._drop_producer()
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()
