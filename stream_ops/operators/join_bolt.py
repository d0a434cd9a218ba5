"""Storm's ``JoinBolt``: a windowed hash join of several streams, as a pure Python core.

A :class:`JoinBolt` is built like Storm's (``org.apache.storm.bolt.JoinBolt``): the first stream
and its join field, then one ``join`` / ``left_join`` per further stream, naming the stream it
joins against (the *prior* stream, which must already be part of the join), then ``select``
to choose the output fields, and a tumbling window. :meth:`JoinBolt.execute` joins the records
of one complete window. :class:`TumblingWindow` cuts a record stream into such windows and can
be checkpointed with the task. Nothing here reads a clock: the caller passes ``now``.

Join rules (Storm's, plus right and full outer joins):

* The first stream is the probe. Every further stream, in declaration order, is hashed on its
  own join field and joined against the *prior* stream's join field:
  ``JoinBolt("s1", "k1").join("s2", "k2", "s1")`` is SQL
  ``from s1 inner join s2 on s2.k2 = s1.k1``; a later ``.join("s3", "k3", "s2")`` is
  ``inner join s3 on s3.k3 = s2.k2``.
* ``join``: inner join, rows without a match are dropped.
* ``left_join``: every row built so far is kept; a row without a match gets nulls for the
  new stream. **Difference from Storm**: Storm drops a row whose prior join key is missing
  (null) even in a left join; here it is kept with nulls, as in SQL.
* ``right_join`` (not in Storm): matched rows, plus every record of the new stream that
  matched no row, with nulls for all earlier streams.
* ``outer_join`` (not in Storm): left and right together (SQL ``full outer join``).
* A missing or null join key never equals anything (SQL null semantics), on either side.
* Join keys compare with Python equality (``1 == 1.0``, but ``"1" != 1``); list and mapping
  keys are compared by content.

Output order is deterministic: rows follow the probe (first stream) records in window order,
and for each row the matching records of each joined stream in window order; records of a
right/outer-joined stream that matched nothing follow, in window order, after all matched and
left-kept rows of that step.

Projection (``select``): ``"a, s2:b, outer.inner"``. A name with a ``stream:`` prefix is read
only from that stream's record; a name without one from the first record, in stream
declaration order, whose value is present and not null (Storm's rule). Dotted names walk
nested mappings. A field that is missing anywhere gives ``None``. Output field names are the
selected names without the stream prefix (Storm keeps ``stream:name``), so two selectors that
differ only by prefix are rejected unless one is renamed with ``as`` (not in Storm):
``"a:v, b:v as b_v"``.

Example:
    >>> bolt = (
    ...     JoinBolt("spout1", "uuid")
    ...     .join("spout2", "uuid", "spout1")
    ...     .select("uuid, word, spout2:timestamp")
    ...     .with_tumbling_window(count=10)
    ... )
    >>> bolt.output_fields
    ('uuid', 'word', 'timestamp')
    >>> bolt.execute([
    ...     ("spout1", {"uuid": "u1", "word": "hello", "timestamp": 1}),
    ...     ("spout2", {"uuid": "u1", "timestamp": 7}),
    ... ])
    [['u1', 'hello', 7]]
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from stream_ops.errors import StateError, TopologyDefinitionError
from stream_ops.topology.field_paths import lookup

JoinType = Literal["inner", "left", "right", "outer"]
JOIN_TYPES: tuple[str, ...] = ("inner", "left", "right", "outer")
DEFAULT_OUTPUT_STREAM = "default"
"""Storm emits on the ``default`` stream unless ``withOutputStream`` names another."""

WindowItem = tuple[str, Mapping[str, Any]]
"""One record of a window: ``(stream name, record)``."""


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
        """Output field name: the alias, else the dotted path without the stream prefix."""
        return self.alias if self.alias is not None else ".".join(self.path)

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
    """A hashable stand-in for a join key (lists and mappings compare by content)."""
    if isinstance(value, Mapping):
        return ("__mapping__", tuple(sorted(((str(k), _hashable(v)) for k, v in value.items()))))
    if isinstance(value, (list, tuple)):
        return ("__sequence__", tuple(_hashable(v) for v in value))
    if isinstance(value, (set, frozenset)):
        return ("__set__", frozenset(_hashable(v) for v in value))
    return value


# --- windows ---------------------------------------------------------------------------


@dataclass(frozen=True)
class WindowSpec:
    """A tumbling window's size: exactly one of ``count`` (records) or ``seconds``.

    Raises:
        TopologyDefinitionError: neither or both given, or a size that is not positive.
    """

    count: int | None = None
    seconds: float | None = None

    def __post_init__(self) -> None:
        if (self.count is None) == (self.seconds is None):
            raise TopologyDefinitionError("a tumbling window needs exactly one of count= (records) or seconds= (processing time)")
        if self.count is not None and (isinstance(self.count, bool) or not isinstance(self.count, int) or self.count <= 0):
            raise TopologyDefinitionError(f"window count must be a positive integer, got {self.count!r}")
        if self.seconds is not None and (
            isinstance(self.seconds, bool)
            or not isinstance(self.seconds, (int, float))
            or not math.isfinite(self.seconds)
            or self.seconds <= 0
        ):
            raise TopologyDefinitionError(f"window seconds must be a positive number, got {self.seconds!r}")

    def to_spec(self) -> dict[str, Any]:
        """``{"count": n}`` or ``{"seconds": s}``."""
        return {"count": self.count} if self.count is not None else {"seconds": self.seconds}

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> WindowSpec:
        """Inverse of :meth:`to_spec`."""
        return cls(count=spec.get("count"), seconds=spec.get("seconds"))


class TumblingWindow:
    """Cuts ``(stream, record)`` pairs into tumbling windows; pure and checkpointable.

    * Count windows close as soon as they hold ``count`` records (all streams together).
    * Time windows are aligned to multiples of ``seconds`` of the processing time ``now``
      (``[k*s, (k+1)*s)``); a window closes when ``now`` reaches its end, checked on
      :meth:`add` and :meth:`flush`. A window with no records is never returned. Processing
      time is expected not to go back; a ``now`` before the open window's start is counted in
      the open window.

    Example:
        >>> window = TumblingWindow(seconds=10)
        >>> window.add("orders", {"id": 1}, now=3.0)
        []
        >>> window.flush(now=10.0)
        [[('orders', {'id': 1})]]
    """

    def __init__(self, count: int | None = None, seconds: float | None = None) -> None:
        self._spec = WindowSpec(count=count, seconds=seconds)
        self._records: list[WindowItem] = []
        self._start: float | None = None

    @property
    def spec(self) -> WindowSpec:
        """The window's size."""
        return self._spec

    @property
    def pending(self) -> int:
        """Records buffered in the open window."""
        return len(self._records)

    def add(self, stream: str, record: Mapping[str, Any], now: float) -> list[list[WindowItem]]:
        """Buffer one record seen at ``now``; returns the windows this completes (oldest first)."""
        closed = self.flush(now)
        if self._spec.seconds is not None and not self._records:
            self._start = math.floor(now / self._spec.seconds) * self._spec.seconds
        self._records.append((stream, record))
        if self._spec.count is not None and len(self._records) >= self._spec.count:
            closed.append(self._take())
        return closed

    def flush(self, now: float, *, force: bool = False) -> list[list[WindowItem]]:
        """Windows complete at ``now`` (a time window whose end has passed).

        Args:
            now: current processing time in seconds.
            force: also return the open, incomplete window (count or time), e.g. on shutdown.
        """
        if not self._records:
            return []
        if force:
            return [self._take()]
        if self._spec.seconds is not None and self._start is not None and now >= self._start + self._spec.seconds:
            return [self._take()]
        return []

    def _take(self) -> list[WindowItem]:
        records, self._records, self._start = self._records, [], None
        return records

    def state(self) -> dict[str, Any]:
        """JSON-able snapshot of the buffer, to store with the task's state.

        Raises:
            StateError: a buffered record is not JSON-able.
        """
        snapshot = {
            **self._spec.to_spec(),
            "start": self._start,
            "records": [[stream, dict(record)] for stream, record in self._records],
        }
        try:
            return json.loads(json.dumps(snapshot, allow_nan=False))
        except (TypeError, ValueError) as e:
            raise StateError(f"tumbling window buffer is not JSON-able, so it cannot be checkpointed: {e}") from e

    def restore(self, state: Mapping[str, Any]) -> None:
        """Replace the buffer with one returned by :meth:`state`.

        Raises:
            StateError: the snapshot was taken with another window size, or is malformed.
        """
        try:
            taken = WindowSpec.from_spec(state)
            records: list[WindowItem] = [(str(stream), dict(record)) for stream, record in state["records"]]
            start = state.get("start")
        except (KeyError, TypeError, ValueError, TopologyDefinitionError) as e:
            raise StateError(f"not a tumbling window snapshot: {e}") from e
        if taken != self._spec:
            raise StateError(
                f"window snapshot was taken with {taken.to_spec()}, this window is {self._spec.to_spec()}; "
                "restore it into a window of the same size (or drop the snapshot)"
            )
        self._records = records
        self._start = None if start is None else float(start)

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> TumblingWindow:
        """A window of the snapshot's size holding the snapshot's records."""
        spec = WindowSpec.from_spec(state)
        window = cls(count=spec.count, seconds=spec.seconds)
        window.restore(state)
        return window


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

    Example:
        >>> bolt = (
        ...     JoinBolt("users", "id")
        ...     .left_join("orders", "user_id", "users")
        ...     .select("id, name, orders:amount")
        ...     .with_tumbling_window(seconds=60)
        ...     .with_output_stream("user_orders")
        ... )
    """

    def __init__(self, source: str, field: str) -> None:
        self._clauses: list[JoinClause] = [JoinClause(_stream_name(source), _join_field(source, field))]
        self._selectors: tuple[FieldSelector, ...] | None = None
        self._window: WindowSpec | None = None
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
                    f"{selector.name!r}; output names drop the stream prefix, so rename one with "
                    f"'{selector} as other_name'"
                )
            seen[selector.name] = selector
        self._selectors = selectors
        return self

    def with_tumbling_window(self, *, count: int | None = None, seconds: float | None = None) -> JoinBolt:
        """Join each tumbling window of ``count`` records or ``seconds`` of processing time."""
        self._window = WindowSpec(count=count, seconds=seconds)
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
    def window(self) -> WindowSpec | None:
        """The tumbling window size, or ``None`` if none was set."""
        return self._window

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

    def tumbling_window(self) -> TumblingWindow:
        """A new, empty window buffer of this bolt's size.

        Raises:
            TopologyDefinitionError: no window was configured.
        """
        if self._window is None:
            raise TopologyDefinitionError(
                f"JoinBolt on {list(self.streams)} has no window; call with_tumbling_window(count=...) or (seconds=...)"
            )
        return TumblingWindow(count=self._window.count, seconds=self._window.seconds)

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
            "window": None if self._window is None else self._window.to_spec(),
            "output_stream": self._output_stream,
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
            bolt = cls(first["stream"], first["field"])
            for clause in rest:
                how = clause["how"]
                if how not in JOIN_TYPES:
                    raise TopologyDefinitionError(
                        f"stream {clause['stream']!r}: unknown join type {how!r}; use one of {JOIN_TYPES}"
                    )
                bolt._add(clause["stream"], clause["field"], clause["prior"], how)
            bolt.select(list(spec["select"]))
            if spec.get("window") is not None:
                bolt.with_tumbling_window(**spec["window"])
            bolt.with_output_stream(spec.get("output_stream", DEFAULT_OUTPUT_STREAM))
        except (KeyError, TypeError, ValueError) as e:
            raise TopologyDefinitionError(f"malformed JoinBolt description ({type(e).__name__}: {e})") from e
        return bolt

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, JoinBolt):
            return NotImplemented
        return (self._clauses, self._selectors, self._window, self._output_stream) == (
            other._clauses,
            other._selectors,
            other._window,
            other._output_stream,
        )

    __hash__ = None  # type: ignore[assignment]  # mutable builder

    def __repr__(self) -> str:
        select = None if self._selectors is None else ", ".join(str(s) for s in self._selectors)
        return f"JoinBolt(streams={list(self.streams)}, select={select!r}, window={self._window}, output_stream={self._output_stream!r})"

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
