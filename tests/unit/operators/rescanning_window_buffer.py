"""The window buffer as it was before time windows were bucketed by pane: it rescans every
buffered record for each window it closes. The unit tests hold the new buffer to its results."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from stream_ops.operators.window_buffer import BufferBatch, WindowItem
from stream_ops.topology.windows import LATE, Watermark, WindowDef


class RescanningWindowBuffer:
    """The original WindowBuffer (add, flush, pending), checkpoints left out.

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
