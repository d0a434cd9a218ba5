"""Stable hashing of keys, identical in every process and on every machine.

Python's built-in ``hash`` is salted per process, so it cannot route a key to the same queue
from two workers. Keys are encoded as canonical JSON and hashed with CRC-32.

Keys are JSON values: a float with an integral value is the integer (``1.0`` is the key
``1``, so it meets ``1`` in one task and one state entry), while ``true`` stays a boolean and
is not ``1`` (Python's ``True == 1`` does not carry over).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from typing import Any

_KEY_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True, ensure_ascii=False)


_EXACT_INTS = 2.0**53
"""Beyond this a float no longer stands for one integer, so it stays a float."""


def normalise_key_value(value: Any) -> Any:
    """``value`` as the key it stands for: integral floats (below 2**53) become ints, inside
    lists and mappings too; everything else is unchanged."""
    if isinstance(value, float) and value.is_integer() and abs(value) < _EXACT_INTS:
        return int(value)
    if isinstance(value, (list, tuple)):
        return [normalise_key_value(v) for v in value]
    if isinstance(value, dict):
        return {k: normalise_key_value(v) for k, v in value.items()}
    return value


def encode_key(key: Sequence[Any]) -> str:
    """Canonical JSON text of a key tuple (the group-by field values, in order)."""
    return _KEY_ENCODER.encode([normalise_key_value(v) for v in key])


def stable_hash(key: Sequence[Any]) -> int:
    """Unsigned 32-bit hash of a key tuple, the same in every process."""
    return zlib.crc32(encode_key(key).encode("utf-8"))


def partition_for(key: Sequence[Any], queues: int) -> int:
    """The queue a key belongs to: ``stable_hash(key) % queues`` (RocketMQ's shuffle rule)."""
    if queues <= 0:
        raise ValueError(f"queues must be positive, got {queues}")
    return stable_hash(key) % queues


def partition_of_encoded(key: str, queues: int) -> int:
    """:func:`partition_for` of the key ``key`` is the encoding of (``encode_key``'s canonical
    text), without decoding it: the same queue, as the encoding of a decoded canonical key is
    the text itself."""
    if queues <= 0:
        raise ValueError(f"queues must be positive, got {queues}")
    return zlib.crc32(key.encode("utf-8")) % queues
