"""The window model: lengths, window kinds, time modes and watermarks, as a pure core.

One model serves windowed aggregation (:meth:`Stream.window`), Storm's windowed JoinBolt and
processing elements. A window is defined by

* its kind: :class:`Tumbling` (``length``), :class:`Sliding` (``length``, ``slide``) or
  :class:`Session` (``gap``);
* lengths as a :class:`Duration` or a record count :class:`Records` (Storm's
  ``Duration.of`` / ``Count.of``; ``Count`` is the aggregator here, so the count is
  ``Records``); a plain number or a ``timedelta`` is a duration in seconds;
* its time: ``"processing"`` (the task's clock) or ``"event"`` (a timestamp field of each
  record, with a watermark).

Time windows are aligned to the epoch, as Spark's ``window()``: a window of length ``L`` and
slide ``S`` starts at every multiple of ``S`` and covers ``[start, start + L)``; a record
belongs to every window that covers its time (``L / S`` of them). Count windows count records
per key in arrival order: a tumbling count window closes at every ``length``-th record, a
sliding one every ``slide`` records over the last ``length``. A session window of a key
covers its records closer than ``gap`` to each other, from the first record's time to the
last one's plus ``gap`` (Spark's ``session_window``).

Event time (:class:`Watermark`): the watermark is the event time every upstream task has
reached (the smallest of their largest event times) minus ``lag`` (Storm's ``withLag``,
Spark's ``withWatermark``; per input channel as in Flink). A window closes once the
watermark reaches its end; a record whose time is before the watermark is *late*, and goes
to the late stream (or the dead letters). By default the watermark waits for data, as in
Spark and Storm: the last windows close when newer records arrive. With ``idle_timeout=s``,
once no record has arrived for ``s`` seconds of processing time the watermark moves on with
processing time, as if events kept coming, so the last windows close without new data (the
task's ticks drive this); the price is that records held up longer than that upstream (a
source task down for a while) arrive late.

Nothing here reads a clock: callers pass processing time ``now`` in seconds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from stream_ops.errors import TopologyDefinitionError
from stream_ops.helpers.field_paths import value_or_none

TimeMode = Literal["processing", "event"]
WindowKind = Literal["tumbling", "sliding", "session"]
LATE = "late"
"""What :meth:`WindowDef.place` says of a record before the watermark."""
WINDOW_START = "window_start"
WINDOW_END = "window_end"
"""Fields added to every windowed result: the window's bounds in seconds since the epoch
(event-time windows) or of the task's processing clock."""


# --- lengths ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Duration:
    """A window length or slide in time (Storm's ``BaseWindowedBolt.Duration``).

    Example:
        >>> Duration.seconds(90) == Duration.minutes(1.5) == Duration.of(90_000)
        True
    """

    value: float
    """Seconds."""

    def __post_init__(self) -> None:
        if isinstance(self.value, bool) or not isinstance(self.value, (int, float)) or not math.isfinite(self.value):
            raise TopologyDefinitionError(f"a duration must be a number of seconds, got {self.value!r}")
        if self.value <= 0:
            raise TopologyDefinitionError(f"a duration must be positive, got {self.value!r} s")

    @classmethod
    def of(cls, milliseconds: float) -> Duration:
        """``milliseconds`` long, as Storm's ``Duration.of(int ms)``."""
        return cls(milliseconds / 1000.0)

    @classmethod
    def seconds(cls, n: float) -> Duration:
        """``n`` seconds long."""
        return cls(float(n))

    @classmethod
    def minutes(cls, n: float) -> Duration:
        """``n`` minutes long."""
        return cls(float(n) * 60.0)

    @classmethod
    def hours(cls, n: float) -> Duration:
        """``n`` hours long."""
        return cls(float(n) * 3600.0)


@dataclass(frozen=True)
class Records:
    """A window length or slide in records (Storm's ``BaseWindowedBolt.Count``)."""

    count: int

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count <= 0:
            raise TopologyDefinitionError(f"a record count must be a positive integer, got {self.count!r}")

    @classmethod
    def of(cls, n: int) -> Records:
        """``n`` records, as Storm's ``Count.of(n)``."""
        return cls(n)


Length = Duration | Records


def as_length(value: Any, what: str) -> Length:
    """``value`` as a :class:`Duration` or :class:`Records`; numbers and timedeltas are seconds.

    Raises:
        TopologyDefinitionError: anything else, or a length that is not positive.
    """
    if isinstance(value, (Duration, Records)):
        return value
    if isinstance(value, timedelta):
        return Duration(value.total_seconds())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return Duration(float(value))
        except TopologyDefinitionError as e:
            raise TopologyDefinitionError(f"{what}: {e}") from None
    raise TopologyDefinitionError(
        f"{what}: {value!r} is not a window length; give seconds, a timedelta, Duration.seconds(n) or Records.of(n)"
    )


