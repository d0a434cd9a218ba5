"""The storage interface under the map states (Trident's IBackingMap) and an in-memory one."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

from stream_ops.errors import StateError
from stream_ops.state.keys import Key, as_key


@runtime_checkable
class BackingMap(Protocol):
    """Key -> wrapped value storage, like Trident's IBackingMap.

    Values are :class:`~stream_ops.state.values.TransactionalValue`,
    :class:`~stream_ops.state.values.OpaqueValue` or plain values. The map states implement
    the txid rules; a backing map only stores what it is given. ``None`` means "absent":
    ``multi_get`` returns it for a missing key and ``multi_put`` of ``None`` deletes the key.

    For exactly-once results a backing map must make the writes of one batch durable all
    together or not at all (as :class:`~stream_ops.state.rocksdb_backing.RocksDBBackingMap`
    does with one write batch per txid).
    """

    def multi_get(self, keys: Sequence[Key]) -> list[Any | None]:
        """The stored value of each key, None where absent."""
        ...

    def multi_put(self, keys: Sequence[Key], values: Sequence[Any]) -> None:
        """Store one value per key (None deletes)."""
        ...


def check_same_length(keys: Sequence[Any], values: Sequence[Any], what: str) -> None:
    """Raise StateError unless there is exactly one value (or function) per key."""
    if len(keys) != len(values):
        raise StateError(f"{what}: got {len(keys)} keys but {len(values)} values; pass one per key")


class MemoryBackingMap:
    """A dict-backed :class:`BackingMap` for tests and small, non-durable state.

    Every put is visible (and "durable") at once, so it does not give batch atomicity.

    Example:
        >>> m = MemoryBackingMap()
        >>> m.multi_put([("a",)], [1])
        >>> m.multi_get([("a",), ("b",)])
        [1, None]
    """

    def __init__(self) -> None:
        self._data: dict[Key, Any] = {}
        self._lock = threading.Lock()

    def multi_get(self, keys: Sequence[Key]) -> list[Any | None]:
        with self._lock:
            return [self._data.get(as_key(key)) for key in keys]

    def multi_put(self, keys: Sequence[Key], values: Sequence[Any]) -> None:
        check_same_length(keys, values, "MemoryBackingMap.multi_put")
        with self._lock:
            for key, value in zip(keys, values, strict=True):
                if value is None:
                    self._data.pop(as_key(key), None)
                else:
                    self._data[as_key(key)] = value

    def items(self) -> Iterator[tuple[Key, Any]]:
        """A snapshot of every (key, wrapped value)."""
        with self._lock:
            snapshot = list(self._data.items())
        return iter(snapshot)

    def __len__(self) -> int:
        return len(self._data)
