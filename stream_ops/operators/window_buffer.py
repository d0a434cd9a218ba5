"""A window buffer over several streams: the records of each window, for Storm's JoinBolt.

Where :class:`~stream_ops.operators.window_aggregation.WindowedAggregation` keeps partial
aggregates, a join needs each window's records, so :class:`WindowBuffer` keeps them, as
Storm's windowed bolts do, and hands every complete window over as ``(stream, record)``
pairs in arrival order. Count windows count records of all streams together (Storm's
``Count.of``); time windows follow :mod:`stream_ops.topology.windows` (epoch aligned,
tumbling or sliding, processing or event time with a watermark and late records). A window
without records is never returned.

Time-window records are bucketed by pane (:mod:`stream_ops.operators.time_panes`), so closing
a window costs its own records, not the whole buffer's.

The buffer is task state as a set of entries (:meth:`WindowBuffer.changes` gives what was
written and deleted since the last call, :meth:`WindowBuffer.restore` rebuilds the buffer from
them), so a batch stores the records it added, not the whole buffer again. Entry keys:

* ``("__join_window__", "meta")``: format version, window, sequence counters, the last
  closed window's end, the watermark.
* ``("__join_window__", "t", seq, pane)``: the records of one time-window pane added between
  two writes (``seq``: the arrival number at the first write's start), as ``[seq, time,
  stream, record]``; deleted once the windows they belong to have all closed.
* ``("__join_window__", "c", seq)``: the same for a count window, deleted once its records
  have all left the window.

A written entry whose records partly left the buffer stays as it is; :meth:`restore` leaves
those records out again (see ``_dropped_by_last_close``).

Example:
    >>> from stream_ops.topology.windows import Sliding, WindowDef
    >>> buffer = WindowBuffer(WindowDef.build(Sliding(10, 5)), now=0.0)
    >>> buffer.add([("a", {"n": 1})], now=3.0).windows
    []
    >>> buffer.add([("b", {"n": 2})], now=7.0).windows
    [[('a', {'n': 1})]]
    >>> buffer.flush(now=10.0)
    [[('a', {'n': 1}), ('b', {'n': 2})]]
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stream_ops.errors import StateError
from stream_ops.operators.time_panes import EntryKey, Item, PaneIndex
from stream_ops.topology.windows import LATE, Watermark, WindowDef

WindowItem = tuple[str, Mapping[str, Any]]
"""One record of a window: ``(stream name, record)``."""

STATE_VERSION = 3
PREFIX = "__join_window__"
META = (PREFIX, "meta")
SNAPSHOT_KEY = (PREFIX,)
"""Where format 2 kept the whole buffer as one value; :meth:`WindowBuffer.restore` reads it
once and replaces it with entries."""
SNAPSHOT_VERSION = 2


@dataclass
class BufferBatch:
    """What adding one batch to a :class:`WindowBuffer` produced."""

    windows: list[list[WindowItem]] = field(default_factory=list)
    """Complete windows, oldest first."""
    late: list[WindowItem] = field(default_factory=list)
    """Records whose event time was before the watermark."""
    dead: list[dict[str, Any]] = field(default_factory=list)
    """``{"record", "error"}`` for records without a usable event time."""


class WindowBuffer:
    """Buffers ``(stream, record)`` pairs and returns each complete window once.

    Args:
        window: the window definition (not a session window).
        now: processing time at creation (starts the watermark's idle clock).
        channels: the upstream tasks an event-time watermark waits for (see :class:`Watermark`;
            required for event time).
    """

    def __init__(self, window: WindowDef, now: float, *, channels: Sequence[str] = ()) -> None:
        if window.kind == "session":
            raise ValueError("a WindowBuffer holds tumbling or sliding windows")
        self.window = window
        self.watermark = Watermark(window.lag, window.idle_timeout, now, channels=channels) if window.time == "event" else None
        self._reset()

    def _reset(self) -> None:
        window = self.window
        self._panes = PaneIndex(window.slide)
        """Time windows: the records by pane."""
        self._items: deque[Item] = deque(maxlen=int(window.length) if window.kind == "sliding" and window.counted else None)
        """Count windows: the records of the current window, in arrival order."""
        self._since_emit = 0
        self._next_end: float | None = None
        self._seq = 0
        """Arrival number of the next record."""
        self._closed_seq = 0
        """Time windows: ``_seq`` when windows last closed (records before it and before the
        last close's keep-from time were dropped)."""
        self._written_seq = 0
        """``_seq`` at the last :meth:`changes`: later records are not written yet."""
        self._written_counts: deque[tuple[EntryKey, int]] = deque()
        """Count windows: written entries and the last arrival number each holds, oldest first."""
        self._deletes: set[EntryKey] = set()
        self._written_meta: dict[str, Any] | None = None

    @property
    def pending(self) -> int:
        """Records buffered."""
        return len(self._items) if self.window.counted else len(self._panes)

    def add(self, items: Iterable[WindowItem], now: float, *, progress: Iterable[tuple[str, float]] = ()) -> BufferBatch:
        """Buffer a batch seen at ``now``; returns the windows it completes, late and unusable records.

        Lateness is judged against the watermark as it was when the batch started; ``progress``
        holds the upstream tasks' reports (channel, largest event time) that came with the batch.
        """
        out = BufferBatch()
        mark = self.watermark.value(now) if self.watermark is not None else None
        window = self.window
        accepted: list[Item] = []
        for stream, record in items:
            t, problem = window.place(record, now, mark)
            if problem == LATE:
                out.late.append((stream, record))
                continue
            if problem is not None:
                out.dead.append({"record": dict(record), "error": problem})
                continue
            item = (self._seq, t, stream, record)
            self._seq += 1
            if window.counted:
                self._items.append(item)
                out.windows.extend(self._count_window())
            else:
                accepted.append(item)
        self._panes.add(accepted)
        if self.watermark is not None:
            for channel, event_time in progress:
                self.watermark.report(channel, event_time, now)
        out.windows.extend(self.flush(now))
        return out

    def flush(self, now: float, *, force: bool = False) -> list[list[WindowItem]]:
        """Time windows complete at ``now`` (the watermark, for event time).

        Args:
            now: current processing time in seconds.
            force: also return what is buffered as one last window, e.g. on shutdown.
        """
        windows: list[list[WindowItem]] = []
        if not self.window.counted:
            limit = self.watermark.value(now) if self.watermark is not None else now
            if limit is not None:
                windows = self._time_windows(limit)
        if force and self.pending:
            rest = self._panes.take_all() if not self.window.counted else list(self._items)
            windows.append([(stream, record) for _, _, stream, record in rest])
            self._items.clear()
            self._since_emit = 0
        return windows

    def _count_window(self) -> list[list[WindowItem]]:
        # the deque of a sliding count window keeps only the last ``length`` records
        self._since_emit += 1
        if self.window.kind == "tumbling":
            if len(self._items) < int(self.window.length):
                return []
            window = [(s, r) for _, _, s, r in self._items]
            self._items.clear()
            self._since_emit = 0
            return [window]
        if self._since_emit < int(self.window.slide):
            return []
        self._since_emit = 0
        return [[(s, r) for _, _, s, r in self._items]]

    def _time_windows(self, limit: float) -> list[list[WindowItem]]:
        # The arithmetic of the window ends is the original one (one window per step, from the
        # earliest record or the end after the last one closed), so float bounds come out the same.
        length, slide = self.window.length, self.window.slide
        windows = []
        while len(self._panes):
            earliest = self._panes.earliest()
            assert earliest is not None
            first_end = math.floor(earliest / slide) * slide + length
            while first_end - slide > earliest:  # the earliest window covering it (sliding)
                first_end -= slide
            end = first_end if self._next_end is None else max(self._next_end, first_end)
            if end > limit:
                break
            start = end - length
            contents = self._panes.window(start, end)
            if contents:
                windows.append([(s, r) for _, _, s, r in contents])
            self._next_end = end + slide
            self._panes.drop_before(self._next_end - length)
            self._closed_seq = self._seq
        return windows

    # --- checkpoints ---------------------------------------------------------------------------

    def changes(self, now: float) -> tuple[list[tuple[EntryKey, Any]], list[EntryKey]]:
        """The state entries to write and to delete since the last call (a batch's state change):
        the records added since, by pane (count windows: as one entry), the entries whose records
        have all left, and the meta entry when it changed.

        Raises:
            StateError: a record added since the last call is not JSON-able (nothing is taken
                then: the next call tries again).
        """
        counted = self.window.counted
        if counted:
            fresh = self._fresh_count_items()
            puts: list[tuple[EntryKey, Any]] = [((PREFIX, "c", self._written_seq), _entry(fresh))] if fresh else []
        else:
            puts = [((PREFIX, "t", self._written_seq, index), _entry(chunk.items)) for index, chunk in self._panes.fresh()]
        try:
            for _, value in puts:
                json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise StateError(f"window buffer is not JSON-able, so it cannot be checkpointed: {e}") from e
        deletes = self._deletes
        if counted:
            first_alive = self._items[0][0] if self._items else self._seq
            while self._written_counts and self._written_counts[0][1] < first_alive:
                deletes.add(self._written_counts.popleft()[0])
            if fresh:
                self._written_counts.append((puts[0][0], fresh[-1][0]))
        else:
            self._panes.written([key for key, _ in puts])
            deletes.update(self._panes.take_dropped())
        meta = self._meta(now)
        if meta != self._written_meta:
            puts.append((META, meta))
            self._written_meta = meta
        self._written_seq = self._seq
        self._deletes = set()
        return puts, sorted(deletes, key=repr)

    def _fresh_count_items(self) -> list[Item]:
        fresh: list[Item] = []
        for item in reversed(self._items):
            if item[0] < self._written_seq:
                break
            fresh.append(item)
        fresh.reverse()
        return fresh

    def _meta(self, now: float) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "window": self.window.to_spec(),
            "seq": self._seq,
            "closed_seq": self._closed_seq,
            "since_emit": self._since_emit,
            "next_end": self._next_end,
            "watermark": self.watermark.state(now) if self.watermark is not None else None,
        }

    def restore(self, entries: Iterable[tuple[EntryKey, Any]], now: float) -> int:
        """Replace the buffer with the one stored in ``entries`` (a task's store, in any order;
        entries of others are ignored); returns how many entries were the buffer's.

        A format 2 snapshot (the whole buffer as one value) is read too; the next
        :meth:`changes` writes it as entries and deletes it.

        Raises:
            StateError: the entries were written with another window, are of another format,
                or are malformed.
        """
        self._reset()
        meta: Any = None
        snapshot: Any = None
        chunks: list[tuple[EntryKey, Any]] = []
        count = 0
        for key, value in entries:
            if not key or key[0] != PREFIX:
                continue
            count += 1
            if tuple(key) == SNAPSHOT_KEY:
                snapshot = value
            elif tuple(key) == META:
                meta = value
            else:
                chunks.append((tuple(key), value))
        if snapshot is not None and meta is None:
            self._restore_snapshot(snapshot, now)
            self._deletes.add(SNAPSHOT_KEY)
            for key, _ in chunks:
                self._deletes.add(key)
            return count
        if snapshot is not None:
            self._deletes.add(SNAPSHOT_KEY)
        if meta is None:
            if chunks:
                raise StateError(
                    f"window buffer entries without their meta entry {META!r}; the store is not one this stream_ops wrote"
                )
            return count
        self._check_format(meta, STATE_VERSION)
        try:
            self._seq, self._closed_seq = int(meta["seq"]), int(meta["closed_seq"])
            self._since_emit = int(meta["since_emit"])
            self._next_end = None if meta.get("next_end") is None else float(meta["next_end"])
            kind, size = ("c", 3) if self.window.counted else ("t", 4)
            parsed: list[tuple[EntryKey, int, list[Item]]] = [
                (key, int(key[2]), [(int(n), float(t), str(s), dict(r)) for n, t, s, r in value]) for key, value in chunks
            ]
            strange = [key for key, _, _ in parsed if key[1] != kind or len(key) != size]
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise StateError(f"not a window buffer entry: {e}") from e
        if strange:
            raise StateError(f"window buffer entries {strange[:3]} are not of a {self.window.describe()} buffer")
        for key, _, items in sorted(parsed, key=lambda chunk: chunk[1]):
            if self.window.counted:
                # a sliding count window's deque keeps the last ``length`` records, the ones
                # still in it; an entry whose records all left is deleted by the next changes()
                kept = items
                self._items.extend(kept)
            else:
                kept = [item for item in items if not self._dropped_by_last_close(item)]
            if not kept:
                self._deletes.add(key)
            elif self.window.counted:
                self._written_counts.append((key, kept[-1][0]))
            else:
                self._panes.load(int(key[3]), key, kept)
        self._written_seq = self._seq
        if self.watermark is not None and meta.get("watermark") is not None:
            self.watermark.restore(meta["watermark"], now)
        self._written_meta = dict(meta)
        return count

    def _dropped_by_last_close(self, item: Item) -> bool:
        """Whether closing windows dropped a written record: it arrived before the last close
        and lies before the start of the next window (closes only ever move that start on)."""
        return self._next_end is not None and item[0] < self._closed_seq and item[1] < self._next_end - self.window.length

    def _restore_snapshot(self, state: Any, now: float) -> None:
        self._check_format(state, SNAPSHOT_VERSION)
        try:
            items = [(float(t), str(s), dict(r)) for t, s, r in state["items"]]
            since, next_end, mark = int(state["since_emit"]), state.get("next_end"), state.get("watermark")
        except (KeyError, TypeError, ValueError) as e:
            raise StateError(f"not a window buffer snapshot: {e}") from e
        numbered = [(seq, t, stream, record) for seq, (t, stream, record) in enumerate(items)]
        self._seq = len(numbered)
        if self.window.counted:
            self._items.extend(numbered)
        else:
            self._panes.add(numbered)
        self._since_emit = since
        self._next_end = None if next_end is None else float(next_end)
        if self.watermark is not None and mark is not None:
            self.watermark.restore(mark, now)

    def _check_format(self, state: Any, version: int) -> None:
        if not isinstance(state, Mapping) or state.get("version") != version:
            found = state.get("version") if isinstance(state, Mapping) else None
            raise StateError(
                f"not a window buffer state of format {version} (version {found!r}); it was not written by this stream_ops"
            )
        try:
            taken = WindowDef.from_spec(state["window"])
        except (KeyError, TypeError, ValueError) as e:
            raise StateError(f"not a window buffer state: {e}") from e
        mine = (self.window.kind, self.window.counted, self.window.length, self.window.slide, self.window.time)
        if (taken.kind, taken.counted, taken.length, taken.slide, taken.time) != mine:
            raise StateError(
                f"window state was taken with {taken.describe()}, this buffer holds {self.window.describe()}; "
                "restore it into the same window (or drop the state)"
            )


def _entry(items: Iterable[Item]) -> list[list[Any]]:
    """The stored form of buffered records: ``[seq, time, stream, record]`` each."""
    return [[seq, t, stream, record if isinstance(record, dict) else dict(record)] for seq, t, stream, record in items]
