"""A window buffer over several streams: the records of each window, for Storm's JoinBolt.

Where :class:`~stream_ops.operators.window_aggregation.WindowedAggregation` keeps partial
aggregates, a join needs each window's records, so :class:`WindowBuffer` keeps them, as
Storm's windowed bolts do, and hands every complete window over as ``(stream, record)``
pairs in arrival order. Count windows count records of all streams together (Storm's
``Count.of``); time windows follow :mod:`stream_ops.topology.windows` (epoch aligned,
tumbling or sliding, processing or event time with a watermark and late records). A window
without records is never returned. The buffer is JSON task state (:meth:`state`).

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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stream_ops.errors import StateError
from stream_ops.topology.windows import LATE, Watermark, WindowDef

WindowItem = tuple[str, Mapping[str, Any]]
"""One record of a window: ``(stream name, record)``."""

STATE_VERSION = 2


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
        self._items: list[tuple[float, str, Mapping[str, Any]]] = []
        self._since_emit = 0
        self._next_end: float | None = None

    @property
    def pending(self) -> int:
        """Records buffered."""
        return len(self._items)

    def add(self, items: Iterable[WindowItem], now: float, *, progress: Iterable[tuple[str, float]] = ()) -> BufferBatch:
        """Buffer a batch seen at ``now``; returns the windows it completes, late and unusable records.

        Lateness is judged against the watermark as it was when the batch started; ``progress``
        holds the upstream tasks' reports (channel, largest event time) that came with the batch.
        """
        out = BufferBatch()
        mark = self.watermark.value(now) if self.watermark is not None else None
        for stream, record in items:
            t, problem = self.window.place(record, now, mark)
            if problem == LATE:
                out.late.append((stream, record))
                continue
            if problem is not None:
                out.dead.append({"record": dict(record), "error": problem})
                continue
            self._items.append((t, stream, record))
            if self.window.counted:
                out.windows.extend(self._count_window())
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
        if force and self._items:
            windows.append([(stream, record) for _, stream, record in self._items])
            self._items, self._since_emit = [], 0
        return windows

    def _count_window(self) -> list[list[WindowItem]]:
        length, slide = int(self.window.length), int(self.window.slide)
        self._since_emit += 1
        if self.window.kind == "tumbling":
            if len(self._items) < length:
                return []
            window, self._items, self._since_emit = self._items, [], 0
            return [[(s, r) for _, s, r in window]]
        self._items = self._items[-length:]
        if self._since_emit < slide:
            return []
        self._since_emit = 0
        return [[(s, r) for _, s, r in self._items]]

    def _time_windows(self, limit: float) -> list[list[WindowItem]]:
        length, slide = self.window.length, self.window.slide
        windows = []
        while self._items:
            earliest = min(t for t, _, _ in self._items)
            first_end = math.floor(earliest / slide) * slide + length
            while first_end - slide > earliest:  # the earliest window covering it (sliding)
                first_end -= slide
            end = first_end if self._next_end is None else max(self._next_end, first_end)
            if end > limit:
                break
            start = end - length
            contents = [(s, r) for t, s, r in self._items if start <= t < end]
            if contents:
                windows.append(contents)
            self._next_end = end + slide
            keep_from = self._next_end - length
            self._items = [item for item in self._items if item[0] >= keep_from]
        return windows

    # --- checkpoints ---------------------------------------------------------------------------

    def state(self, now: float) -> dict[str, Any]:
        """JSON-able snapshot of the buffer, to store with the task's state.

        Raises:
            StateError: a buffered record is not JSON-able.
        """
        snapshot = {
            "version": STATE_VERSION,
            "window": self.window.to_spec(),
            "items": [[t, stream, dict(record)] for t, stream, record in self._items],
            "since_emit": self._since_emit,
            "next_end": self._next_end,
            "watermark": self.watermark.state(now) if self.watermark is not None else None,
        }
        try:
            return json.loads(json.dumps(snapshot, allow_nan=False))
        except (TypeError, ValueError) as e:
            raise StateError(f"window buffer is not JSON-able, so it cannot be checkpointed: {e}") from e

    def restore(self, state: Mapping[str, Any], now: float) -> None:
        """Replace the buffer with one returned by :meth:`state`.

        Raises:
            StateError: the snapshot was taken with another window, is of another format
                (no ``"version": STATE_VERSION``), or is malformed.
        """
        if state.get("version") != STATE_VERSION:
            raise StateError(
                f"not a window buffer snapshot of format {STATE_VERSION} (version {state.get('version')!r}); "
                "it was not written by this stream_ops"
            )
        try:
            taken = WindowDef.from_spec(state["window"])
            items: list[tuple[float, str, Mapping[str, Any]]] = [(float(t), str(s), dict(r)) for t, s, r in state["items"]]
            since, next_end, mark = int(state["since_emit"]), state.get("next_end"), state.get("watermark")
        except (KeyError, TypeError, ValueError) as e:
            raise StateError(f"not a window buffer snapshot: {e}") from e
        mine = (self.window.kind, self.window.counted, self.window.length, self.window.slide, self.window.time)
        if (taken.kind, taken.counted, taken.length, taken.slide, taken.time) != mine:
            raise StateError(
                f"window snapshot was taken with {taken.describe()}, this buffer holds {self.window.describe()}; "
                "restore it into the same window (or drop the snapshot)"
            )
        self._items, self._since_emit = items, since
        self._next_end = None if next_end is None else float(next_end)
        if self.watermark is not None and mark is not None:
            self.watermark.restore(mark, now)
