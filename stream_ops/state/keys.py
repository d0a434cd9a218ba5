"""State keys: tuples of the group-by field values."""

from __future__ import annotations

from typing import Any

from stream_ops.errors import StateError

Key = tuple[Any, ...]
"""A state key: the group-by field values, in order."""


def as_key(key: Any) -> Key:
    """Normalise a key to a hashable tuple.

    JSON has no tuples, so keys read back from a state topic or a store arrive as lists; they
    (and lists nested in them) are turned into tuples. :func:`stream_ops.hashing.encode_key`
    encodes both forms identically.

    Raises:
        StateError: if ``key`` is neither a tuple nor a list.
    """
    if isinstance(key, (tuple, list)):
        return tuple(as_key(part) if isinstance(part, list) else part for part in key)
    raise StateError(f"a state key must be a tuple of group-by field values, got {type(key).__name__} {key!r}")
