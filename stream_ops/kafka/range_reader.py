"""Read one partition's offset range on the driver, as Spark's Kafka source reads it.

A micro-batch of Spark's Kafka source reads, per partition, the offsets from the previous
batch's end up to its own, both fixed in Spark's offset log before the batch runs. A
:class:`RangeReader` reads exactly those records with confluent-kafka and gives them as an Arrow
table with the columns and types of Spark's Kafka source (:data:`SPARK_KAFKA_SCHEMA`): the
consumer is assigned the partition at the range's start and reads until its position reaches
the range's end (a record at or past the end, or the partition's end at or past it, ends the
read; nothing past the end is kept).

Isolation: the consumer reads with the isolation level of the Spark source's consumer
(``kafka.isolation.level``, whose default in the Java client is ``read_uncommitted``). Like
Spark's reader, librdkafka never returns transaction markers (control records), returns a
transaction's records once it is committed and never once it is aborted under
``read_committed``, and returns every data record, aborted or not, under
``read_uncommitted``. Spark planned the range's end below the partition's last stable offset
under ``read_committed`` (or its high watermark otherwise), so every record in the range is
decided and a replay of the batch reads the same records.

A range that cannot be read exactly gives None, never other records: records below it gone
(retention; Spark's ``failOnDataLoss`` decides what that means), a broker that does not answer
in time, an unexpected offset. The caller then leaves the batch to Spark, and the partition's
next batches for :data:`RETRY_AFTER_S`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa

from stream_ops.kafka.client import client_config

logger = logging.getLogger(__name__)

ISOLATION_LEVELS = ("read_uncommitted", "read_committed")
SPARK_ISOLATION_DEFAULT = "read_uncommitted"
"""The Java client's default ``isolation.level``, which Spark's Kafka source keeps unless told."""

READ_TIMEOUT_S = 5.0
"""How long a read may go without progress before it gives the range up (to Spark)."""
RETRY_AFTER_S = 60.0
"""How long a partition whose read failed is left to Spark before the driver tries again (a
broker it cannot reach, settings it lacks: no batch should wait for the timeout each time)."""
_CONSUME_BATCH = 10_000
_QUEUED_MESSAGES = 1_000_000
_POLL_S = 0.2

SPARK_KAFKA_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestampType", pa.int32()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ]
)
"""The columns of Spark's Kafka source with ``includeHeaders``, as Arrow types."""

# librdkafka's timestamp types (NOT_AVAILABLE, CREATE_TIME, LOG_APPEND_TIME) as the Java
# client's TimestampType ids Spark gives (NO_TIMESTAMP_TYPE -1, CREATE_TIME 0, LOG_APPEND_TIME 1).
_TIMESTAMP_TYPE_IDS = {0: -1, 1: 0, 2: 1}


def consumer_settings(bootstrap: str, topic: str, partition: int, isolation: str, config: Mapping[str, str]) -> dict[str, Any]:
    """The settings of the consumer reading ``topic``-``partition``'s ranges: the source's client
    ``config`` (SASL, TLS; it may tune the fetch too), under the settings an exact read needs."""
    tuning = {
        "fetch.wait.max.ms": 10,
        # librdkafka stops prefetching at 100,000 queued messages by default, and a larger range
        # then waits a fetch round trip per consume call: 200,000 records took 1.2 s, 0.4 s with
        # this (still capped by queued.max.messages.kbytes).
        "queued.min.messages": _QUEUED_MESSAGES,
    }
    exact = {
        "group.id": f"stream-ops-batch-{topic}-{partition}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
        "isolation.level": isolation,
        "enable.partition.eof": True,
    }
    return client_config(bootstrap, **{**tuning, **config, **exact})