# --- window kinds ----------------------------------------------------------------------------


@dataclass(frozen=True, init=False)
class Tumbling:
    """Fixed, non-overlapping windows of ``length`` (a duration or :class:`Records`)."""

    length: Length

    def __init__(self, length: Any) -> None:
        object.__setattr__(self, "length", as_length(length, "Tumbling(length)"))


@dataclass(frozen=True, init=False)
class Sliding:
    """Windows of ``length`` starting every ``slide`` (both durations, or both record counts)."""

    length: Length
    slide: Length

    def __init__(self, length: Any, slide: Any) -> None:
        length = as_length(length, "Sliding(length, slide)")
        slide = as_length(slide, "Sliding(length, slide)")
        if type(length) is not type(slide):
            raise TopologyDefinitionError(
                f"Sliding({length}, {slide}): length and slide must both be durations or both be Records.of(n)"
            )
        if _size(slide) > _size(length):
            raise TopologyDefinitionError(
                f"Sliding({length}, {slide}): the slide is longer than the window, so records between windows "
                "would belong to none; use a slide <= length"
            )
        object.__setattr__(self, "length", length)
        object.__setattr__(self, "slide", slide)


@dataclass(frozen=True, init=False)
class Session:
    """Per-key windows of records less than ``gap`` apart (a duration)."""

    gap: Duration

    def __init__(self, gap: Any) -> None:
        gap = as_length(gap, "Session(gap)")
        if isinstance(gap, Records):
            raise TopologyDefinitionError("Session(gap): the gap is a duration, not a record count")
        object.__setattr__(self, "gap", gap)


WindowShape = Tumbling | Sliding | Session


def _size(length: Length) -> float:
    return float(length.count) if isinstance(length, Records) else length.value


# --- the plan form -----------------------------------------------------------------------------


