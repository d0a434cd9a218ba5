"""The records a window buffer holds for time windows, bucketed by pane so a window is cheap to close.

A *pane* is the slide-aligned stretch ``[p * slide, (p + 1) * slide)``; a record at time ``t``
lies in pane ``floor(t / slide)``. That index never decreases as ``t`` grows, so every record of
a pane strictly between the panes of ``start`` and ``end`` lies in ``[start, end)`` and only the
two edge panes need a look at each record's time: reading a window or dropping what precedes
a time costs the records involved, not the whole buffer, whatever the window's length and
slide (a length that is not a multiple of the slide included).

Within a pane, records are kept in *chunks*: those added between two state writes, in arrival
order. A chunk becomes one state entry when it is written (:meth:`PaneIndex.fresh`, :meth:`PaneIndex.written`), and
its entry is deleted once all its records are gone (:meth:`PaneIndex.take_dropped`).

Example:
    >>> panes = PaneIndex(slide=5.0)
    >>> panes.add([(0, 3.0, "a", {}), (1, 7.0, "b", {}), (2, 4.0, "a", {})])
    >>> [seq for seq, *_ in panes.window(0.0, 10.0)]
    [0, 1, 2]
    >>> panes.drop_before(5.0)
    >>> panes.earliest(), len(panes)
    (7.0, 1)
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Item = tuple[int, float, str, Mapping[str, Any]]
"""One buffered record: ``(arrival sequence number, time, stream, record)``."""

EntryKey = tuple[Any, ...]


class Chunk:
    """Records of one pane added between two state writes, in arrival order."""

    __slots__ = ("items", "key")

    def __init__(self, items: list[Item], key: EntryKey | None = None) -> None:
        self.items = items
        self.key = key
        """Its state entry once written; None while it is fresh."""


class Pane:
    """The chunks of one pane, oldest first, with the smallest and largest time they hold."""

    __slots__ = ("chunks", "high", "low", "size")

    def __init__(self) -> None:
        self.chunks: list[Chunk] = []
        self.low = math.inf
        self.high = -math.inf
        self.size = 0

    def items(self) -> list[Item]:
        """Its records in arrival order."""
        if len(self.chunks) == 1:
            return self.chunks[0].items
        return [item for chunk in self.chunks for item in chunk.items]


class PaneIndex:
    """Buffered time-window records by pane (see the module docstring).

    Args:
        slide: the windows' slide in seconds (their length for tumbling windows).
    """

    def __init__(self, slide: float) -> None:
        self.slide = slide
        self._panes: dict[int, Pane] = {}
        self._keys: list[int] = []
        """Pane indices held, ascending."""
        self._size = 0
        self._fresh: list[tuple[int, Chunk]] = []
        self._dropped: list[EntryKey] = []

    def __len__(self) -> int:
        return self._size

    def pane_of(self, t: float) -> int:
        """The pane holding time ``t``."""
        return math.floor(t / self.slide)

    def add(self, items: Iterable[Item]) -> None:
        """Buffer ``items`` (in arrival order), after every record added before them."""
        slide, floor = self.slide, math.floor
        index: int | None = None
        pane = Pane()
        chunk: list[Item] = []
        added = 0
        for item in items:
            t = item[1]
            if floor(t / slide) != index:
                index = floor(t / slide)
                pane, chunk = self._fresh_chunk(index)
            chunk.append(item)
            if t < pane.low:
                pane.low = t
            if t > pane.high:
                pane.high = t
            pane.size += 1
            added += 1
        self._size += added

    def _fresh_chunk(self, index: int) -> tuple[Pane, list[Item]]:
        """Pane ``index`` (made if new) and the records of its chunk not written yet (made if none)."""
        pane = self._panes.get(index)
        if pane is None:
            pane = self._panes[index] = Pane()
            bisect.insort(self._keys, index)
        if pane.chunks and pane.chunks[-1].key is None:
            return pane, pane.chunks[-1].items
        chunk = Chunk([])
        pane.chunks.append(chunk)
        self._fresh.append((index, chunk))
        return pane, chunk.items

    def earliest(self) -> float | None:
        """The smallest time buffered, or None when empty."""
        return self._panes[self._keys[0]].low if self._keys else None

    def window(self, start: float, end: float) -> list[Item]:
        """The records with ``start <= time < end``, in arrival order."""
        parts = []
        i = bisect.bisect_left(self._keys, self.pane_of(start))
        last = self.pane_of(end)
        while i < len(self._keys) and self._keys[i] <= last:
            pane = self._panes[self._keys[i]]
            if pane.low >= start and pane.high < end:
                parts.append(pane.items())
            elif pane.high >= start and pane.low < end:
                parts.append([item for item in pane.items() if start <= item[1] < end])
            i += 1
        parts = [part for part in parts if part]
        if len(parts) == 1:
            return list(parts[0])
        return list(heapq.merge(*parts))  # each part is in arrival (sequence) order

    def drop_before(self, limit: float) -> None:
        """Forget every record whose time is before ``limit``."""
        first_kept = bisect.bisect_left(self._keys, self.pane_of(limit))
        for index in self._keys[:first_kept]:
            self._forget(self._panes.pop(index))
        del self._keys[:first_kept]
        if not self._keys:
            return
        pane = self._panes[self._keys[0]]
        if pane.low >= limit:
            return
        kept_chunks = []
        for chunk in pane.chunks:
            kept = [item for item in chunk.items if item[1] >= limit]
            if kept:
                chunk.items = kept
                kept_chunks.append(chunk)
            else:
                self._forget_chunk(chunk)
        pane.chunks = kept_chunks
        self._size -= pane.size
        if not kept_chunks:
            del self._panes[self._keys[0]]
            del self._keys[0]
            return
        times = [item[1] for chunk in kept_chunks for item in chunk.items]
        pane.low, pane.high, pane.size = min(times), max(times), len(times)
        self._size += pane.size

    def take_all(self) -> list[Item]:
        """Every record, in arrival order, and forget them."""
        items = list(heapq.merge(*(self._panes[index].items() for index in self._keys)))
        for index in self._keys:
            self._forget(self._panes[index])
        self._panes.clear()
        self._keys.clear()
        return items

    def _forget(self, pane: Pane) -> None:
        self._size -= pane.size
        for chunk in pane.chunks:
            self._forget_chunk(chunk)

    def _forget_chunk(self, chunk: Chunk) -> None:
        if chunk.key is not None:
            self._dropped.append(chunk.key)
        chunk.items = []

    # --- state entries ---------------------------------------------------------------------------

    def fresh(self) -> list[tuple[int, Chunk]]:
        """The chunks not written yet that still hold records, with their panes."""
        self._fresh = [(index, chunk) for index, chunk in self._fresh if chunk.items]
        return list(self._fresh)

    def written(self, keys: Sequence[EntryKey]) -> None:
        """The chunks :meth:`fresh` returned are written, under ``keys`` (in its order)."""
        for (_, chunk), key in zip(self._fresh, keys, strict=True):
            chunk.key = key
        self._fresh = []

    def take_dropped(self) -> list[EntryKey]:
        """The keys of written chunks whose records have all been dropped since the last call."""
        dropped, self._dropped = self._dropped, []
        return dropped

    def load(self, index: int, key: EntryKey, items: list[Item]) -> None:
        """Add a written chunk of pane ``index`` (restoring: chunks in arrival order)."""
        pane = self._panes.get(index)
        if pane is None:
            pane = self._panes[index] = Pane()
            bisect.insort(self._keys, index)
        pane.chunks.append(Chunk(items, key))
        for item in items:
            pane.low = min(pane.low, item[1])
            pane.high = max(pane.high, item[1])
        pane.size += len(items)
        self._size += len(items)
