"""How a Kafka sink turns a batch's records into Kafka messages (key, value, headers).

* **key**: the value of the ``key`` field (a dotted path works: ``user.id``); without one the
  message has no key (null).
* **value**: without a ``value`` field, the record's fields as one JSON object (compact,
  UTF-8, in the stream's field order); with one, that field's value.
* A key or value taken from a field is its text as UTF-8 when it is a string, the bytes as they
  are when it is bytes, no key / a null value (a tombstone) when it is null, and JSON text
  otherwise (``5``, ``true``, ``{"a":1}``).
* **headers**: ``stream-ops-topology``, ``stream-ops-task`` and ``stream-ops-txid`` (decimal
  text), which name the batch a message came from.

The partition is Kafka's by key (the producer's ``murmur2_random`` partitioner by default, as
Java clients and Kafka Streams partition, so equal keys land where they would); messages without
a key are spread over the partitions.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from stream_ops.helpers.field_paths import value_or_none

HEADER_TOPOLOGY = "stream-ops-topology"
HEADER_TASK = "stream-ops-task"
HEADER_TXID = "stream-ops-txid"


@dataclass(frozen=True)
class KafkaMessage:
    """One message to produce."""

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    partition: int | None = None
    """The partition to write to; None: the producer's partitioner chooses by key."""


def encode_value(value: Any) -> bytes | None:
    """A field value as message bytes: str as UTF-8, bytes as they are, None as None, else JSON."""
    if value is None:
        return None
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str).encode("utf-8")


def encode_record(record: Mapping[str, Any]) -> bytes:
    """The record's fields as one compact JSON object (UTF-8)."""
    return json.dumps(dict(record), separators=(",", ":"), ensure_ascii=False, default=str).encode("utf-8")


def batch_headers(topology_id: str, task_id: int, txid: int) -> tuple[tuple[str, bytes], ...]:
    """The headers of every message of one batch: which topology, task and txid wrote it."""
    return (
        (HEADER_TOPOLOGY, topology_id.encode("utf-8")),
        (HEADER_TASK, str(task_id).encode("ascii")),
        (HEADER_TXID, str(txid).encode("ascii")),
    )


def batch_messages(
    records: Iterable[Mapping[str, Any]],
    *,
    key: str | None,
    value: str | None,
    headers: tuple[tuple[str, bytes], ...],
) -> list[KafkaMessage]:
    """The messages of a batch's records, in order (see the module docstring)."""
    messages = []
    for record in records:
        message_key = encode_value(value_or_none(record, key)) if key is not None else None
        message_value = encode_value(value_or_none(record, value)) if value is not None else encode_record(record)
        messages.append(KafkaMessage(message_key, message_value, headers))
    return messages