@dataclass(frozen=True)
class WindowDef:
    """A complete window definition, as the plan stores it (:meth:`to_spec`).

    Attributes:
        kind: ``tumbling``, ``sliding`` or ``session``.
        counted: lengths are record counts (else seconds).
        length: seconds or records (a session's gap).
        slide: seconds or records (``length`` for tumbling and session windows).
        time: ``processing`` or ``event``.
        timestamp_field: the record field holding event time (event time only).
        timestamp_unit: ``s`` or ``ms``: the unit of that field; window bounds are in seconds.
        lag: seconds the watermark stays behind the largest event time seen.
        idle_timeout: seconds without records after which the watermark moves on with
            processing time (None: it waits for data).
        late_stream: name of the stream late records go to (None: the dead letters).
    """

    kind: WindowKind
    counted: bool
    length: float
    slide: float
    time: TimeMode = "processing"
    timestamp_field: str | None = None
    timestamp_unit: Literal["s", "ms"] = "s"
    lag: float = 0.0
    idle_timeout: float | None = None
    late_stream: str | None = None

    @classmethod
    def build(
        cls,
        shape: Any,
        *,
        time: str = "processing",
        timestamp_field: str | None = None,
        timestamp_unit: str = "s",
        lag: Any = 0.0,
        idle_timeout: Any = None,
        late_stream: str | None = None,
        what: str = "window()",
    ) -> WindowDef:
        """Check and combine a user's window arguments.

        Raises:
            TopologyDefinitionError: naming the argument at fault.
        """
        kind: WindowKind
        if isinstance(shape, Tumbling):
            kind, length, slide = "tumbling", shape.length, shape.length
        elif isinstance(shape, Sliding):
            kind, length, slide = "sliding", shape.length, shape.slide
        elif isinstance(shape, Session):
            kind, length, slide = "session", shape.gap, shape.gap
        else:
            raise TopologyDefinitionError(f"{what}: expected Tumbling(...), Sliding(...) or Session(...), got {shape!r}")
        if time not in ("processing", "event"):
            raise TopologyDefinitionError(f"{what}: time must be 'processing' or 'event', got {time!r}")
        counted = isinstance(length, Records)
        if time == "event":
            if counted:
                raise TopologyDefinitionError(
                    f"{what}: count windows count records in arrival order; event time needs a duration window"
                )
            if not isinstance(timestamp_field, str) or not timestamp_field:
                raise TopologyDefinitionError(f"{what}: event time needs timestamp_field='the field holding event time'")
        elif timestamp_field is not None:
            raise TopologyDefinitionError(f"{what}: timestamp_field={timestamp_field!r} needs time='event'")
        if timestamp_unit not in ("s", "ms"):
            raise TopologyDefinitionError(f"{what}: timestamp_unit must be 's' or 'ms', got {timestamp_unit!r}")
        lag_s = _seconds(lag, f"{what} lag", allow_zero=True)
        if time == "processing" and lag_s:
            raise TopologyDefinitionError(f"{what}: lag applies to event time only (processing time is never late)")
        idle = None if idle_timeout is None else _seconds(idle_timeout, f"{what} idle_timeout", allow_zero=False)
        if idle is not None and time != "event":
            raise TopologyDefinitionError(f"{what}: idle_timeout applies to event time only")
        if late_stream is not None and time != "event":
            raise TopologyDefinitionError(f"{what}: late_stream needs time='event' (processing time is never late)")
        return cls(
            kind=kind,
            counted=counted,
            length=_size(length),
            slide=_size(slide),
            time=time,  # type: ignore[arg-type]
            timestamp_field=timestamp_field,
            timestamp_unit=timestamp_unit,  # type: ignore[arg-type]
            lag=lag_s,
            idle_timeout=idle,
            late_stream=late_stream,
        )

    # --- assignment ----------------------------------------------------------------------------

    def windows_of(self, t: float) -> list[tuple[float, float]]:
        """The time windows ``[start, end)`` covering time ``t``, oldest first (tumbling and
        sliding time windows only)."""
        assert not self.counted and self.kind != "session"
        last_start = math.floor(t / self.slide) * self.slide
        starts = []
        start = last_start
        while start + self.length > t:
            starts.append(start)
            start -= self.slide
        return [(s, s + self.length) for s in reversed(starts)]

    def place(self, record: Mapping[str, Any], now: float, mark: float | None) -> tuple[float, str | None]:
        """Where ``record`` falls in time: ``(time, None)`` for a record to window at ``time``
        (its event time, or ``now`` for processing time), ``(nan, LATE)`` for a record before
        the watermark ``mark``, ``(nan, reason)`` for one without a usable event time."""
        if self.time == "processing":
            return now, None
        event_time = self.event_time(record)
        if event_time is None:
            return math.nan, f"no usable event time in field {self.timestamp_field!r}"
        if mark is not None and event_time < mark:
            return math.nan, LATE
        return event_time, None

    def event_time(self, record: Mapping[str, Any]) -> float | None:
        """The record's event time in seconds, or None when it has no usable timestamp."""
        assert self.timestamp_field is not None
        return event_time_of(record, self.timestamp_field, self.timestamp_unit)

    def progress_spec(self) -> dict[str, str] | None:
        """What an upstream task needs to report its event-time progress to this window
        (``{"timestamp_field", "timestamp_unit"}``), or None for processing time."""
        if self.time != "event" or self.timestamp_field is None:
            return None
        return {"timestamp_field": self.timestamp_field, "timestamp_unit": self.timestamp_unit}

    # --- plan form ------------------------------------------------------------------------------

    def to_spec(self) -> dict[str, Any]:
        """JSON description for the plan."""
        return {
            "kind": self.kind,
            "counted": self.counted,
            "length": self.length,
            "slide": self.slide,
            "time": self.time,
            "timestamp_field": self.timestamp_field,
            "timestamp_unit": self.timestamp_unit,
            "lag": self.lag,
            "idle_timeout": self.idle_timeout,
            "late_stream": self.late_stream,
        }

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> WindowDef:
        """Inverse of :meth:`to_spec`."""
        try:
            return cls(
                kind=spec["kind"],
                counted=bool(spec["counted"]),
                length=float(spec["length"]),
                slide=float(spec["slide"]),
                time=spec.get("time", "processing"),
                timestamp_field=spec.get("timestamp_field"),
                timestamp_unit=spec.get("timestamp_unit", "s"),
                lag=float(spec.get("lag", 0.0)),
                idle_timeout=spec.get("idle_timeout"),
                late_stream=spec.get("late_stream"),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise TopologyDefinitionError(f"malformed window description ({type(e).__name__}: {e})") from e

    @property
    def tick_interval_s(self) -> float | None:
        """How often the task should tick so windows close without new data."""
        if self.counted:
            return None
        periods = [self.slide] + ([self.idle_timeout] if self.idle_timeout else [])
        return max(min(periods) / 2, 0.2)

    def describe(self) -> str:
        """A few words, e.g. ``tumbling 60 s event-time windows``."""
        unit = "records" if self.counted else "s"
        size = f"{self.length:g} {unit}"
        if self.kind == "sliding":
            size += f" every {self.slide:g} {unit}"
        if self.kind == "session":
            size = f"gap {self.length:g} s"
        return f"{self.kind} {size} {self.time}-time windows"


def event_time_of(record: Mapping[str, Any], timestamp_field: str, unit: str) -> float | None:
    """``record``'s event time in seconds from ``timestamp_field`` (in ``unit``: ``s`` or
    ``ms``), or None when it has no usable (finite, numeric) timestamp."""
    value = value_or_none(record, timestamp_field)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value / 1000.0 if unit == "ms" else float(value)


def _seconds(value: Any, what: str, *, allow_zero: bool) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, Duration):
        value = value.value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TopologyDefinitionError(f"{what} must be a number of seconds, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise TopologyDefinitionError(f"{what} must be {'>= 0' if allow_zero else 'positive'}, got {value!r}")
    return float(value)


# --- the watermark --------------------------------------------------------------------------------


class Watermark:
    """Event-time progress of one task: the event time seen minus ``lag``.

    A task reads records from several upstream tasks (*channels*), which run their batches
    independently: one may be several batches ahead of another. So the upstream tasks report
    their progress (the largest event time each sent, see :meth:`report`) and the watermark is
    the *smallest* of those minus ``lag``, as in Flink: a record of the slowest upstream task
    is not late because a faster one ran ahead. With ``idle_timeout=s``, a channel that
    reported nothing for ``s`` seconds stops holding the watermark back (Flink's idleness);
    when every channel is idle the watermark moves on with processing time. The watermark
    starts only once each of the expected ``channels`` (the plan's ``progress_channels``, never
    empty) reported or went idle: an upstream task that never receives data holds it back
    unless ``idle_timeout`` is set.

    Channel progress is task state (:meth:`state` / :meth:`restore`); the processing time of
    the last arrival is not: after a restore it starts again at the restore time, so a task
    move never makes in-flight records late. The watermark never goes back.

    Example:
        >>> mark = Watermark(lag=5, idle_timeout=10, now=0.0, channels=["words/0", "words/1"])
        >>> mark.report("words/0", 100.0, now=0.0)
        >>> mark.report("words/1", 40.0, now=0.0)
        >>> mark.value(now=1.0)  # the slower upstream task decides
        35.0
        >>> mark.report("words/0", 130.0, now=12.0)
        >>> mark.value(now=12.0)  # words/1 idle for 12 s > 10 s: no longer waited for
        125.0
    """

    def __init__(self, lag: float, idle_timeout: float | None, now: float, *, channels: Iterable[str]) -> None:
        """A watermark waiting for the upstream ``channels`` (``"<stage>/<queue>"`` each).

        Raises:
            ValueError: ``channels`` is empty (an event-time window task always has upstream
                tasks; a plan's event-time stage lists them in ``progress_channels``).
        """
        self.lag = lag
        self.idle_timeout = idle_timeout
        self.expected = frozenset(channels)
        """The upstream channels to wait for before the watermark starts (all of them report)."""
        if not self.expected:
            raise ValueError("an event-time watermark needs the upstream channels that report to it (channels=)")
        self.channels: dict[str, float] = {}
        """Largest event time reported per upstream channel."""
        self._floor: float | None = None
        self._last_arrival = now
        self._started = now
        self._channel_arrival: dict[str, float] = {}

    def report(self, channel: str, event_time: float, now: float) -> None:
        """Upstream ``channel`` has sent every record up to ``event_time`` (its largest)."""
        self._floor = self.value(now)
        seen = self.channels.get(channel)
        self.channels[channel] = event_time if seen is None else max(seen, event_time)
        self._channel_arrival[channel] = now
        self._last_arrival = now

    def value(self, now: float) -> float | None:
        """The watermark at ``now`` (None until every channel reported or went idle); it
        never goes back."""
        mark = self._channel_mark(now)
        if mark is None:
            return self._floor
        return mark if self._floor is None else max(mark, self._floor)

    def _channel_mark(self, now: float) -> float | None:
        active = []
        for channel in self.expected | self.channels.keys():
            if self._idle_for(now, self._channel_arrival.get(channel, self._started)) > 0.0:
                continue
            if channel not in self.channels:
                return None  # an upstream task not heard from yet holds the watermark
            active.append(self.channels[channel])
        if active:
            return min(active) - self.lag
        if not self.channels:
            return None
        return max(self.channels.values()) - self.lag + self._idle_for(now, self._last_arrival)

    def _idle_for(self, now: float, last: float) -> float:
        """Seconds past the idle timeout since ``last`` (0 without a timeout)."""
        return 0.0 if self.idle_timeout is None else max(0.0, now - last - self.idle_timeout)

    def state(self, now: float) -> dict[str, Any]:
        """JSON-able progress to checkpoint with the task."""
        return {"floor": self.value(now), "channels": dict(self.channels)}

    def restore(self, state: Mapping[str, Any], now: float) -> None:
        """Continue from :meth:`state`; the idle clocks restart at ``now``."""
        self._floor = state.get("floor")
        self.channels = {str(k): float(v) for k, v in (state.get("channels") or {}).items()}
        self._channel_arrival = dict.fromkeys(self.channels, now)
        self._last_arrival = self._started = now
