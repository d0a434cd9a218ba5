"""The progress of a Kafka sink task: the last txid it delivered, committed with the delivery itself.

Every delivery transaction of a sink task writes, besides the batch's messages, one progress
record into a compacted progress topic (default ``stream-ops-sink-progress``): key = the task's
transactional id, value = ``{"txid": n, "topology": ..., "sink": ..., "task": ...}``. The record
is visible to ``read_committed`` readers exactly when the batch's messages are, so "the last
progress record of my transactional id" is "the last batch Kafka has from me". A task's
records all go to partition ``crc32(transactional id) % partitions``, so one partition holds
every record of a key, in order, and compaction keeps the latest.

:func:`read_delivered_txid` reads that partition ``read_committed`` up to the end offset it had
*after* the owner's ``init_transactions()`` (which completed or aborted every earlier
transaction of the id), so no committed record of the id is missed: a ``read_committed`` reader
stops at the first open transaction of any producer, and waits for it to end.
"""

from __future__ import annotations

import json
import logging
import time
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

from stream_ops.errors import KafkaSinkError
from stream_ops.kafka.client import client_config

logger = logging.getLogger(__name__)

PROGRESS_TOPIC_CONFIG: dict[str, str] = {
    "cleanup.policy": "compact",
    "segment.ms": str(10 * 60 * 1000),
    "min.cleanable.dirty.ratio": "0.1",
}
"""Settings of a progress topic the sink creates: compacted, with short segments so a task start
reads little more than one record per key."""
NOTHING_DELIVERED = -1
"""The delivered txid of a task that has no progress record yet."""


def progress_partition(transactional_id: str, partitions: int) -> int:
    """The progress-topic partition of ``transactional_id`` (stable: crc32 of the id)."""
    if partitions < 1:
        raise ValueError(f"partitions must be positive, got {partitions}")
    return zlib.crc32(transactional_id.encode("utf-8")) % partitions


def progress_record(transactional_id: str, *, topology_id: str, sink: str, task_id: int, txid: int) -> tuple[bytes, bytes]:
    """(key, value) of the progress record saying ``txid`` is delivered."""
    value = {"txid": txid, "topology": topology_id, "sink": sink, "task": task_id}
    return transactional_id.encode("utf-8"), json.dumps(value, separators=(",", ":")).encode("utf-8")


def progress_txid(value: bytes | None) -> int | None:
    """The txid of a progress record's value (None for a value that is no progress record)."""
    if value is None:
        return None
    try:
        found = json.loads(value)
    except ValueError:
        return None
    txid = found.get("txid") if isinstance(found, dict) else None
    return txid if isinstance(txid, int) and not isinstance(txid, bool) else None


def last_delivered(
    records: Iterable[tuple[bytes | None, bytes | None]], transactional_id: str, before: int = NOTHING_DELIVERED
) -> int:
    """The txid of the last progress record of ``transactional_id`` among ``records`` (key, value)
    in log order, or ``before`` (what earlier records said) when there is none."""
    key = transactional_id.encode("utf-8")
    delivered = before
    for record_key, value in records:
        if record_key == key and (txid := progress_txid(value)) is not None:
            delivered = txid
    return delivered


def already_delivered(txid: int, delivered: int) -> bool:
    """Whether batch ``txid`` is in Kafka already, given the task's last delivered txid.

    A task delivers its committed batches in txid order, each with its progress record in the
    same transaction, so every txid up to the last delivered one was delivered and none after it.
    """
    return txid <= delivered


def read_delivered_txid(
    bootstrap: str, config: Mapping[str, Any], topic: str, partition: int, transactional_id: str, *, timeout_s: float
) -> int:
    """The last txid delivered under ``transactional_id``, read ``read_committed`` from the progress
    topic (see the module docstring). Call it after the producer's ``init_transactions()``.

    Raises:
        KafkaSinkError: the partition could not be read to its end within ``timeout_s`` (brokers
            unreachable, or another producer's transaction on it stayed open).
    """
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    group = f"{transactional_id}.progress-reader"  # never joined or committed: assign() only
    where = f"progress topic {topic!r} partition {partition} at {bootstrap}"
    ends = Consumer(client_config(bootstrap, **{**config, "group.id": group, "isolation.level": "read_uncommitted"}))
    try:
        start, end = ends.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout_s, cached=False)
    except KafkaException as e:
        raise KafkaSinkError(f"cannot read the end offset of {where}: {e}") from e
    finally:
        ends.close()
    reader = Consumer(
        client_config(
            bootstrap,
            **{
                **config,
                "group.id": group,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",  # a log start that moved on meanwhile: from the new start
                "fetch.wait.max.ms": 10,  # the partition is read once, to its end: do not wait for more
            },
        )
    )
    try:
        reader.assign([TopicPartition(topic, partition, start)])
        delivered, read = NOTHING_DELIVERED, 0
        deadline = time.monotonic() + timeout_s
        while True:
            records: list[tuple[bytes | None, bytes | None]] = []
            reached: int | None = None
            for message in reader.consume(num_messages=10_000, timeout=0.05):
                error = message.error()
                if error is None:
                    records.append((message.key(), message.value()))
                elif error.code() == KafkaError._PARTITION_EOF:
                    reached = message.offset()
                else:
                    raise KafkaSinkError(f"reading {where}: {error}")
            delivered, read = last_delivered(records, transactional_id, delivered), read + len(records)
            if reached is not None and reached >= end:
                logger.debug("%s: %s delivered up to txid %d (%d records read)", where, transactional_id, delivered, read)
                return delivered
            if time.monotonic() >= deadline:
                raise KafkaSinkError(
                    f"{where} was not read up to offset {end} in {timeout_s:.0f} s: the brokers are unreachable, or a "
                    "transaction of another producer on it stays open (it ends within its transaction.timeout.ms)"
                )
    finally:
        reader.close()
