"""Storm's ``JoinBolt``: a windowed hash join of several streams, as a pure Python core.

A :class:`JoinBolt` is built like Storm's (``org.apache.storm.bolt.JoinBolt``): the first stream
and its join field, then one ``join`` / ``left_join`` per further stream, naming the stream it
joins against (the *prior* stream, which must already be part of the join), then ``select``
to choose the output fields, and a window (Storm's ``withWindow`` / ``withTumblingWindow``,
on the window model of :mod:`stream_ops.topology.windows`: count or time, tumbling or
sliding, processing or event time with a lag and a late tuple stream).
:meth:`JoinBolt.execute` joins the records of one complete window;
:class:`~stream_ops.operators.window_buffer.WindowBuffer` cuts a record stream into such
windows and is checkpointed with the task. Nothing here reads a clock.

Join rules (Storm's, plus right and full outer joins):

* The first stream is the probe. Every further stream, in declaration order, is hashed on its
  own join field and joined against the *prior* stream's join field:
  ``JoinBolt("s1", "k1").join("s2", "k2", "s1")`` is SQL
  ``from s1 inner join s2 on s2.k2 = s1.k1``; a later ``.join("s3", "k3", "s2")`` is
  ``inner join s3 on s3.k3 = s2.k2``.
* ``join``: inner join, rows without a match are dropped.
* ``left_join``: every row built so far is kept; a row without a match gets nulls for the
  new stream. A row whose prior join key is missing (null) is kept with nulls too, as in SQL;
  Storm drops it, and ``JoinBolt(..., storm_compat=True)`` does the same.
* ``right_join`` (not in Storm): matched rows, plus every record of the new stream that
  matched no row, with nulls for all earlier streams.
* ``outer_join`` (not in Storm): left and right together (SQL ``full outer join``).
* A missing or null join key never equals anything (SQL null semantics), on either side.
* Join keys compare as JSON values, the way the shuffle routes them
  (:func:`stream_ops.hashing.encode_key`): ``1`` and ``1.0`` are the same key and meet in one
  task, ``true`` is not ``1`` (as in Storm's Java ``equals``), ``"1"`` is not ``1``; list and
  mapping keys are compared by content.

Output order is deterministic: rows follow the probe (first stream) records in window order,
and for each row the matching records of each joined stream in window order; records of a
right/outer-joined stream that matched nothing follow, in window order, after all matched and
left-kept rows of that step.

Projection (``select``): ``"a, s2:b, outer.inner"``. A name with a ``stream:`` prefix is read
only from that stream's record; a name without one from the first record, in stream
declaration order, whose value is present and not null (Storm's rule). Dotted names walk
nested mappings. A field that is missing anywhere gives ``None``. Output field names are the
selected names as written, ``stream:`` prefix included (Storm's ``FieldSelector.outputName``):
``select("users:city, stores:city")`` emits ``users:city`` and ``stores:city``. ``as`` (not in
Storm) renames: ``"users:city as user_city"``.

Example:
    >>> bolt = (
    ...     JoinBolt("spout1", "uuid")
    ...     .join("spout2", "uuid", "spout1")
    ...     .select("uuid, word, spout2:timestamp")
    ...     .with_tumbling_window(count=10)
    ... )
    >>> bolt.output_fields
    ('uuid', 'word', 'spout2:timestamp')
    >>> bolt.execute([
    ...     ("spout1", {"uuid": "u1", "word": "hello", "timestamp": 1}),
    ...     ("spout2", {"uuid": "u1", "timestamp": 7}),
    ... ])
    [['u1', 'hello', 7]]
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from stream_ops.errors import TopologyDefinitionError
from stream_ops.hashing import normalise_key_value
from stream_ops.helpers.field_paths import lookup
from stream_ops.operators.window_buffer import WindowBuffer, WindowItem
from stream_ops.topology.windows import Duration, Records, Sliding, Tumbling, WindowDef, as_length

JoinType = Literal["inner", "left", "right", "outer"]
JOIN_TYPES: tuple[str, ...] = ("inner", "left", "right", "outer")
DEFAULT_OUTPUT_STREAM = "default"
"""Storm emits on the ``default`` stream unless ``withOutputStream`` names another."""

# --- field selectors -------------------------------------------------------------------


@dataclass(frozen=True)
class FieldSelector:
    """One selected field: an optional stream and a (possibly nested) path.

    Attributes:
        stream: Stream the field is read from, or ``None`` for "first record that has it".
        path: Keys walked through nested mappings, e.g. ``("outer", "inner")``.
        alias: Output name given with ``as`` (not in Storm), or ``None``.
    """

    stream: str | None
    path: tuple[str, ...]
    alias: str | None = None

    @property
    def name(self) -> str:
        """Output field name: the alias, else the selector as written (``stream:x.y``), as Storm names it."""
        if self.alias is not None:
            return self.alias
        path = ".".join(self.path)
        return f"{self.stream}:{path}" if self.stream is not None else path

    def __str__(self) -> str:
        text = ".".join(self.path)
        if self.stream is not None:
            text = f"{self.stream}:{text}"
        return f"{text} as {self.alias}" if self.alias is not None else text

    @classmethod
    def parse(cls, text: str, *, what: str) -> FieldSelector:
        """Parse ``"stream:x.y"``, ``"x.y"``, optionally followed by ``as name``.

        Raises:
            TopologyDefinitionError: an empty stream name, field name, path segment or alias.
        """
        stream: str | None = None
        body = text.strip()
        alias: str | None = None
        words = body.split()
        if len(words) >= 2 and words[-2].lower() == "as":
            alias = words[-1]
            body = " ".join(words[:-2])
            if not alias.isidentifier():
                raise TopologyDefinitionError(f"{what}: alias {alias!r} in {text.strip()!r} is not a valid name")
        if ":" in body:
            prefix, _, body = body.partition(":")
            stream = prefix.strip()
            body = body.strip()
            if not stream:
                raise TopologyDefinitionError(f"{what}: {text.strip()!r} has an empty stream name before ':'")
        if not body:
            raise TopologyDefinitionError(f"{what}: {text.strip()!r} names no field")
        path = tuple(part.strip() for part in body.split("."))
        if any(not part or any(ch.isspace() for ch in part) for part in path) or ":" in body:
            raise TopologyDefinitionError(
                f"{what}: {text.strip()!r} is not a field name; use 'field', 'outer.inner' or 'stream:field'"
            )
        return cls(stream, path, alias)


def _hashable(value: Any) -> Any:
    """A hashable stand-in for a join key: JSON equality (``1 == 1.0``, ``True != 1``), lists
    and mappings by content."""
    if isinstance(value, bool):
        return ("__bool__", value)
    if isinstance(value, float):
        return normalise_key_value(value)
    if isinstance(value, Mapping):
        return ("__mapping__", tuple(sorted(((str(k), _hashable(v)) for k, v in value.items()))))
    if isinstance(value, (list, tuple)):
        return ("__sequence__", tuple(_hashable(v) for v in value))
    if isinstance(value, (set, frozenset)):
        return ("__set__", frozenset(_hashable(v) for v in value))
    return value


# --- the join --------------------------------------------------------------------------


@dataclass(frozen=True)
class JoinClause:
    """One stream of the join.

    Attributes:
        stream: The stream (Storm: the source component or stream id).
        field: Its join field, dotted for nested keys.
        prior: The stream it joins against (``None`` for the first stream).
        how: ``inner``, ``left``, ``right`` or ``outer`` (``None`` for the first stream).
    """

    stream: str
    field: str
    prior: str | None = None
    how: JoinType | None = None

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(self.field.split("."))

    def to_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"stream": self.stream, "field": self.field}
        if self.prior is not None:
            spec.update(prior=self.prior, how=self.how)
        return spec


class JoinBolt:
    """Windowed hash join of several streams (Storm's ``JoinBolt``, plus right/outer joins).

    Builder methods check each step and raise :class:`~stream_ops.errors.TopologyDefinitionError`
    naming the stream at fault; they return ``self`` so calls chain as in Storm. See the module
    docstring for the join, null and ordering rules.

    Args:
        source: The first stream (the probe side; SQL ``from source``).
        field: Its join field (dotted for nested keys).
        null_keys: ``"keep"`` (default): a left/outer join keeps a row whose prior join key is
            null, with nulls for the new stream, as SQL does; ``"drop"``: drop it, as Storm does.

    Example:
        >>> bolt = (
        ...     JoinBolt("users", "id")
        ...     .left_join("orders", "user_id", "users")
        ...     .select("id, name, orders:amount")
        ...     .with_tumbling_window(seconds=60)
        ...     .with_output_stream("user_orders")
        ... )
    """

    def __init__(self, source: str, field: str, *, null_keys: Literal["keep", "drop"] = "keep") -> None:
        if null_keys not in ("keep", "drop"):
            raise TopologyDefinitionError(f"JoinBolt null_keys must be 'keep' (SQL) or 'drop' (Storm), got {null_keys!r}")
        self._clauses: list[JoinClause] = [JoinClause(_stream_name(source), _join_field(source, field))]
        self._selectors: tuple[FieldSelector, ...] | None = None
        self._null_keys = null_keys
        self._length: Duration | Records | None = None
        self._slide: Duration | Records | None = None
        self._timestamp_field: str | None = None
        self._timestamp_unit = "s"
        self._lag: float = 0.0
        self._watermark_interval: float | None = None
        self._late_stream: str | None = None
        self._output_stream: str = DEFAULT_OUTPUT_STREAM

    # --- building ----------------------------------------------------------------------

    def join(self, new_stream: str, field: str, prior_stream: str) -> JoinBolt:
        """Inner join: SQL ``inner join new_stream on new_stream.field = prior_stream.<its field>``."""
        return self._add(new_stream, field, prior_stream, "inner")

    def left_join(self, new_stream: str, field: str, prior_stream: str) -> JoinBolt:
        """Left join: rows without a match (or without a key) are kept with nulls for ``new_stream``."""
        return self._add(new_stream, field, prior_stream, "left")

    def right_join(self, new_stream: str, field: str, prior_stream: str) -> JoinBolt:
        """Right join: unmatched ``new_stream`` records are kept with nulls for all earlier streams."""
        return self._add(new_stream, field, prior_stream, "right")

    def outer_join(self, new_stream: str, field: str, prior_stream: str) -> JoinBolt:
        """Full outer join: unmatched rows of both sides are kept, with nulls on the other side."""
        return self._add(new_stream, field, prior_stream, "outer")

    def _add(self, new_stream: str, field: str, prior_stream: str, how: JoinType) -> JoinBolt:
        new_stream = _stream_name(new_stream)
        if new_stream in self.streams:
            raise TopologyDefinitionError(
                f"stream {new_stream!r} is already part of the join (streams: {list(self.streams)}); "
                "a stream can be joined only once"
            )
        if prior_stream not in self.streams:
            raise TopologyDefinitionError(
                f"prior stream {prior_stream!r} of the {how} join with {new_stream!r} was not declared before; "
                f"join against one of {list(self.streams)} or declare {prior_stream!r} first"
            )
        self._clauses.append(JoinClause(new_stream, _join_field(new_stream, field), prior_stream, how))
        return self

    def select(self, fields: str | Sequence[str]) -> JoinBolt:
        """Choose the output fields: ``"a, stream2:b, outer.inner, s3:c as c3"`` (or a list of such names).

        Raises:
            TopologyDefinitionError: an empty selection, a malformed name, a ``stream:`` prefix
                naming a stream not (yet) in the join, or two selectors with the same output name.
        """
        names = fields.split(",") if isinstance(fields, str) else list(fields)
        what = "JoinBolt.select()"
        selectors = tuple(FieldSelector.parse(str(name), what=what) for name in names)
        if not selectors:
            raise TopologyDefinitionError(f"{what} names no field")
        seen: dict[str, FieldSelector] = {}
        for selector in selectors:
            if selector.stream is not None and selector.stream not in self.streams:
                raise TopologyDefinitionError(
                    f"{what}: {str(selector)!r} names stream {selector.stream!r}, which is not part of the join "
                    f"(streams: {list(self.streams)}); declare the join before select()"
                )
            if selector.name in seen:
                raise TopologyDefinitionError(
                    f"{what}: {str(seen[selector.name])!r} and {str(selector)!r} both give output field "
                    f"{selector.name!r}; rename one with '{selector} as other_name'"
                )
            seen[selector.name] = selector
        self._selectors = selectors
        return self

    def with_window(self, length: Any, slide: Any = None) -> JoinBolt:
        """Join each window of ``length`` every ``slide`` (Storm's ``withWindow``): both a
        :class:`~stream_ops.topology.windows.Duration` (or seconds) or both
        :class:`~stream_ops.topology.windows.Records`; without ``slide``, a tumbling window."""
        length = as_length(length, "JoinBolt.with_window(length)")
        slide = length if slide is None else as_length(slide, "JoinBolt.with_window(slide)")
        Sliding(length, slide)  # checks the pair
        self._length, self._slide = length, slide
        return self

    def with_tumbling_window(self, length: Any = None, *, count: int | None = None, seconds: float | None = None) -> JoinBolt:
        """Join each tumbling window (Storm's ``withTumblingWindow``) of ``length`` (a
        ``Duration``, seconds or ``Records``), or of ``count`` records or ``seconds``."""
        given = [v for v in (length, count, seconds) if v is not None]
        if len(given) != 1:
            raise TopologyDefinitionError("a tumbling window needs exactly one of length, count= (records) or seconds= (time)")
        if count is not None:
            if isinstance(count, bool) or not isinstance(count, int) or count <= 0:
                raise TopologyDefinitionError(f"window count must be a positive integer, got {count!r}")
            return self.with_window(Records(count))
        if seconds is not None and (
            isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds <= 0
        ):
            raise TopologyDefinitionError(f"window seconds must be a positive number, got {seconds!r}")
        return self.with_window(Tumbling(given[0]).length)

    def with_timestamp_field(self, field: str, *, unit: Literal["s", "ms"] = "s") -> JoinBolt:
        """Use event time read from ``field`` of every joined stream (Storm's
        ``withTimestampField``), in seconds or milliseconds since the epoch; windows close on
        the watermark."""
        self._timestamp_field = FieldSelector.parse(field, what="JoinBolt.with_timestamp_field()").name
        self._timestamp_unit = unit
        return self

    def with_lag(self, lag: Any) -> JoinBolt:
        """How far the watermark stays behind the largest event time seen (Storm's ``withLag``):
        a ``Duration``, seconds or 0."""
        self._lag = 0.0 if lag == 0 and not isinstance(lag, bool) else _seconds(lag, "JoinBolt.with_lag()")
        return self

    def with_watermark_interval(self, interval: Any) -> JoinBolt:
        """How often windows are evaluated against the watermark when no data arrives (Storm's
        ``withWatermarkInterval``; the task's tick interval)."""
        self._watermark_interval = _seconds(interval, "JoinBolt.with_watermark_interval()")
        return self

    def with_late_tuple_stream(self, name: str) -> JoinBolt:
        """Send records that arrive after the watermark passed them to the stream ``name``
        (Storm's ``withLateTupleStream``; ``topology.stream(name)``) instead of the dead letters."""
        self._late_stream = _stream_name(name)
        return self

    def with_output_stream(self, name: str) -> JoinBolt:
        """Emit on the stream ``name`` instead of ``default``."""
        self._output_stream = _stream_name(name)
        return self

    # --- reading the definition ----------------------------------------------------------

    @property
    def streams(self) -> tuple[str, ...]:
        """Joined streams in declaration order (the first is the probe)."""
        return tuple(c.stream for c in self._clauses)

    @property
    def clauses(self) -> tuple[JoinClause, ...]:
        """Every stream with its join field, prior stream and join type, in declaration order."""
        return tuple(self._clauses)

    @property
    def join_fields(self) -> dict[str, str]:
        """Stream -> join field: each stream must be fields-grouped (shuffled) on this field."""
        return {c.stream: c.field for c in self._clauses}

    @property
    def window(self) -> WindowDef | None:
        """The window, or ``None`` if none was set.

        Raises:
            TopologyDefinitionError: the time settings do not fit the window (e.g. event time
                with a count window).
        """
        if self._length is None:
            return None
        assert self._slide is not None
        shape = Tumbling(self._length) if self._slide == self._length else Sliding(self._length, self._slide)
        event = self._timestamp_field is not None
        if not event and (self._lag or self._late_stream):
            raise TopologyDefinitionError(
                f"JoinBolt on {list(self.streams)}: with_lag and with_late_tuple_stream need with_timestamp_field (event time)"
            )
        return WindowDef.build(
            shape,
            time="event" if event else "processing",
            timestamp_field=self._timestamp_field,
            timestamp_unit=self._timestamp_unit,
            lag=self._lag,
            idle_timeout=None,  # Storm's watermarks wait for data
            late_stream=self._late_stream,
            what=f"JoinBolt on {list(self.streams)}",
        )

    @property
    def null_keys(self) -> str:
        """``keep`` (SQL) or ``drop`` (Storm): what a left join does with a null prior key."""
        return self._null_keys

    @property
    def tick_interval_s(self) -> float | None:
        """How often the join's task ticks so time windows close without new data."""
        window = self.window
        if window is None or window.counted:
            return None
        if self._watermark_interval is not None:
            return self._watermark_interval
        return window.tick_interval_s

    @property
    def output_stream(self) -> str:
        """The stream results are emitted on."""
        return self._output_stream

    @property
    def output_fields(self) -> tuple[str, ...]:
        """Output field names (selected names without the stream prefix).

        Raises:
            TopologyDefinitionError: ``select`` was not called.
        """
        return tuple(s.name for s in self._require_selectors("output_fields"))

    @property
    def selectors(self) -> tuple[FieldSelector, ...]:
        """The parsed ``select`` fields."""
        return self._require_selectors("selectors")

    def window_buffer(self, now: float, *, channels: Sequence[str] = ()) -> WindowBuffer:
        """A new, empty window buffer for this bolt's window (its watermark waiting for the
        upstream ``channels``, see :class:`~stream_ops.topology.windows.Watermark`).

        Raises:
            TopologyDefinitionError: no window was configured.
        """
        window = self.window
        if window is None:
            raise TopologyDefinitionError(
                f"JoinBolt on {list(self.streams)} has no window; call with_window(...) or with_tumbling_window(...)"
            )
        return WindowBuffer(window, now, channels=channels)

    def _require_selectors(self, what: str) -> tuple[FieldSelector, ...]:
        if self._selectors is None:
            raise TopologyDefinitionError(
                f"JoinBolt on {list(self.streams)}: call select('field, stream:field, ...') before {what}"
            )
        return self._selectors

    # --- serialising ---------------------------------------------------------------------

    def to_spec(self) -> dict[str, Any]:
        """JSON description for the plan; :meth:`from_spec` rebuilds an equal bolt.

        Raises:
            TopologyDefinitionError: ``select`` was not called.
        """
        selectors = self._require_selectors("to_spec()")
        return {
            "kind": "JoinBolt",
            "streams": [c.to_spec() for c in self._clauses],
            "select": [str(s) for s in selectors],
            "window": None if self._length is None else self._window_spec(),
            "null_keys": self._null_keys,
            "output_stream": self._output_stream,
        }

    def _window_spec(self) -> dict[str, Any]:
        assert self._length is not None and self._slide is not None
        counted = isinstance(self._length, Records)
        size = (lambda n: n.count) if counted else (lambda n: n.value)
        return {
            "counted": counted,
            "length": size(self._length),
            "slide": size(self._slide),
            "timestamp_field": self._timestamp_field,
            "timestamp_unit": self._timestamp_unit,
            "lag": self._lag,
            "watermark_interval": self._watermark_interval,
            "late_stream": self._late_stream,
        }

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> JoinBolt:
        """Rebuild a bolt from :meth:`to_spec`; every builder check runs again.

        Raises:
            TopologyDefinitionError: the description is not a valid JoinBolt.
        """
        if spec.get("kind") != "JoinBolt":
            raise TopologyDefinitionError(f"not a JoinBolt description: kind is {spec.get('kind')!r}")
        try:
            first, *rest = spec["streams"]
            bolt = cls(first["stream"], first["field"], null_keys=spec.get("null_keys", "keep"))
            for clause in rest:
                how = clause["how"]
                if how not in JOIN_TYPES:
                    raise TopologyDefinitionError(
                        f"stream {clause['stream']!r}: unknown join type {how!r}; use one of {JOIN_TYPES}"
                    )
                bolt._add(clause["stream"], clause["field"], clause["prior"], how)
            bolt.select(list(spec["select"]))
            window = spec.get("window")
            if window is not None:
                make = Records if window["counted"] else Duration
                bolt.with_window(make(window["length"]), make(window["slide"]))
                if window.get("timestamp_field") is not None:
                    bolt.with_timestamp_field(window["timestamp_field"], unit=window.get("timestamp_unit", "s"))
                bolt._lag = float(window.get("lag") or 0.0)
                bolt._watermark_interval = window.get("watermark_interval")
                bolt._late_stream = window.get("late_stream")
            bolt.with_output_stream(spec.get("output_stream", DEFAULT_OUTPUT_STREAM))
        except (KeyError, TypeError, ValueError) as e:
            raise TopologyDefinitionError(f"malformed JoinBolt description ({type(e).__name__}: {e})") from e
        return bolt

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, JoinBolt):
            return NotImplemented
        return (self._clauses, self._selectors, self._output_stream, self._null_keys) == (
            other._clauses,
            other._selectors,
            other._output_stream,
            other._null_keys,
        ) and (None if self._length is None else self._window_spec()) == (None if other._length is None else other._window_spec())

    __hash__ = None  # type: ignore[assignment]  # mutable builder

    def __repr__(self) -> str:
        select = None if self._selectors is None else ", ".join(str(s) for s in self._selectors)
        return f"JoinBolt(streams={list(self.streams)}, select={select!r}, window={None if self._length is None else self._window_spec()}, output_stream={self._output_stream!r})"

    # --- running -------------------------------------------------------------------------

    def execute(self, window: Iterable[WindowItem]) -> list[list[Any]]:
        """Join one window; returns one list of values per output row, in ``output_fields`` order.

        Args:
            window: the window's ``(stream name, record mapping)`` pairs, in arrival order.

        Raises:
            TopologyDefinitionError: ``select`` was not called, or a record comes from a stream
                that is not part of the join (the topology routes a wrong stream here).
        """
        selectors = self._require_selectors("execute()")
        index = {c.stream: i for i, c in enumerate(self._clauses)}
        per_stream: list[list[Mapping[str, Any]]] = [[] for _ in self._clauses]
        for stream, record in window:
            position = index.get(stream)
            if position is None:
                raise TopologyDefinitionError(
                    f"a record of stream {stream!r} reached the JoinBolt of {list(self.streams)}; "
                    "route only the joined streams to it"
                )
            per_stream[position].append(record)

        width = len(self._clauses)
        rows: list[list[Mapping[str, Any] | None]] = []
        for record in per_stream[0]:
            row: list[Mapping[str, Any] | None] = [None] * width
            row[0] = record
            rows.append(row)

        for position in range(1, width):
            rows = self._join_step(rows, position, per_stream[position], index)
        return [[self._project(row, selector, index) for selector in selectors] for row in rows]

    def _join_step(
        self,
        rows: list[list[Mapping[str, Any] | None]],
        position: int,
        records: list[Mapping[str, Any]],
        index: Mapping[str, int],
    ) -> list[list[Mapping[str, Any] | None]]:
        clause = self._clauses[position]
        assert clause.prior is not None  # only the first clause has no prior
        prior_position = index[clause.prior]
        prior = self._clauses[prior_position]
        keep_rows = clause.how in ("left", "outer")
        keep_records = clause.how in ("right", "outer")

        table: dict[Any, list[int]] = {}
        for i, record in enumerate(records):
            key = lookup(record, clause.path)
            if key is not None:
                table.setdefault(_hashable(key), []).append(i)

        matched = [False] * len(records)
        joined: list[list[Mapping[str, Any] | None]] = []
        for row in rows:
            key = lookup(row[prior_position], prior.path)
            if key is None and self._null_keys == "drop":
                continue  # Storm: a row without a prior key leaves every join
            hits = table.get(_hashable(key), ()) if key is not None else ()
            for i in hits:
                matched[i] = True
                out = list(row)
                out[position] = records[i]
                joined.append(out)
            if not hits and keep_rows:
                joined.append(list(row))
        if keep_records:
            for i, record in enumerate(records):
                if not matched[i]:
                    alone: list[Mapping[str, Any] | None] = [None] * len(self._clauses)
                    alone[position] = record
                    joined.append(alone)
        return joined

    @staticmethod
    def _project(row: Sequence[Mapping[str, Any] | None], selector: FieldSelector, index: Mapping[str, int]) -> Any:
        if selector.stream is not None:
            return lookup(row[index[selector.stream]], selector.path)
        for record in row:
            value = lookup(record, selector.path)
            if value is not None:
                return value
        return None


def _seconds(value: Any, what: str) -> float:
    length = as_length(value, what)
    if isinstance(length, Records):
        raise TopologyDefinitionError(f"{what} takes a duration (seconds or Duration), not a record count")
    return length.value


def _stream_name(name: Any) -> str:
    if not isinstance(name, str) or not name or name != name.strip() or ":" in name or "," in name:
        raise TopologyDefinitionError(
            f"stream name {name!r} is invalid: use a non-empty name without ':', ',' or surrounding spaces"
        )
    return name


def _join_field(stream: str, field: Any) -> str:
    if not isinstance(field, str):
        raise TopologyDefinitionError(f"join field of stream {stream!r} must be a string, got {field!r}")
    if ":" in field:
        raise TopologyDefinitionError(
            f"join field {field!r} of stream {stream!r} has a stream prefix; the stream is implicit here, "
            "give only the field ('x' or 'outer.inner')"
        )
    selector = FieldSelector.parse(field, what=f"join field of stream {stream!r}")
    return selector.name
