"""The topology DSL: ``Topology``, ``Stream``, ``GroupedStream``, ``StateHandle``.

The DSL only builds a graph of nodes and checks it as it grows; :mod:`stream_ops.dsl.build_plan`
turns the graph into stages and tasks, and the runtime runs them. Every mistake a user can make
here raises :class:`~stream_ops.errors.TopologyDefinitionError` at the line that makes it.

Example:
    >>> from stream_ops import Topology, FileTopic, Count, OpaqueMapState
    >>> topology = Topology("wordcount")
    >>> counts = (
    ...     topology.source("sentences", FileTopic("/data/sentences", queues=2), schema={"sentence": "string"})
    ...     .each(split, out="word", fields=["sentence"])
    ...     .group_by("word")
    ...     .persistent_aggregate(Count(), out="count", state=OpaqueMapState)
    ... )
    >>> topology.query("words", counts)
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from stream_ops.dsl.definition_checks import check_name as _check_name
from stream_ops.dsl.definition_checks import check_queues as _check_queues
from stream_ops.dsl.definition_checks import state_type as _state_type
from stream_ops.errors import TopologyDefinitionError
from stream_ops.helpers.field_paths import SCALAR_TYPES, is_known_type, path_type
from stream_ops.kafka.sink_options import DEFAULT_ID_PREFIX, DEFAULT_PROGRESS_TOPIC, kafka_sink_spec
from stream_ops.operators.aggregators import CombinerAggregator, ReducerAggregator, as_combiner
from stream_ops.operators.join_bolt import JoinBolt
from stream_ops.operators.processing_element import ProcessingElement, Trigger, prototype_spec
from stream_ops.sources import SourceSpec, source_spec
from stream_ops.topics.file_topic import FileTopic
from stream_ops.topology.functions import function_ref, object_ref
from stream_ops.topology.queue_counts import LaterCount, QueueCount, largest
from stream_ops.topology.sink_kinds import sink_kind
from stream_ops.topology.sink_paths import clashes, sink_directory
from stream_ops.topology.windows import WindowDef

if TYPE_CHECKING:
    from stream_ops.dsl.windowed import WindowedStream, WindowNode

SPARK_TYPES = SCALAR_TYPES
STATE_KINDS = ("transactional", "opaque", "non-transactional")
HEAD_KINDS = ("select_expr", "where", "map_batches")
"""Operations that run on a source stage's whole batch (Spark SQL in the JVM, then Arrow
batch functions), before its per-record Python operations."""


def _field_types(out: str | Sequence[str] | Mapping[str, str], what: str) -> dict[str, str]:
    """Normalise ``out=`` ('a', ['a', 'b'] or {'a': 'long'}) to an ordered name -> type map."""
    if isinstance(out, str):
        pairs = [(out, "string")]
    elif isinstance(out, Mapping):
        pairs = list(out.items())
    elif isinstance(out, Sequence):
        pairs = [(name, "string") for name in out]
    else:
        raise TopologyDefinitionError(f"{what}: out= must be a field name, a list of names or a name -> type mapping")
    if not pairs:
        raise TopologyDefinitionError(f"{what}: out= names no field")
    types: dict[str, str] = {}
    for name, typ in pairs:
        if not isinstance(name, str) or not name.isidentifier():
            raise TopologyDefinitionError(f"{what}: output field {name!r} is not a valid identifier")
        if not is_known_type(typ):
            raise TopologyDefinitionError(
                f"{what}: field {name!r} has unknown type {typ!r}; use one of {SPARK_TYPES} or a nested Spark type "
                "such as struct<id:long,name:string>"
            )
        if name in types:
            raise TopologyDefinitionError(f"{what}: output field {name!r} named twice")
        types[name] = typ
    return types


def state_kind_of(state: Any) -> str:
    """``'transactional' | 'opaque' | 'non-transactional'`` for a map-state class or a kind name."""
    if isinstance(state, str):
        kind = state.lower().replace("_", "-")
        if kind in STATE_KINDS:
            return kind
    name = getattr(state, "__name__", None)
    by_class = {
        "TransactionalMapState": "transactional",
        "OpaqueMapState": "opaque",
        "MapState": "non-transactional",
    }
    if name in by_class:
        return by_class[name]
    raise TopologyDefinitionError(
        f"state={state!r} is not a state kind: pass OpaqueMapState, TransactionalMapState or MapState (or one of {STATE_KINDS})"
    )


# --- graph nodes ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceNode:
    """A source: its plan form, the FileTopic when it is one (producers write into it), and the
    definition object it was made from (a ``FileTopic``, ``KafkaTopic``, ...; never in the plan)."""

    name: str
    spec: SourceSpec
    topic: FileTopic | None = None
    definition: Any = field(default=None, compare=False, repr=False)

    @property
    def schema(self) -> dict[str, str]:
        return dict(self.spec.fields)


@dataclass(frozen=True)
class OperationNode:
    """One record step: each/map/filter of a function, or a state query.

    ``function`` is a ``module:qualname`` reference; for ``state_query`` it is the query
    function and ``query`` holds the state's name and query object reference.
    """

    kind: str
    function: str
    fields: tuple[str, ...] | None
    out: dict[str, str]
    query: dict[str, Any] | None = None
    input: int = -1
    """The operation of the same stage this one reads (-1: the stage's input)."""
    side: str | None = None
    """For ``kind == "side"``: the processor's side stream whose records this yields."""
    exprs: tuple[str, ...] = ()
    """For ``select_expr`` / ``where``: the Spark SQL expressions (run in the JVM)."""


@dataclass(frozen=True)
class AggregateNode:
    """``group_by(...).persistent_aggregate(...)``: a shuffle and a keyed map state."""

    name: str
    group_fields: tuple[str, ...]
    aggregator: CombinerAggregator
    out: str
    state_kind: str
    queues: QueueCount
    value_type: str


@dataclass(frozen=True)
class ProcessNode:
    """``process``: an S4 processing element per key (see :class:`stream_ops.topology.plan.ProcessSpec`)."""

    pe_class: str
    key_field: str | dict[str, str | None] | None
    trigger: dict[str, Any] | None
    ttl_seconds: float | None
    timer_interval: float | None = None
    max_instances: int | None = None
    singleton: bool = False
    prototype: dict[str, Any] | None = None
    outputs: tuple[str, ...] = ()


@dataclass
class Segment:
    """Everything that runs in one stage: its input, processor, record operations and output.

    A segment is cut where records must move between tasks (a shuffle), so each becomes one
    stage of the plan with one task per queue.
    """

    index: int
    name: str
    kind: str
    queues: QueueCount
    """Its number of tasks, or one learned when the plan is built (a Kafka topic's partitions)."""
    fields: dict[str, str]
    source: SourceNode | None = None
    aggregate: AggregateNode | None = None
    join: dict[str, Any] | None = None
    process: ProcessNode | None = None
    window: WindowNode | None = None
    """A windowed aggregate stage's window, keys and aggregator."""
    inputs: list[tuple[int, str | None]] = field(default_factory=list)
    operations: list[OperationNode] = field(default_factory=list)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    """Where records leave the stage; each has a ``tap``: the operation it takes records from."""

    def head(self) -> int:
        """The tap after the stage's leading Spark SQL and map_batches operations (-1 when it
        has none)."""
        head = -1
        for index, op in enumerate(self.operations):
            if op.kind in HEAD_KINDS and op.input == head:
                head = index
        return head

    def consumed(self, tap: int) -> bool:
        """Whether an operation or an output reads ``tap``."""
        return any(op.input == tap for op in self.operations) or any(o["tap"] == tap for o in self.outputs)

    def dangling(self) -> str | None:
        """A description of a tap whose records go nowhere, or None.

        Every operation must be read by another or by an output; a stage without operations
        must have an output unless it keeps its results itself (a keyed stage's state).
        """
        for index, op in enumerate(self.operations):
            if not self.consumed(index):
                return f"after {op.kind}({op.function})"
        if not self.operations and not self.outputs and self.kind != "keyed":
            return "of its input"
        return None


# --- public DSL ----------------------------------------------------------------------------


class Topology:
    """A named streaming topology: sources, the operations on them, states and queries."""

    def __init__(self, name: str) -> None:
        self.name = _check_name("topology", name)
        self._segments: list[Segment] = []
        self._queries: dict[str, StateHandle] = {}
        self._states: dict[str, StateHandle] = {}
        self._sinks: dict[str, str] = {}
        self._sink_directories: dict[str, Path] = {}
        self._named: dict[str, Stream] = {}
        self._side: dict[str, tuple[Segment, dict[str, str], str]] = {}
        """Side streams not read yet: name -> (stage, fields, who declared it)."""

    def _segment(self, **kwargs: Any) -> Segment:
        name = kwargs["name"]
        if any(s.name == name for s in self._segments):
            raise TopologyDefinitionError(f"topology {self.name!r}: a stage named {name!r} already exists")
        segment = Segment(index=len(self._segments), **kwargs)
        self._segments.append(segment)
        return segment

    def source(
        self,
        name: str,
        source: Any,
        *,
        schema: Mapping[str, str] | Sequence[str] | None = None,
    ) -> Stream:
        """Declare a source (see :mod:`stream_ops.sources`).

        Args:
            name: unique source name.
            source: a FileTopic of JSON lines (its queues become the stage's tasks),
                ``ParquetFiles(path)``, ``CsvFiles(path)``, ``JsonFiles(path)`` (a directory
                other systems land files in, one task) or ``RateSource(rows_per_second)``.
            schema: field -> Spark type ('string', 'long', 'double', 'boolean', nested DDL such
                as 'struct<id:long>') or a list of string field names. Required for a
                FileTopic; for landed files, read from the first file when left out.
        """
        _check_name("source", name)
        if any(s.source is not None and s.source.name == name for s in self._segments):
            raise TopologyDefinitionError(f"topology {self.name!r}: source {name!r} is declared twice")
        if name in self._named:
            raise TopologyDefinitionError(f"topology {self.name!r}: a stream named {name!r} exists already")
        try:
            spec = source_spec(source, schema)
        except TopologyDefinitionError as e:
            raise TopologyDefinitionError(f"source {name!r}: {e}") from None
        types = dict(spec.fields)
        node = SourceNode(name, spec, source if isinstance(source, FileTopic) else None, definition=source)
        queues = spec.queues if spec.queues is not None else LaterCount.of_source(name)
        segment = self._segment(name=name, kind="source", queues=queues, fields=dict(types), source=node)
        stream = Stream(self, segment, types)
        self._named[name] = stream
        return stream

    def join(self, bolt: Any, *, queues: int | None = None, name: str | None = None, **streams: Stream) -> Stream:
        """Join streams with a Storm :class:`~stream_ops.operators.JoinBolt` (windowed hash join).

        Each input stream is shuffled by its join field into the join stage (tagged with its
        stream name, as RocketMQ Streams' tag nodes), so equal keys meet in one task; the
        window buffer is task state and survives a move.

        Example:
            >>> joined = topology.join(bolt, spout1=words, spout2=stamps)
        """
        what = f"join() in topology {self.name!r}"
        if not isinstance(bolt, JoinBolt):
            raise TopologyDefinitionError(f"{what}: expected a JoinBolt, got {type(bolt).__name__}")
        spec = bolt.to_spec()  # raises if select() was not called
        try:
            window = bolt.window
        except TopologyDefinitionError as e:
            raise TopologyDefinitionError(f"{what}: {e}") from None
        if window is None:
            raise TopologyDefinitionError(f"{what}: call with_window(...) or with_tumbling_window(...) on the bolt")
        expected = set(bolt.streams)
        if set(streams) != expected:
            raise TopologyDefinitionError(
                f"{what}: the bolt joins streams {sorted(expected)}, but streams {sorted(streams)} were given"
            )
        stage_name = _check_name("join", name or f"join-{'-'.join(bolt.streams)}")
        n = queues if queues is not None else largest(s._segment.queues for s in streams.values())
        _check_queues(n, what)
        out_fields = _join_output_types(bolt, streams)
        output_stream = bolt.output_stream
        if output_stream in self._named:
            raise TopologyDefinitionError(
                f"{what}: its output stream {output_stream!r} is a name taken already; with_output_stream('another')"
            )
        segment = self._segment(name=stage_name, kind="join", queues=n, fields=out_fields, join=spec)
        for stream_name in bolt.streams:
            stream = streams[stream_name]
            join_field = bolt.join_fields[stream_name]
            stream._check_fields([join_field], f"{what} stream {stream_name!r}")
            if window.timestamp_field is not None:
                _check_timestamp(stream, window.timestamp_field, f"{what} stream {stream_name!r}")
            stream._connect(
                {"kind": "records", "to_stage": segment.index, "queues": n, "key_fields": (join_field,), "stream": stream_name},
                f"{what} stream {stream_name!r}",
                stream_tag=stream_name,
            )
        joined = Stream(self, segment, out_fields)
        if output_stream != "default":
            self._named[output_stream] = joined
        if window.late_stream is not None:
            self._declare_side(window.late_stream, segment, dict(LATE_JOIN_FIELDS), what)
        return joined

    def process(
        self,
        pe: Any,
        *,
        streams: Mapping[str, tuple[Stream, str | None]],
        out: str | Sequence[str] | Mapping[str, str],
        trigger: Any = None,
        ttl_seconds: float | None = None,
        timer_interval: float | None = None,
        max_instances: int | None = None,
        outputs: Mapping[str, str | Sequence[str] | Mapping[str, str]] | None = None,
        queues: int | None = None,
        name: str | None = None,
    ) -> Stream:
        """Run an S4 processing element over several input streams (S4's PEs subscribed to
        several streams).

        ``streams`` maps each input stream's name to ``(stream, key_field)``; records of all of
        them reach the instance of their key, and the PE tells them apart by the stream name:
        a method ``on_<name>(event)`` if it has one, else ``on_event(event, stream)``. A
        ``key_field`` of None makes the stream key-less: each of its records reaches every
        live instance (S4's broadcast, e.g. a control stream). The other arguments are those
        of :meth:`Stream.process`.

        Example:
            >>> topology.process(FraudPE(limit=3), streams={"payments": (payments, "card"),
            ...     "rules": (rules, None)}, out={"card": "string", "alert": "string"})
        """
        what = f"process() in topology {self.name!r}"
        if not isinstance(streams, Mapping) or not streams:
            raise TopologyDefinitionError(f"{what}: streams must map names to (stream, key_field)")
        inputs: dict[str, tuple[Stream, str | None]] = {}
        for stream_name, entry in streams.items():
            _check_name("stream", stream_name)
            if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], Stream)):
                raise TopologyDefinitionError(f"{what}: stream {stream_name!r} must be (stream, key_field), got {entry!r}")
            stream, key = entry
            if stream._topology is not self:
                raise TopologyDefinitionError(f"{what}: stream {stream_name!r} is not a stream of this topology")
            if key is not None:
                stream._check_fields([key], f"{what} stream {stream_name!r}")
            inputs[stream_name] = (stream, key)
        if all(key is None for _, key in inputs.values()):
            raise TopologyDefinitionError(f"{what}: at least one stream needs a key field (the others are broadcast)")
        n = queues if queues is not None else largest(s._segment.queues for s, _ in inputs.values())
        _check_queues(n, what)
        options = dict(trigger=trigger, ttl_seconds=ttl_seconds, timer_interval=timer_interval, max_instances=max_instances)
        return self._process_stage(pe, inputs, out=out, options=options, outputs=outputs, queues=n, name=name, what=what)

    def _process_stage(
        self,
        pe: Any,
        inputs: Mapping[str, tuple[Stream, str | None]],
        *,
        out: str | Sequence[str] | Mapping[str, str],
        options: dict[str, Any],
        outputs: Mapping[str, str | Sequence[str] | Mapping[str, str]] | None,
        queues: QueueCount,
        name: str | None,
        what: str,
        single: bool = False,
    ) -> Stream:
        """Add a processing-element stage reading ``inputs`` (name -> (stream, key field))."""
        pe_class = pe if isinstance(pe, type) else type(pe)
        if not issubclass(pe_class, ProcessingElement):
            raise TopologyDefinitionError(f"{what}: {pe!r} is not a ProcessingElement subclass (or an instance of one)")
        prototype = None
        if not isinstance(pe, type):
            try:
                prototype = prototype_spec(pe)
            except TopologyDefinitionError as e:
                raise TopologyDefinitionError(f"{what}: {e}") from None
        ref = function_ref(pe_class, what=what)
        for stream_name in inputs:
            if not pe_class.handles(None if single else stream_name):
                handler = "on_event" if single else f"on_event or on_{stream_name}"
                raise TopologyDefinitionError(f"{what}: {pe_class.__name__} has no {handler} for the events of {stream_name!r}")
        trigger = options["trigger"]
        if trigger is not None and not isinstance(trigger, Trigger):
            raise TopologyDefinitionError(
                f"{what}: trigger must be Trigger.count(n), Trigger.every(s), Trigger.time(s, on_event=True) or a '|' of them"
            )
        for option in ("ttl_seconds", "timer_interval"):
            value = options[option]
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
                raise TopologyDefinitionError(f"{what}: {option} must be a positive number of seconds, got {value!r}")
        max_instances = options["max_instances"]
        if max_instances is not None and (
            isinstance(max_instances, bool) or not isinstance(max_instances, int) or max_instances <= 0
        ):
            raise TopologyDefinitionError(f"{what}: max_instances must be a positive integer, got {max_instances!r}")
        out_fields = _field_types(out, what)
        side_fields = {n: _field_types(f, f"{what} output {n!r}") for n, f in (outputs or {}).items()}
        for side_name in side_fields:
            _check_name("stream", side_name)
        stage_name = _check_name("stage", name or pe_class.__name__.lower())
        key_field: str | dict[str, str | None] | None
        key_field = next(iter(inputs.values()))[1] if single else {n: k for n, (_, k) in inputs.items()}
        segment = self._segment(
            name=stage_name,
            kind="process",
            queues=queues,
            fields=out_fields,
            process=ProcessNode(
                ref,
                key_field,
                trigger.to_spec() if trigger else None,
                options["ttl_seconds"],
                timer_interval=options["timer_interval"],
                max_instances=max_instances,
                singleton=bool(options.get("singleton")),
                prototype=prototype,
                outputs=tuple(side_fields),
            ),
        )
        for stream_name, (stream, key) in inputs.items():
            stream._connect(
                {
                    "kind": "records",
                    "to_stage": segment.index,
                    "queues": queues,
                    "key_fields": () if key is None else (key,),
                    "stream": stream_name,
                    "broadcast_unkeyed": not options.get("singleton"),
                },
                what,
                stream_tag=stream_name,
            )
        for side_name, fields in side_fields.items():
            self._declare_side(side_name, segment, fields, what)
        return Stream(self, segment, out_fields)

    def _declare_side(self, name: str, segment: Segment, fields: dict[str, str], what: str) -> None:
        """Register the side stream ``name`` of ``segment``; :meth:`stream` reads it."""
        _check_name("stream", name)
        if name in self._named or name in self._side:
            raise TopologyDefinitionError(
                f"{what}: a stream named {name!r} exists already; choose another name for this side stream"
            )
        self._side[name] = (segment, fields, what)

    def unread_side_streams(self) -> dict[str, str]:
        """Declared side streams nobody reads: name -> who declared it."""
        return {name: what for name, (_, _, what) in self._side.items()}

    def stream(self, name: str) -> Stream:
        """The stream called ``name``: a source, a JoinBolt's ``with_output_stream`` name
        (Storm's stream ids), e.g. to join it again downstream, or a late stream
        (``late_stream=`` of a window, ``with_late_tuple_stream`` of a JoinBolt).

        Raises:
            TopologyDefinitionError: no stream has that name.
        """
        if name in self._side:
            segment, fields, _ = self._side.pop(name)
            segment.operations.append(OperationNode("side", "", None, dict(fields), input=-1, side=name))
            self._named[name] = Stream(self, [_Tap(segment, len(segment.operations) - 1)], fields)
        found = self._named.get(name)
        if found is None:
            known = sorted({*self._named, *self._side})
            raise TopologyDefinitionError(f"topology {self.name!r} has no stream named {name!r}; named: {known}")
        return found

    def merge(self, *streams: Stream) -> Stream:
        """One stream of the records of ``streams`` (Trident's ``merge``): they must carry the
        same fields with the same types.

        No stage is added: an operation on the merged stream runs in each merged stream's
        stage, and a consumer (a shuffle, a sink) reads from all of them.
        """
        what = f"merge() in topology {self.name!r}"
        if len(streams) < 2:
            raise TopologyDefinitionError(f"{what}: merge at least two streams")
        for stream in streams:
            if not isinstance(stream, Stream) or stream._topology is not self:
                raise TopologyDefinitionError(f"{what}: {stream!r} is not a stream of this topology")
        first = streams[0]
        for stream in streams[1:]:
            if stream._fields != first._fields:  # names and types; order does not matter
                raise TopologyDefinitionError(
                    f"{what}: streams must have the same fields to merge; stage {first._segment.name!r} has "
                    f"{first._fields}, stage {stream._segment.name!r} has {stream._fields}"
                )
        taps = [tap for stream in streams for tap in stream._taps]
        if len({(tap.segment.index, tap.op) for tap in taps}) != len(taps):
            raise TopologyDefinitionError(f"{what}: a stream is merged twice; its records would be counted twice")
        return Stream(self, taps, first._fields)

    def query(self, name: str, state: StateHandle) -> None:
        """Expose a state for key lookups (Trident's DRPC ``stateQuery``).

        ``stream-ops query TOPOLOGY NAME KEY...`` then returns the current value of each key.
        """
        _check_name("query", name)
        if name in self._queries:
            raise TopologyDefinitionError(f"topology {self.name!r}: query {name!r} is declared twice")
        if not isinstance(state, StateHandle) or state.topology is not self or state.kind != "map":
            raise TopologyDefinitionError(f"query {name!r}: pass a state returned by persistent_aggregate of this topology")
        self._queries[name] = state

    # read access for the planner
    @property
    def segments(self) -> list[Segment]:
        return list(self._segments)

    @property
    def chains(self) -> list[Segment]:
        """The source segments (each has ``.source.topic``)."""
        return [s for s in self._segments if s.source is not None]

    @property
    def queries(self) -> dict[str, StateHandle]:
        return dict(self._queries)

    @property
    def states(self) -> dict[str, StateHandle]:
        return dict(self._states)

    @property
    def sinks(self) -> tuple[str, ...]:
        """Names of the topology's sinks."""
        return tuple(self._sinks)

    def _add_sink(self, name: str, what: str, path: str | None = None) -> None:
        """Record sink ``name``; ``path``: the directory a file sink writes, which no other sink may share."""
        if name in self._sinks:
            raise TopologyDefinitionError(f"{what}: topology {self.name!r} already has a sink named {name!r}; pass name=")
        if path is not None:
            directory = sink_directory(path)
            for other, other_directory in self._sink_directories.items():
                if clashes(directory, other_directory):
                    raise TopologyDefinitionError(
                        f"{what}: sink {name!r} would write {directory}, and sink {other!r} of topology {self.name!r} "
                        f"writes {other_directory}: two sinks on one directory (or one inside the other) overwrite or "
                        "read each other's files; give each sink a directory of its own"
                    )
            self._sink_directories[name] = directory
        self._sinks[name] = what

    def _add_state(self, handle: StateHandle) -> StateHandle:
        if handle.name in self._states:
            raise TopologyDefinitionError(f"topology {self.name!r}: state {handle.name!r} is declared twice")
        self._states[handle.name] = handle
        return handle