class RangeReader:
    """Reads offset ranges of partitions, one consumer per (brokers, settings, partition) kept
    between reads (each task reads its own partition on its own thread; a lock per consumer
    keeps two reads of one partition apart)."""

    def __init__(self, *, timeout_s: float = READ_TIMEOUT_S, clock: Callable[[], float] = time.monotonic) -> None:
        """``timeout_s``: how long a read may go without progress; ``clock``: the clock of the
        :data:`RETRY_AFTER_S` window after a failed read (monotonic seconds)."""
        self._timeout_s = timeout_s
        self._clock = clock
        self._consumers: dict[tuple[Any, ...], tuple[Any, threading.Lock]] = {}
        self._failed_until: dict[tuple[Any, ...], float] = {}
        self._lock = threading.Lock()

    def read(
        self,
        bootstrap: str,
        topic: str,
        partition: int,
        start: int,
        end: int,
        *,
        isolation_level: str = SPARK_ISOLATION_DEFAULT,
        config: Mapping[str, str] | None = None,
    ) -> pa.Table | None:
        """The records of ``topic``-``partition`` at offsets ``start`` up to ``end`` (excluded)
        that a consumer with ``isolation_level`` reads, in offset order, as
        :data:`SPARK_KAFKA_SCHEMA`; None when they cannot be read exactly (logged).

        ``config``: librdkafka settings reaching the brokers (SASL, TLS).
        """
        if isolation_level not in ISOLATION_LEVELS:
            logger.info("%s-%d: isolation.level %r is not one librdkafka reads as Spark does", topic, partition, isolation_level)
            return None
        if start < 0 or end < start:
            logger.info("%s-%d: offset range %d..%d is not a range to read", topic, partition, start, end)
            return None
        if start == end:
            return SPARK_KAFKA_SCHEMA.empty_table()
        key = self._key(bootstrap, topic, partition, isolation_level, dict(config or {}))
        if self._clock() < self._failed_until.get(key, 0.0):
            return None  # a read failed lately: Spark reads until RETRY_AFTER_S has passed
        consumer, lock = self._consumer(bootstrap, topic, partition, isolation_level, dict(config or {}))
        with lock:
            try:
                messages = self._read(consumer, topic, partition, start, end)
            finally:
                try:
                    consumer.unassign()
                except Exception as e:  # noqa: BLE001 - a consumer that failed is dropped below anyway
                    logger.debug("%s-%d: unassign failed: %s", topic, partition, e)
        if messages is None:
            self._drop(bootstrap, topic, partition, isolation_level, dict(config or {}))
            self._failed_until[key] = self._clock() + RETRY_AFTER_S
            logger.warning(
                "%s-%d: a batch was not read on the driver (see above); Spark reads its batches for %.0f s",
                topic,
                partition,
                RETRY_AFTER_S,
            )
            return None
        return _table(messages, topic, partition)

    def _read(self, consumer: Any, topic: str, partition: int, start: int, end: int) -> list[Any] | None:
        from confluent_kafka import KafkaError, KafkaException, TopicPartition

        where = f"{topic}-{partition} offsets {start}..{end}"
        try:
            low, _high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=self._timeout_s, cached=False)
        except KafkaException as e:
            logger.info("%s not read on the driver: the partition's offsets were not read: %s", where, e)
            return None
        if start < low:  # records of the range are gone: Spark's failOnDataLoss decides
            logger.info("%s not read on the driver: the partition starts at offset %d now", where, low)
            return None
        consumer.assign([TopicPartition(topic, partition, start)])
        messages: list[Any] = []
        position = start
        deadline = time.monotonic() + self._timeout_s
        while position < end:
            if time.monotonic() > deadline:
                logger.info("%s not read on the driver: no progress past offset %d in %.1f s", where, position, self._timeout_s)
                return None
            before = position
            # consume() waits its whole timeout unless it gets as many messages as asked for: ask
            # for no more than the range still holds (markers and aborted records leave it short,
            # and then the partition's end event or a record past the range fills it).
            wanted = min(_CONSUME_BATCH, end - position)
            for message in consumer.consume(num_messages=wanted, timeout=_POLL_S):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        if message.offset() >= end:  # the partition's (stable) end is at or past the range's
                            position = end
                            break
                        continue
                    logger.info("%s not read on the driver: %s", where, error)
                    return None
                offset = message.offset()
                if offset >= end:
                    position = end
                    break
                if offset < position:
                    logger.warning("%s not read on the driver: offset %d after %d", where, offset, position - 1)
                    return None
                messages.append(message)
                position = offset + 1
            if position > before:
                deadline = time.monotonic() + self._timeout_s
        return messages

    def _key(self, bootstrap: str, topic: str, partition: int, isolation: str, config: dict[str, str]) -> tuple[Any, ...]:
        return (bootstrap, topic, partition, isolation, tuple(sorted(config.items())))

    def _consumer(
        self, bootstrap: str, topic: str, partition: int, isolation: str, config: dict[str, str]
    ) -> tuple[Any, threading.Lock]:
        from confluent_kafka import Consumer

        key = self._key(bootstrap, topic, partition, isolation, config)
        with self._lock:
            found = self._consumers.get(key)
            if found is None:
                found = self._consumers[key] = (
                    Consumer(consumer_settings(bootstrap, topic, partition, isolation, config)),
                    threading.Lock(),
                )
            return found

    def _drop(self, bootstrap: str, topic: str, partition: int, isolation: str, config: dict[str, str]) -> None:
        """Close the consumer of a read that failed (the next read starts a fresh one)."""
        with self._lock:
            found = self._consumers.pop(self._key(bootstrap, topic, partition, isolation, config), None)
        if found is not None:
            try:
                found[0].close()
            except Exception as e:  # noqa: BLE001 - closing a broken consumer
                logger.debug("closing a consumer of %s-%d failed: %s", topic, partition, e)

    def close(self) -> None:
        """Close every consumer."""
        with self._lock:
            consumers, self._consumers = list(self._consumers.values()), {}
        for consumer, _lock in consumers:
            consumer.close()


def _table(messages: list[Any], topic: str, partition: int) -> pa.Table:
    """``messages`` (data records of one partition, in offset order) as :data:`SPARK_KAFKA_SCHEMA`."""
    keys, values, offsets, stamps, stamp_types, headers = [], [], [], [], [], []
    for message in messages:
        keys.append(message.key())
        values.append(message.value())
        offsets.append(message.offset())
        kind, ms = message.timestamp()
        stamp_types.append(_TIMESTAMP_TYPE_IDS.get(kind, -1))
        stamps.append(ms * 1000 if kind else -1000)  # Spark: new Timestamp(record.timestamp), -1 without one
        found = message.headers()
        headers.append([{"key": k, "value": v} for k, v in found] if found else None)  # Spark: null without headers
    n = len(messages)
    columns = [
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.array([topic] * n, pa.string()),
        pa.array([partition] * n, pa.int32()),
        pa.array(offsets, pa.int64()),
        pa.array(stamps, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        pa.array(stamp_types, pa.int32()),
        pa.array(headers, SPARK_KAFKA_SCHEMA.field("headers").type),
    ]
    return pa.Table.from_arrays(columns, schema=SPARK_KAFKA_SCHEMA)
