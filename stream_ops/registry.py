"""A named registry of extension points (stage kinds, source kinds): one entry per name,
registered once at import time, looked up by the name a plan stores."""

from __future__ import annotations

from typing import Generic, TypeVar

from stream_ops.errors import TopologyDefinitionError

T = TypeVar("T")


class Registry(Generic[T]):
    """Entries by name, in registration order.

    Example:
        >>> kinds: Registry[str] = Registry("stage kind")
        >>> kinds.register("source", "reads a topic")
        'reads a topic'
        >>> kinds.get("source")
        'reads a topic'
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self._entries: dict[str, T] = {}

    def register(self, name: str, entry: T) -> T:
        """Add ``entry`` under ``name``.

        Raises:
            TopologyDefinitionError: ``name`` is registered already.
        """
        if name in self._entries:
            raise TopologyDefinitionError(f"{self.what} {name!r} is registered already")
        self._entries[name] = entry
        return entry

    def get(self, name: str) -> T:
        """The entry called ``name``.

        Raises:
            TopologyDefinitionError: no entry has that name (a plan from a newer version, or a typo).
        """
        try:
            return self._entries[name]
        except KeyError:
            raise TopologyDefinitionError(f"unknown {self.what} {name!r}; known kinds: {sorted(self._entries)}") from None

    def copy(self) -> Registry[T]:
        """An independent registry with the same entries (e.g. to register into in a test)."""
        twin: Registry[T] = Registry(self.what)
        twin._entries = dict(self._entries)
        return twin

    def entries(self) -> tuple[T, ...]:
        """Every entry, in registration order."""
        return tuple(self._entries.values())