def _join_output_types(bolt: Any, streams: Mapping[str, Stream]) -> dict[str, str]:
    """The type of each field a JoinBolt emits, from the joined streams' fields: a field read
    from a named stream has that stream's type, one read from "the first stream that has it"
    the type of the first joined stream declaring it; a nested path (``user.id``) is typed
    the type of its struct member where the schema declares one, else ``string``."""
    types: dict[str, str] = {}
    for selector in bolt.selectors:
        candidates = [selector.stream] if selector.stream is not None else list(bolt.streams)
        found = [streams[c]._fields.get(selector.path[0]) for c in candidates if c in streams]
        declared = [t for t in found if t is not None]
        if len(selector.path) > 1:
            dotted = ".".join(selector.path)
            declared = []
            for candidate in candidates:
                try:
                    declared.append(path_type(streams[candidate]._fields, dotted, ""))
                except TopologyDefinitionError:
                    continue
        types[selector.name] = declared[0] if declared else "string"
    return types


LATE_JOIN_FIELDS: dict[str, str] = {"stream": "string", "record": "string"}
"""The fields of a JoinBolt's late tuple stream: the input stream's name and the record as JSON
(the joined streams have different fields)."""


def _check_timestamp(stream: Stream, field_name: str, what: str) -> None:
    """Refuse an event-time field the stream lacks or that is not a number."""
    kind = path_type(stream._fields, field_name, what)
    if kind not in ("long", "int", "double", "float"):
        raise TopologyDefinitionError(
            f"{what}: event time field {field_name!r} is {kind!r}; it must hold a number of seconds (or milliseconds "
            "with timestamp_unit='ms') since the epoch: map it to a long or double first"
        )


