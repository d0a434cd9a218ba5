"""Windowed aggregation per key, as a pure core with incremental checkpoints.

:class:`WindowedAggregation` keeps one partial aggregate per open (window, key) instead of
the window's records, so a long window costs one value per key. Each batch returns the
results of the windows it closed, the late records and the records that could not be used.
Its state is a set of entries (:meth:`changes` gives what a batch wrote and deleted), so a
task stores only the windows a batch touched, and :meth:`restore` rebuilds everything from
the entries after a move. See :mod:`stream_ops.topology.windows` for the window rules.

Entry keys (tuples, under the task's store):

* ``("__window__", "meta")``: the watermark.
* ``("__window__", "t", start, end, key)``: the partial of a time window for one key.
* ``("__window__", "c", key)``: a key's count window: ``{"acc", "n", "first"}`` (tumbling) or
  ``{"values", "since", "times"}`` (sliding: the last ``length`` partials and their arrival times).
* ``("__window__", "s", key)``: a key's open sessions ``[[start, end, partial], ...]``.

``key`` is the canonical JSON of the key fields' values (:func:`stream_ops.hashing.encode_key`).

Example:
    >>> from stream_ops.operators.aggregators import Count
    >>> from stream_ops.topology.windows import Tumbling, WindowDef
    >>> window = WindowDef.build(Tumbling(10), time="event", timestamp_field="ts", idle_timeout=None)
    >>> agg = WindowedAggregation(window, ("user",), Count(), "n", now=0.0, channels=["0/0"])
    >>> agg.process([{"user": "ann", "ts": 3}, {"user": "ann", "ts": 12}], now=0.0, progress=[("0/0", 12.0)]).results
    [{'user': 'ann', 'n': 1, 'window_start': 0.0, 'window_end': 10.0}]
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stream_ops.hashing import encode_key
from stream_ops.helpers.field_paths import value_or_none
from stream_ops.operators.aggregators import CombinerAggregator
from stream_ops.operators.window_partials import PartialRow
from stream_ops.topology.windows import LATE, WINDOW_END, WINDOW_START, Watermark, WindowDef

Record = dict[str, Any]
EntryKey = tuple[Any, ...]

PREFIX = "__window__"
META = (PREFIX, "meta")


@dataclass
class WindowBatch:
    """What one batch (or tick) of a windowed aggregation produced."""

    results: list[Record] = field(default_factory=list)
    """One record per closed (window, key): key fields, the aggregate, window_start, window_end."""
    late: list[Record] = field(default_factory=list)
    """Records whose event time was before the watermark."""
    dead: list[dict[str, Any]] = field(default_factory=list)
    """``{"record", "error"}`` for records without a usable timestamp or that the aggregator rejects."""


class WindowedAggregation:
    """Aggregates records per (window, key) and emits each window once when it closes.

    Args:
        window: the window definition.
        key_fields: the grouping fields (empty: one window over the whole stream).
        aggregator: the combiner (``init`` per record, ``combine`` of partials).
        value_field: the result field holding the aggregate.
        now: processing time at creation (starts the watermark's idle clock).
        channels: the upstream tasks an event-time watermark waits for (see :class:`Watermark`;
            required for event time).
    """

    def __init__(
        self,
        window: WindowDef,
        key_fields: Sequence[str],
        aggregator: CombinerAggregator,
        value_field: str,
        now: float,
        *,
        channels: Sequence[str] = (),
    ) -> None:
        self.window = window
        self.key_fields = tuple(key_fields)
        self.aggregator = aggregator
        self.value_field = value_field
        self.watermark = Watermark(window.lag, window.idle_timeout, now, channels=channels) if window.time == "event" else None
        self._time: dict[tuple[float, float], dict[str, Any]] = {}
        self._counts: dict[str, dict[str, Any]] = {}
        self._sessions: dict[str, list[list[Any]]] = {}
        self._puts: dict[EntryKey, Any] = {}
        self._deletes: set[EntryKey] = set()

    # --- batches -----------------------------------------------------------------------------

    def process(
        self,
        records: Iterable[Mapping[str, Any]],
        now: float,
        *,
        progress: Iterable[tuple[str, float]] = (),
        partials: Iterable[PartialRow] = (),
    ) -> WindowBatch:
        """Add a batch of records seen at ``now``, then close the windows that are complete.

        Lateness is judged against the watermark as it was when the batch started, so records
        of one batch are never late relative to each other. ``progress`` holds the upstream
        tasks' reports (channel, largest event time) that came with the batch. ``partials`` are
        (start, end, encoded key, partial) of event-time windows that upstream source tasks
        aggregated from records they proved cannot be late here
        (:mod:`~stream_ops.operators.window_partials`): combined into the open windows as they are.
        """
        out = WindowBatch()
        mark = self.watermark.value(now) if self.watermark is not None else None
        for record in records:
            key = encode_key([value_or_none(record, f) for f in self.key_fields])
            t, problem = self.window.place(record, now, mark)
            if problem == LATE:
                out.late.append(dict(record))
                continue
            if problem is not None:
                out.dead.append({"record": dict(record), "error": problem})
                continue
            try:
                partial = self.aggregator.init(record)
            except Exception as e:  # noqa: BLE001 - user aggregators may raise anything
                out.dead.append({"record": dict(record), "error": f"aggregator init: {type(e).__name__}: {e}"})
                continue
            try:
                self._add(key, partial, t, now, out)
            except Exception as e:  # noqa: BLE001 - a combine that rejects this partial
                out.dead.append({"record": dict(record), "error": f"aggregator combine: {type(e).__name__}: {e}"})
        for start, end, key, partial in partials:
            self._add_partial((float(start), float(end)), key, partial)
        if self.watermark is not None:
            for channel, event_time in progress:
                self.watermark.report(channel, event_time, now)
        out.results.extend(self.close(now))
        if self.watermark is not None:
            self._puts[META] = {"watermark": self.watermark.state(now)}
        return out

    def close(self, now: float) -> list[Record]:
        """Results of every time or session window complete at ``now`` (also used on ticks)."""
        if self.window.counted:
            return []
        limit = self.watermark.value(now) if self.watermark is not None else now
        if limit is None:
            return []
        if self.window.kind == "session":
            return self._close_sessions(limit)
        closed = sorted(w for w in self._time if w[1] <= limit)
        results = []
        for start, end in closed:
            for key, partial in sorted(self._time.pop((start, end)).items()):
                results.append(self._result(key, partial, start, end))
                self._delete((PREFIX, "t", start, end, key))
        return results

    def _add(self, key: str, partial: Any, t: float, now: float, out: WindowBatch) -> None:
        window = self.window
        if window.counted:
            self._add_counted(key, partial, now, out)
        elif window.kind == "session":
            self._add_session(key, partial, t)
        else:
            for bounds in window.windows_of(t):
                self._add_partial(bounds, key, partial)

    def _add_partial(self, bounds: tuple[float, float], key: str, partial: Any) -> None:
        """Combine ``partial`` into time window ``bounds`` of ``key``."""
        keys = self._time.setdefault(bounds, {})
        keys[key] = self._combine(keys[key], partial) if key in keys else partial
        self._put((PREFIX, "t", *bounds, key), keys[key])

    def _add_counted(self, key: str, partial: Any, now: float, out: WindowBatch) -> None:
        length, slide = int(self.window.length), int(self.window.slide)
        if self.window.kind == "tumbling":
            slot = self._counts.get(key) or {"acc": None, "n": 0, "first": now}
            slot["acc"] = partial if slot["n"] == 0 else self._combine(slot["acc"], partial)
            slot["n"] += 1
            if slot["n"] >= length:
                out.results.append(self._result(key, slot["acc"], slot["first"], now))
                slot = {"acc": None, "n": 0, "first": now}
                self._counts.pop(key, None)
                self._delete((PREFIX, "c", key))
                return
            self._counts[key] = slot
        else:
            slot = self._counts.setdefault(key, {"values": [], "times": [], "since": 0})
            slot["values"] = (slot["values"] + [partial])[-length:]
            slot["times"] = (slot["times"] + [now])[-length:]
            slot["since"] += 1
            if slot["since"] >= slide:
                slot["since"] = 0
                total = functools.reduce(self._combine, slot["values"])
                out.results.append(self._result(key, total, slot["times"][0], now))
        self._put((PREFIX, "c", key), self._counts[key])

    def _add_session(self, key: str, partial: Any, t: float) -> None:
        gap = self.window.length
        start, end, acc = t, t + gap, partial
        kept = []
        for session in self._sessions.get(key, []):
            s_start, s_end, s_acc = session
            if s_start < end and start < s_end:  # overlapping: merge into one session
                start, end = min(start, s_start), max(end, s_end)
                acc = self._combine(s_acc, acc)
            else:
                kept.append(session)
        kept.append([start, end, acc])
        kept.sort(key=lambda s: (s[0], s[1]))
        self._sessions[key] = kept
        self._put((PREFIX, "s", key), kept)

    def _close_sessions(self, limit: float) -> list[Record]:
        due: list[tuple[float, float, str, Any]] = []
        for key in list(self._sessions):
            sessions = self._sessions[key]
            done = [s for s in sessions if s[1] <= limit]
            if not done:
                continue
            due.extend((s[1], s[0], key, s[2]) for s in done)
            remaining = [s for s in sessions if s[1] > limit]
            if remaining:
                self._sessions[key] = remaining
                self._put((PREFIX, "s", key), remaining)
            else:
                del self._sessions[key]
                self._delete((PREFIX, "s", key))
        return [self._result(key, acc, start, end) for end, start, key, acc in sorted(due, key=lambda d: d[:3])]

    def _combine(self, a: Any, b: Any) -> Any:
        return self.aggregator.combine(a, b)

    def _result(self, key: str, partial: Any, start: float, end: float) -> Record:
        values = json.loads(key)
        return {
            **dict(zip(self.key_fields, values, strict=True)),
            self.value_field: self.aggregator.apply(None, partial),
            WINDOW_START: float(start),
            WINDOW_END: float(end),
        }

    # --- checkpoints ---------------------------------------------------------------------------

    @property
    def open_windows(self) -> int:
        """Open (window, key) partials, count windows and sessions held."""
        return sum(len(keys) for keys in self._time.values()) + len(self._counts) + sum(map(len, self._sessions.values()))

    def _put(self, key: EntryKey, value: Any) -> None:
        self._deletes.discard(key)
        self._puts[key] = value

    def _delete(self, key: EntryKey) -> None:
        self._puts.pop(key, None)
        self._deletes.add(key)

    def changes(self) -> tuple[list[tuple[EntryKey, Any]], list[EntryKey]]:
        """The entries written and deleted since the last call (a batch's state change)."""
        puts, deletes = list(self._puts.items()), sorted(self._deletes, key=repr)
        self._puts, self._deletes = {}, set()
        return puts, deletes

    def restore(self, entries: Iterable[tuple[EntryKey, Any]], now: float) -> int:
        """Rebuild the open windows and the watermark from stored entries; returns how many
        entries were read. Entries without the window prefix are ignored."""
        count = 0
        for key, value in entries:
            if not key or key[0] != PREFIX:
                continue
            count += 1
            if tuple(key) == META:
                if self.watermark is not None:
                    self.watermark.restore(value["watermark"], now)
            elif key[1] == "t":
                _, _, start, end, encoded = key
                self._time.setdefault((float(start), float(end)), {})[encoded] = value
            elif key[1] == "c":
                self._counts[key[2]] = value
            elif key[1] == "s":
                self._sessions[key[2]] = [list(s) for s in value]
        return count
