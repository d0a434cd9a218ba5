"""Stable hashing of keys, identical in every process and on every machine.

Python's built-in ``hash`` is salted per process, so it cannot route a key to the same queue
from two workers. Keys are encoded as canonical JSON and hashed with CRC-32.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from typing import Any

_KEY_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def encode_key(key: Sequence[Any]) -> str:
    """Canonical JSON text of a key tuple (the group-by field values, in order)."""
    return _KEY_ENCODER.encode(list(key))


def stable_hash(key: Sequence[Any]) -> int:
    """Unsigned 32-bit hash of a key tuple, the same in every process."""
    return zlib.crc32(encode_key(key).encode("utf-8"))


def partition_for(key: Sequence[Any], queues: int) -> int:
    """The queue a key belongs to: ``stable_hash(key) % queues`` (RocketMQ's shuffle rule)."""
    if queues <= 0:
        raise ValueError(f"queues must be positive, got {queues}")
    return stable_hash(key) % queues