@dataclass(frozen=True)
class _Tap:
    """A point of a stage's operation tree: its input (``op == -1``) or an operation's output."""

    segment: Segment
    op: int


class Stream:
    """A stream of records (field name -> value) with a known set of fields.

    A stream may have several consumers (fan-out): each operation or output reads the same
    records. A merged stream (:meth:`Topology.merge`) has one tap per merged stream; an
    operation on it runs on each, and a consumer reads all of them.
    """

    def __init__(self, topology: Topology, taps: Segment | Sequence[_Tap], fields: Mapping[str, str]) -> None:
        self._topology = topology
        self._taps: tuple[_Tap, ...] = (_Tap(taps, -1),) if isinstance(taps, Segment) else tuple(taps)
        self._fields = dict(fields)

    @property
    def _segment(self) -> Segment:
        """The stage of the first tap (names and default queue counts come from it)."""
        return self._taps[0].segment

    @property
    def fields(self) -> tuple[str, ...]:
        """The fields each record of this stream carries, in order."""
        return tuple(self._fields)

    def _what(self, op: str) -> str:
        return f"{op}() on stage {self._segment.name!r}"

    def _extend(self, node: OperationNode, fields: Mapping[str, str]) -> Stream:
        taps = []
        for tap in self._taps:
            tap.segment.operations.append(replace(node, input=tap.op))
            taps.append(_Tap(tap.segment, len(tap.segment.operations) - 1))
        return Stream(self._topology, taps, fields)

    def _connect(self, output: dict[str, Any], what: str, *, stream_tag: str | None = None) -> None:
        """Send this stream's records to ``output`` (a shuffle into a new stage, or a sink).

        A shuffle into stage ``output["to_stage"]`` records each tap's stage as an input of
        that stage (tagged ``stream_tag`` for joins).
        """
        for tap in self._taps:
            tap.segment.outputs.append({**output, "tap": tap.op})
            if "to_stage" in output:
                self._topology._segments[output["to_stage"]].inputs.append((tap.segment.index, stream_tag))

    def _check_fields(self, names: Iterable[str], what: str) -> tuple[str, ...]:
        """``names`` after checking each is a field or a path into a struct/map field (``user.id``)."""
        names = tuple(names)
        for name in names:
            path_type(self._fields, name, what)
        return names

    def _types_of(self, names: Iterable[str]) -> dict[str, str]:
        """The stream's field types plus those of the (possibly nested) ``names``."""
        return {**self._fields, **{name: path_type(self._fields, name, "") for name in names}}

    def each(
        self,
        fn: Callable[..., Iterable[Any]],
        *,
        out: str | Sequence[str] | Mapping[str, str],
        fields: Sequence[str] | None = None,
    ) -> Stream:
        """Call ``fn`` per record; every value it yields becomes a record with ``out`` appended.

        Like Trident's ``each`` with a function such as ``Split``: zero or more outputs per
        input, each output keeps the input fields and adds the ``out`` fields. ``fn`` receives
        the values of ``fields`` as positional arguments, or the whole record as a dict when
        ``fields`` is None. With several ``out`` fields it yields tuples (or dicts).
        """
        what = self._what("each")
        ref = function_ref(fn, what=what)
        selected = self._check_fields(fields, what) if fields is not None else None
        new = _field_types(out, what)
        clash = set(new) & set(self._fields)
        if clash:
            raise TopologyDefinitionError(f"{what}: output fields {sorted(clash)} already exist on the stream")
        return self._extend(OperationNode("each", ref, selected, new), {**self._fields, **new})

    def map(
        self,
        fn: Callable[..., Any],
        *,
        out: str | Sequence[str] | Mapping[str, str] | None = None,
        fields: Sequence[str] | None = None,
    ) -> Stream:
        """Replace each record by ``fn(record)`` (one output per input, Trident's ``map``).

        ``fn`` returns a dict with the ``out`` fields (the same fields as the input when
        ``out`` is None), or a single value when ``out`` names one field.
        """
        what = self._what("map")
        ref = function_ref(fn, what=what)
        selected = self._check_fields(fields, what) if fields is not None else None
        new = _field_types(out, what) if out is not None else dict(self._fields)
        return self._extend(OperationNode("map", ref, selected, new), new)

    def filter(self, fn: Callable[..., bool], *, fields: Sequence[str] | None = None) -> Stream:
        """Keep the records for which ``fn`` returns a true value."""
        what = self._what("filter")
        ref = function_ref(fn, what=what)
        selected = self._check_fields(fields, what) if fields is not None else None
        return self._extend(OperationNode("filter", ref, selected, {}), self._fields)

    def window(
        self,
        window: Any,
        *,
        time: str = "processing",
        timestamp_field: str | None = None,
        timestamp_unit: str = "s",
        lag: Any = 0.0,
        idle_timeout: float | None = None,
        late_stream: str | None = None,
    ) -> WindowedStream:
        """Cut the stream into windows, then ``.group_by(...).aggregate(...)`` (or
        ``.aggregate(...)``) emits one record per (window, key) when the window closes, with
        ``window_start`` and ``window_end`` (seconds).

        Args:
            window: ``Tumbling(length)``, ``Sliding(length, slide)`` or ``Session(gap)``;
                lengths in seconds, ``Duration`` or ``Records.of(n)`` (counted per key).
            time: ``"processing"`` (the task's clock) or ``"event"`` (``timestamp_field``).
            timestamp_field: the field holding event time, in seconds since the epoch
                (``timestamp_unit="ms"`` for milliseconds).
            lag: how far the watermark stays behind the largest event time seen (seconds).
            idle_timeout: seconds without records after which the watermark moves on with
                processing time, closing the last windows without new data (default None:
                it waits for data, as in Spark and Storm; see docs/guide.md, "Windows", for the trade-off).
            late_stream: name of the stream (``topology.stream(name)``) that gets records
                arriving after the watermark passed them; without one they go to the dead
                letters with the reason ``late``.

        Example:
            >>> counts = (events.window(Tumbling(60), time="event", timestamp_field="ts", lag=5)
            ...           .group_by("user").aggregate(Count(), out="clicks"))
        """
        from stream_ops.dsl.windowed import WindowedStream

        what = self._what("window")
        try:
            spec = WindowDef.build(
                window,
                time=time,
                timestamp_field=timestamp_field,
                timestamp_unit=timestamp_unit,
                lag=lag,
                idle_timeout=idle_timeout,
                late_stream=late_stream,
                what=what,
            )
        except TopologyDefinitionError as e:
            raise TopologyDefinitionError(str(e) if str(e).startswith(what) else f"{what}: {e}") from None
        if spec.timestamp_field is not None:
            _check_timestamp(self, spec.timestamp_field, what)
        return WindowedStream(self, spec)

    def select_expr(self, *exprs: str) -> Stream:
        """Replace each record by Spark SQL expressions over its fields (Spark's ``selectExpr``),
        run in the JVM before the stage's Python operations, e.g.
        ``select_expr("explode(split(sentence, ' ')) AS word")``.

        The output fields and types come from Spark's analysis at definition time, so a wrong
        column or a type error fails here; a record that makes an expression fail at run time
        goes to the dead letters. Only on a source stage, before its Python operations.
        """
        return self._sql("select_expr", exprs)

    def where(self, condition: str) -> Stream:
        """Keep the records for which the Spark SQL boolean ``condition`` holds (Spark's
        ``where``), run in the JVM like :meth:`select_expr`."""
        return self._sql("where", (condition,))

    def map_batches(self, fn: Callable[[Any], Any], *, schema: Mapping[str, str]) -> Stream:
        """Replace the records by ``fn(pyarrow.RecordBatch)`` (a RecordBatch or Table of any
        number of rows with the ``schema`` fields), run in Spark's Python workers on whole
        Arrow batches (``mapInArrow``), after the stage's Spark SQL operations and before its
        per-record ones. A batch on which ``fn`` raises is split until the failing rows are
        found; they go to the dead letters, the other rows count once. Only on a source stage.
        """
        from stream_ops.arrow_types import ARROW_TYPES

        what = self._what("map_batches")
        ref = function_ref(fn, what=what)
        fields = _field_types(schema, what)
        nested = [name for name, typ in fields.items() if typ not in ARROW_TYPES]
        if nested:
            raise TopologyDefinitionError(f"{what}: fields {nested} are not scalar; map_batches outputs {sorted(ARROW_TYPES)}")
        self._check_head(what, "map_batches functions run on the Arrow batches Spark reads")
        return self._extend(OperationNode("map_batches", ref, None, fields), fields)

    def _check_head(self, what: str, why: str, *, before_batches: bool = False) -> None:
        """Refuse a head operation (SQL, map_batches) anywhere but at the head of a source stage."""
        for tap in self._taps:
            segment = tap.segment
            if segment.kind != "source":
                raise TopologyDefinitionError(
                    f"{what}: {why}, on a source stage; stage {segment.name!r} reads a shuffle. Use each/map/filter here"
                )
            if before_batches and any(op.kind == "map_batches" for op in segment.operations):
                raise TopologyDefinitionError(f"{what}: Spark SQL operations run before map_batches; write them first")
            if tap.op != segment.head() or segment.consumed(tap.op):
                raise TopologyDefinitionError(
                    f"{what}: {why}, before the stage's Python operations and on every record of it, so it must come "
                    "first, in one chain, right after the source"
                )

    def _sql(self, kind: Literal["select_expr", "where"], exprs: tuple[str, ...]) -> Stream:
        from stream_ops.spark.sql_analysis import analyse

        what = self._what(kind)
        self._check_head(what, "Spark SQL operations run in the JVM where Spark reads the records", before_batches=True)
        fields = analyse(self._fields, kind, exprs, what) if kind == "select_expr" else dict(self._fields)
        if kind == "where":
            analyse(self._fields, kind, exprs, what)
        return self._extend(OperationNode(kind, "", None, fields, exprs=tuple(exprs)), fields)

    def group_by(self, *fields: str, queues: int | None = None) -> GroupedStream:
        """Partition the stream by ``fields``: equal keys meet in one task after a shuffle.

        Args:
            fields: the key fields.
            queues: number of shuffle queues (= tasks of the keyed stage); defaults to this
                stage's number of queues.
        """
        what = self._what("group_by")
        if not fields:
            raise TopologyDefinitionError(f"{what}: name at least one field to group by")
        keys = self._check_fields(fields, what)
        if len(set(keys)) != len(keys):
            raise TopologyDefinitionError(f"{what}: a field is named twice in {list(keys)}")
        n = _check_queues(self._segment.queues if queues is None else queues, what)
        return GroupedStream(self, keys, n)

    def partition_by(self, *fields: str, queues: int | None = None, name: str | None = None) -> Stream:
        """Shuffle records by ``fields`` into a new stage (Trident's ``partitionBy``)."""
        what = self._what("partition_by")
        if not fields:
            raise TopologyDefinitionError(f"{what}: name at least one field to partition by")
        keys = self._check_fields(fields, what)
        n = _check_queues(self._segment.queues if queues is None else queues, what)
        stage_name = _check_name("stage", name or f"{self._segment.name}-by-{'-'.join(keys)}")
        segment = self._topology._segment(name=stage_name, kind="partition", queues=n, fields=dict(self._fields))
        self._connect(
            {"kind": "records", "to_stage": segment.index, "queues": n, "key_fields": keys, "stream": self._segment.name},
            what,
            stream_tag=self._segment.name,
        )
        return Stream(self._topology, segment, self._fields)

    def process(
        self,
        pe: Any,
        *,
        key: str | None = None,
        out: str | Sequence[str] | Mapping[str, str],
        trigger: Any = None,
        ttl_seconds: float | None = None,
        timer_interval: float | None = None,
        max_instances: int | None = None,
        singleton: bool = False,
        outputs: Mapping[str, str | Sequence[str] | Mapping[str, str]] | None = None,
        queues: int | None = None,
        name: str | None = None,
    ) -> Stream:
        """Run an S4 :class:`~stream_ops.operators.ProcessingElement`, one instance per ``key``.

        Records are shuffled by ``key`` into a new stage; each key's instance is created on
        its first record, checkpointed with the task and recovered after a move; idle ones are
        removed after ``ttl_seconds``. The stream continues with what the instances emit,
        which must carry the ``out`` fields. A record whose key is null reaches every live
        instance of every task (S4's broadcast). For several input streams use
        :meth:`Topology.process`.

        Args:
            pe: the PE class, or a configured instance: a *prototype* every key's instance is
                copied from (S4's prototype PEs), e.g. ``WordCounterPE(threshold=5)``.
            key: the field selecting the instance (not with ``singleton``).
            trigger: ``Trigger.count(n)``, ``Trigger.every(s)`` (on ticks),
                ``Trigger.time(s, on_event=True)`` (S4's: on the first event after ``s``), or a
                ``|`` of them.
            timer_interval: seconds between ``on_time()`` calls of each instance (S4's
                ``setTimerInterval``).
            max_instances: S4's PE cache size: beyond it the least recently used instance is
                removed (``on_remove`` runs first).
            singleton: one instance for every record (S4's singleton PE, one task).
            outputs: named output streams and their fields; instances
                ``emit(record, stream=name)`` to them and :meth:`Topology.stream` reads them.
        """
        what = self._what("process")
        if singleton and key is not None:
            raise TopologyDefinitionError(f"{what}: a singleton PE has one instance for all records; drop key=")
        if not singleton and key is None:
            raise TopologyDefinitionError(f"{what}: name the key field (key='user'), or pass singleton=True")
        if key is not None:
            self._check_fields([key], what)
        n = 1 if singleton else _check_queues(self._segment.queues if queues is None else queues, what)
        if singleton and queues not in (None, 1):
            raise TopologyDefinitionError(f"{what}: a singleton PE runs in one task; drop queues=")
        return self._topology._process_stage(
            pe,
            {self._segment.name: (self, key)},
            out=out,
            options=dict(
                trigger=trigger,
                ttl_seconds=ttl_seconds,
                timer_interval=timer_interval,
                max_instances=max_instances,
                singleton=singleton,
            ),
            outputs=outputs,
            queues=n,
            name=name,
            what=what,
            single=True,
        )

    def partition_persist(
        self,
        state_factory: Any,
        fields: Sequence[str],
        updater: Any,
        *,
        name: str | None = None,
        out: str | Sequence[str] | Mapping[str, str] | None = None,
    ) -> StateHandle:
        """Update a user State once per batch and partition (Trident's ``partitionPersist``).

        Args:
            state_factory: a :class:`~stream_ops.operators.StateFactory` class or dataclass
                instance; workers call ``make_state(partition, num_partitions)``.
            fields: the fields passed to the updater.
            updater: a :class:`~stream_ops.operators.StateUpdater` class or dataclass instance.
            name: the state's name (defaults to the factory's class name).
            out: the fields of what the updater emits with ``collector.emit(...)`` (Trident's
                function fields); needed to use the emitted records through ``new_values()``.
        """
        what = self._what("partition_persist")
        if len({tap.segment.index for tap in self._taps}) > 1:
            raise TopologyDefinitionError(
                f"{what}: the stream merges records of several stages, so one partition's State would be written by "
                "tasks of several stages; partition_by(...) the merged stream first"
            )
        if any(o["kind"] == "persist" for o in self._segment.outputs):
            raise TopologyDefinitionError(
                f"{what}: stage {self._segment.name!r} already persists into a State; a stage persists into one, so "
                "partition_by(...) the stream into a new stage for the second"
            )
        selected = self._check_fields(fields, what)
        factory_ref = object_ref(state_factory, what=f"{what} state factory")
        updater_ref = object_ref(updater, what=f"{what} updater")
        state_name = _check_name("state", name or _class_name(state_factory).lower())
        emit_fields = _field_types(out, what) if out is not None else None
        handle = StateHandle(
            self._topology, state_name, selected, "", kind="persist", stage=self._segment.index, emit_fields=emit_fields
        )
        self._topology._add_state(handle)
        persist = {"kind": "persist", "name": state_name, "factory": factory_ref, "fields": selected, "updater": updater_ref}
        self._connect({**persist, "emit_fields": emit_fields}, what)
        return handle

    def state_query(
        self,
        state: StateHandle,
        fields: Sequence[str],
        query_function: Any,
        out: str | Sequence[str] | Mapping[str, str],
    ) -> Stream:
        """Look records up in a state (Trident's ``stateQuery``); adds the ``out`` fields.

        For a ``persistent_aggregate`` state, ``fields`` are the key fields and each record is
        routed to the task that owns its key. For a ``partition_persist`` state the persisting
        stage must be partitioned by the same fields (``partition_by``/``group_by``), so each
        record reads the one partition that can hold its key.
        """
        what = self._what("state_query")
        if not isinstance(state, StateHandle) or state.topology is not self._topology:
            raise TopologyDefinitionError(f"{what}: pass a state of this topology")
        selected = self._check_fields(fields, what)
        if len(selected) != len(state.keys) and state.kind == "map":
            raise TopologyDefinitionError(f"{what}: state {state.name!r} is keyed by {list(state.keys)}; give as many fields")
        if state.kind == "persist":
            persisting = self._topology._segments[state.stage]
            partition_keys = _partition_keys(self._topology, persisting)
            if partition_keys is None or len(partition_keys) != len(selected):
                raise TopologyDefinitionError(
                    f"{what}: state {state.name!r} is persisted by stage {persisting.name!r}, which is not partitioned "
                    f"by key; partition_by(...) the persisted stream so a record's key has one partition"
                )
        query_ref = object_ref(query_function, what=f"{what} query function")
        new = _field_types(out, what)
        clash = set(new) & set(self._fields)
        if clash:
            raise TopologyDefinitionError(f"{what}: output fields {sorted(clash)} already exist on the stream")
        node = OperationNode("state_query", query_ref["class"], selected, new, query={"state": state.name, "function": query_ref})
        return self._extend(node, {**self._fields, **new})

    def persistent_aggregate(
        self, aggregator: CombinerAggregator | ReducerAggregator, *, out: str, state: Any, name: str | None = None
    ) -> StateHandle:
        """Aggregate the whole stream into one persistent value (Trident's ungrouped
        ``persistentAggregate``): one global key, kept by a stage of one task.

        Its state query takes no key fields (``topology.query(...)``, then
        ``stream-ops query TOPOLOGY NAME`` with no key).
        """
        return GroupedStream(self, (), 1).persistent_aggregate(aggregator, out=out, state=state, name=name)

    def aggregate(self, aggregator: CombinerAggregator | ReducerAggregator, *, out: str, name: str | None = None) -> Stream:
        """Combine each batch into one record ``{out: value}`` (Trident's ``aggregate``).

        Records are partially aggregated where they are, then combined by a stage of one task,
        which emits one record per batch it reads (nothing for an empty batch). Nothing is
        kept: use :meth:`persistent_aggregate` for a running total.
        """
        what = self._what("aggregate")
        aggregator = as_combiner(aggregator, what)
        self._check_fields(aggregator.input_fields(), what)
        if not isinstance(out, str) or not out.isidentifier():
            raise TopologyDefinitionError(f"{what}: out={out!r} must be a field name")
        value_type = aggregator.value_type(self._types_of(aggregator.input_fields()))
        out_fields = {out: _state_type(aggregator, value_type)}
        stage_name = _check_name("stage", name or f"{self._segment.name}-{out}")
        segment = self._topology._segment(
            name=stage_name,
            kind="aggregate",
            queues=1,
            fields=out_fields,
            aggregate=AggregateNode(stage_name, (), aggregator, out, "", 1, value_type),
        )
        self._connect({"kind": "partials", "to_stage": segment.index, "queues": 1, "key_fields": ()}, what)
        return Stream(self._topology, segment, out_fields)

    # --- sinks: where records leave the topology, exactly once per txid -----------------------

    def peek(self, fn: Callable[[dict[str, Any]], Any]) -> Stream:
        """Call ``fn(record)`` on every record and pass the records on unchanged (Trident's
        ``peek``), for debugging; it runs where the stage's operations run (Spark's Python
        workers for a source stage), and again for a replayed batch."""
        what = self._what("peek")
        ref = function_ref(fn, what=what)
        return self._extend(OperationNode("peek", ref, None, {}), self._fields)

    def to_parquet(
        self, path: str | os.PathLike[str], *, partition_by: Sequence[str] | None = None, name: str | None = None
    ) -> None:
        """Write the stream to Parquet files under ``path``, exactly once per batch.

        Each task writes one file per batch (and partition directory), named by (task, txid,
        epoch) and renamed into place only after the batch commits, so ``spark.read.parquet(path)``
        or DuckDB read a consistent table while the topology runs; ``path/_committed/`` lists
        each task's committed files. ``partition_by`` fields become ``field=value`` directories.
        """
        what = self._what("to_parquet")
        keys = self._check_fields(partition_by or (), what)
        if len(keys) == len(self._fields):
            raise TopologyDefinitionError(f"{what}: partition_by names every field; the files would have no columns")
        self._add_sink(what, name, {"format": "parquet", "path": os.fspath(path), "partition_by": keys})

    def to_topic(self, topic: FileTopic, *, name: str | None = None) -> None:
        """Write the stream into ``topic`` (JSON lines) for another topology to read as a source.

        A batch's records are spread over the topic's queues by a hash of each record and
        published after the batch commits, as files named by the submission, the sink, and
        (task, txid, epoch), so a resubmission never reuses a published name. No other sink of
        this topology, or of a running one, may write the same directory (refused, naming both).
        """
        what = self._what("to_topic")
        if not isinstance(topic, FileTopic):
            raise TopologyDefinitionError(f"{what}: topic must be a FileTopic, got {type(topic).__name__}")
        self._add_sink(what, name, {"format": "topic", "path": os.fspath(topic.path), "queues": topic.queues})

    def sink(self, fn: Callable[..., Any], *, name: str | None = None) -> None:
        """Call ``fn(txid, records)`` (or ``fn(txid, records, partition)``) once per batch,
        after the batch commits, for systems that can be written idempotently by txid.

        The contract: after a crash ``fn`` is called again with the same txid and the same
        records, until it returns; it must make a second call for a txid a no-op (e.g. upsert
        rows keyed by (partition, txid), or record the last txid written in the same
        transaction). txids count per task, so a stage of several tasks must take the third
        ``partition`` argument (the task's queue) and key by it too. An exception from ``fn``
        stops the task; it retries when the task starts again.
        """
        what = self._what("sink")
        ref = function_ref(fn, what=what)
        arity = _positional_arity(fn, what)
        queues = largest(tap.segment.queues for tap in self._taps)
        # A count learned when the plan is built is checked then (build_plan.py:_check_sink_tasks).
        if arity == 2 and (len(self._taps) > 1 or (isinstance(queues, int) and queues > 1)):
            raise TopologyDefinitionError(
                f"{what}: {ref} takes (txid, records), but this stream is written by several tasks whose txids repeat; "
                "take a third parameter, partition, and write idempotently by (partition, txid)"
            )
        self._add_sink(what, name, {"format": "function", "function": ref, "arity": arity})

    def print(self, *, name: str | None = None) -> None:
        """Log every record to the worker log (logger ``stream_ops.print``, INFO) after its
        batch commits (Storm's printer bolt), for debugging."""
        self._add_sink(self._what("print"), name, {"format": "print"})

    def to_kafka(
        self,
        bootstrap: str,
        topic: str,
        *,
        key: str | None = None,
        value: str | None = None,
        partitions: int | None = None,
        replication_factor: int | None = None,
        config: Mapping[str, Any] | None = None,
        progress_topic: str = DEFAULT_PROGRESS_TOPIC,
        transactional_id_prefix: str = DEFAULT_ID_PREFIX,
        name: str | None = None,
    ) -> None:
        """Write the stream into the Kafka topic ``topic``, exactly once for ``read_committed`` consumers.

        Each committed batch of each task is one Kafka transaction (producer
        ``transactional.id`` ``<prefix>.<topology id>.<sink>.t<task>``), delivered after the
        ZooKeeper commit; a new owner of the task fences the old one's producer, and a progress
        record written in the same transaction skips batches Kafka has already (see
        :mod:`stream_ops.kafka.sink`).

        Args:
            bootstrap: ``host:port[,host:port...]`` of the brokers, as workers reach them.
            topic: the output topic. It must exist, unless ``partitions`` is given: then a task
                creates it with that many partitions when it is missing.
            key: the field whose value is the message key (None: no key).
            value: the field whose value is the message value (None: the record as a JSON object).
                A string is written as UTF-8, a null as a tombstone, other values as JSON.
            partitions: create the topic with this many partitions if missing.
            replication_factor: replicas of the topics the sink creates (None: the brokers' default).
            config: librdkafka settings for the sink's clients (SASL, TLS, ...); a value
                ``env:NAME`` is read from the worker's environment variable ``NAME``, so secrets
                stay out of the plan. Settings the sink owns (``transactional.id``, ...) are refused.
            progress_topic: the compacted topic of delivered txids (created if missing).
            transactional_id_prefix: the first part of the producers' transactional ids.
            name: the sink's name (default ``<stage>-kafka``).
        """
        what = self._what("to_kafka")
        spec = kafka_sink_spec(
            bootstrap,
            topic,
            fields=self._fields,
            what=what,
            key=key,
            value=value,
            partitions=partitions,
            replication_factor=replication_factor,
            config=config,
            progress_topic=progress_topic,
            transactional_id_prefix=transactional_id_prefix,
        )
        self._add_sink(what, name, {"format": "kafka", "kafka": spec.model_dump()})

    def to_sink(
        self,
        kind: str,
        *,
        path: str | os.PathLike[str] | None = None,
        options: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> None:
        """Write the stream into a sink of a registered kind (:func:`stream_ops.topology.sink_kinds.register_sink_kind`).

        The built-in kinds have their own methods (``to_parquet``, ``to_topic``, ``sink``,
        ``print``, ``to_kafka``); this one is for kinds registered by a package or a test. The
        kind checks the spec when the plan is built.

        Args:
            kind: the kind's name (the spec's ``format``).
            path: the directory a kind that writes files under one of its own uses (no other
                sink may share it).
            options: the kind's settings (JSON values only; they go into the plan).
            name: the sink's name (default ``<stage>-<kind>``).

        Raises:
            TopologyDefinitionError: no kind of that name is registered, or it needs a path.
        """
        what = self._what("to_sink")
        if sink_kind(kind).writes_directory and path is None:
            raise TopologyDefinitionError(f"{what}: a {kind} sink writes a directory of its own; give path=")
        spec: dict[str, Any] = {"format": kind, "options": dict(options or {})}
        if path is not None:
            spec["path"] = os.fspath(path)
        self._add_sink(what, name, spec)

    def _add_sink(self, what: str, name: str | None, spec: dict[str, Any]) -> None:
        sink_name = _check_name("sink", name or f"{self._segment.name}-{spec['format']}")
        writes_directory = sink_kind(spec["format"]).writes_directory
        self._topology._add_sink(sink_name, what, spec["path"] if writes_directory else None)
        self._connect({"kind": "sink", "name": sink_name, "fields": dict(self._fields), **spec}, what)


def _positional_arity(fn: Callable[..., Any], what: str) -> int:
    """2 or 3: how many positional arguments a sink function takes."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        raise TopologyDefinitionError(f"{what}: cannot read the parameters of {fn!r}") from None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 3
    required = [p for p in positional if p.default is p.empty]
    if len(required) <= 3 and len(positional) >= 3:
        return 3
    if len(required) <= 2 and len(positional) >= 2:
        return 2
    raise TopologyDefinitionError(
        f"{what}: a sink function takes (txid, records) or (txid, records, partition); {fn!r} takes {len(positional)} "
        "positional parameters"
    )


def _class_name(obj: Any) -> str:
    return obj.__name__ if isinstance(obj, type) else type(obj).__name__


def _partition_keys(topology: Topology, segment: Segment) -> tuple[str, ...] | None:
    """The fields a stage's input is partitioned by, or None if it reads a source."""
    if segment.kind == "source" or not segment.inputs:
        return None
    upstream = topology._segments[segment.inputs[0][0]]
    feeding = [o for o in upstream.outputs if o.get("to_stage") == segment.index]
    return tuple(feeding[0]["key_fields"]) if feeding else None


class GroupedStream:
    """A stream partitioned by key fields, ready for a keyed aggregate."""

    def __init__(self, stream: Stream, keys: tuple[str, ...], queues: QueueCount) -> None:
        self._stream = stream
        self.keys = keys
        self.queues = queues

    def _not_a_stream(self, op: str) -> TopologyDefinitionError:
        return TopologyDefinitionError(
            f"{self._stream._what(op)}: a grouped stream only feeds persistent_aggregate; call {op}() on the stream "
            f"before group_by({', '.join(map(repr, self.keys))}), or on new_values() of the aggregate"
        )

    def to_parquet(self, *args: Any, **kwargs: Any) -> None:
        """Not allowed: a grouped stream is not a stream of records."""
        raise self._not_a_stream("to_parquet")

    def to_topic(self, *args: Any, **kwargs: Any) -> None:
        """Not allowed: a grouped stream is not a stream of records."""
        raise self._not_a_stream("to_topic")

    def sink(self, *args: Any, **kwargs: Any) -> None:
        """Not allowed: a grouped stream is not a stream of records."""
        raise self._not_a_stream("sink")

    def print(self, *args: Any, **kwargs: Any) -> None:
        """Not allowed: a grouped stream is not a stream of records."""
        raise self._not_a_stream("print")

    def to_kafka(self, *args: Any, **kwargs: Any) -> None:
        """Not allowed: a grouped stream is not a stream of records."""
        raise self._not_a_stream("to_kafka")

    def persistent_aggregate(
        self,
        aggregator: CombinerAggregator | ReducerAggregator,
        *,
        out: str,
        state: Any,
        name: str | None = None,
    ) -> StateHandle:
        """Aggregate per key into a persistent map state (Trident's ``persistentAggregate``).

        Args:
            aggregator: a combiner such as ``Count()`` or ``Sum("amount")``.
            out: the name of the aggregated field.
            state: ``OpaqueMapState``, ``TransactionalMapState`` or ``MapState`` (the kind of
                exactly-once guarantee; see docs/design.md, "Txid rules").
            name: the state's name (defaults to ``out``).
        """
        stream = self._stream
        what = stream._what("persistent_aggregate")
        aggregator = as_combiner(aggregator, what)
        stream._check_fields(aggregator.input_fields(), what)
        if not isinstance(out, str) or not out.isidentifier():
            raise TopologyDefinitionError(f"{what}: out={out!r} must be a field name")
        if out in self.keys:
            raise TopologyDefinitionError(f"{what}: out={out!r} clashes with a key field")
        kind = state_kind_of(state)
        state_name = _check_name("state", name or out)
        topology = stream._topology
        if state_name in topology._states:
            raise TopologyDefinitionError(f"topology {topology.name!r}: state {state_name!r} is declared twice")
        value_type = aggregator.value_type(stream._types_of(aggregator.input_fields()))
        node = AggregateNode(
            name=state_name,
            group_fields=self.keys,
            aggregator=aggregator,
            out=out,
            state_kind=kind,
            queues=self.queues,
            value_type=value_type,
        )
        segment = topology._segment(
            name=state_name,
            kind="keyed",
            queues=self.queues,
            fields={**{k: path_type(stream._fields, k, what) for k in self.keys}, out: _state_type(aggregator, value_type)},
            aggregate=node,
        )
        stream._connect({"kind": "partials", "to_stage": segment.index, "queues": self.queues, "key_fields": self.keys}, what)
        handle = StateHandle(topology, state_name, self.keys, out, kind="map", stage=segment.index)
        return topology._add_state(handle)


@dataclass(frozen=True, eq=False)
class StateHandle:
    """A persistent state of a topology (Trident's ``TridentState``), usable in queries.

    ``kind`` is ``"map"`` (persistent_aggregate) or ``"persist"`` (partition_persist);
    ``stage`` is the index of the stage that keeps it.
    """

    topology: Topology
    name: str
    keys: tuple[str, ...]
    value_field: str
    kind: str = "map"
    stage: int = -1
    emit_fields: dict[str, str] | None = None
    """partition_persist: the fields of what its updater emits (``out=``)."""

    def new_values(self) -> Stream:
        """The stream of what each batch changed in this state (Trident's ``newValuesStream``).

        For a ``persistent_aggregate`` state: per batch, every updated key with its new value
        (the key fields and the aggregate's field), emitted after the batch's state update and
        running in the stage that keeps the state. For a ``partition_persist`` state: what its
        updater emits with ``collector.emit(...)`` (fields declared with ``out=``), shuffled into
        a stage of its own with one task per partition.
        """
        topology = self.topology
        segment = topology._segments[self.stage]
        what = f"new_values() of state {self.name!r}"
        if self.kind == "map":
            return Stream(topology, segment, segment.fields)
        if self.emit_fields is None:
            raise TopologyDefinitionError(f"{what}: declare the fields its updater emits with partition_persist(..., out=...)")
        persist = next(o for o in segment.outputs if o["kind"] == "persist")
        if persist.get("emits") is None:
            values = topology._segment(
                name=_check_name("stage", f"{self.name}-values"),
                kind="partition",
                queues=segment.queues,
                fields=dict(self.emit_fields),
            )
            persist["emits"] = {
                "kind": "records",
                "tap": -1,
                "to_stage": values.index,
                "queues": values.queues,
                "key_fields": (),
                "stream": self.name,
            }
            values.inputs.append((segment.index, self.name))
        return Stream(topology, topology._segments[persist["emits"]["to_stage"]], self.emit_fields)
