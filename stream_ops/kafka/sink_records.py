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
from collections.abc import Iterable, Mapping, Sequence
from itertools import chain
from typing import Any, NamedTuple

from stream_ops.helpers.compact_json import compact_json_lines
from stream_ops.helpers.field_paths import value_or_none

HEADER_TOPOLOGY = "stream-ops-topology"
HEADER_TASK = "stream-ops-task"
HEADER_TXID = "stream-ops-txid"


class KafkaMessage(NamedTuple):
    """One message to produce (a named tuple: a batch makes one per record, cheaply)."""

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


MessageParts = tuple[bytes | None, bytes | None]
"""A message's (key, value): what it holds besides the batch's headers."""


def message_parts(records: Sequence[Mapping[str, Any]], *, key: str | None, value: str | None) -> list[MessageParts]:
    """Per record, its message's (key, value) (see the module docstring)."""
    keys = [encode_value(value_or_none(record, key)) for record in records] if key is not None else [None] * len(records)
    if value is not None:
        values: list[bytes | None] = [encode_value(value_or_none(record, value)) for record in records]
    else:  # the record as JSON: json.dumps(dict(record), compact, default=str), one encoder for the batch
        texts = compact_json_lines((r if type(r) is dict else dict(r) for r in records), default=str)
        values = [text.encode("utf-8") for text in texts]
    return list(zip(keys, values, strict=True))


_PLAIN_SCALARS = frozenset({str, int, float, bool, type(None)})
"""Types whose JSON text reads back as an equal value of the same type, itself written as the
same text (a float's text is its shortest repr, which reads back as the same float)."""


def staged_message_parts(
    records: Sequence[Mapping[str, Any]], lines: Sequence[str], *, key: str | None, value: str | None
) -> list[MessageParts]:
    """The :func:`message_parts` of the records a batch file gives back, from the records as
    they were staged and their ``lines`` (each the record's compact JSON line in the file): the
    same bytes, without reading the file and parsing each line again.

    A flat record (a ``dict`` of text keys and scalar values: text, int, float, bool, null)
    reads back from its line as an equal record, so its key and value fields encode the same,
    and the record as JSON is its line itself. Any other record (nested, a non-text key, a
    mapping of another type) is read back from its line, as from the file.
    """
    if len(records) != len(lines):
        raise ValueError(f"{len(records)} records but {len(lines)} lines")
    if not _all_flat(records):  # record by record, each flat one as below
        parts: list[MessageParts] = []
        for record, line in zip(records, lines, strict=True):
            flat = _all_flat([record])
            parts += staged_message_parts([record], [line], key=key, value=value) if flat else _read_back(line, key, value)
        return parts
    # Every record flat: whole columns at a time.
    keys = _encoded_field(records, key) if key is not None else [None] * len(records)
    values = _encoded_field(records, value) if value is not None else [line.encode("utf-8") for line in lines]
    return list(zip(keys, values, strict=True))


def _read_back(line: str, key: str | None, value: str | None) -> list[MessageParts]:
    """The :func:`message_parts` of the record ``line`` reads back as (what its file gives)."""
    return message_parts([json.loads(line)], key=key, value=value)


def _all_flat(records: Sequence[Mapping[str, Any]]) -> bool:
    """Whether every record is a ``dict`` of text keys and :data:`_PLAIN_SCALARS` values."""
    return (
        set(map(type, records)) <= {dict}
        and set(map(type, chain.from_iterable(records))) <= {str}
        and set(map(type, chain.from_iterable(map(dict.values, records)))) <= _PLAIN_SCALARS  # type: ignore[arg-type]
    )


def _encoded_field(records: Sequence[Mapping[str, Any]], name: str) -> list[bytes | None]:
    """:func:`encode_value` of each record's field ``name`` (a dotted path works)."""
    found = [record.get(name) for record in records] if "." not in name else [value_or_none(r, name) for r in records]
    return [v.encode("utf-8") if type(v) is str else encode_value(v) for v in found]


def messages_of(parts: Iterable[MessageParts], headers: tuple[tuple[str, bytes], ...]) -> list[KafkaMessage]:
    """The messages of a batch: each (key, value) with the batch's headers."""
    return [KafkaMessage(message_key, message_value, headers) for message_key, message_value in parts]


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
    return messages_of(message_parts(list(records), key=key, value=value), headers)
