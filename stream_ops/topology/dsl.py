"""The topology DSL: ``Topology``, ``Stream``, ``GroupedStream``, ``StateHandle``.

The DSL only builds a graph of nodes and checks it as it grows; ``stream_ops.topology.plan``
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

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stream_ops.errors import TopologyDefinitionError
from stream_ops.operators.aggregators import CombinerAggregator
from stream_ops.topics.file_topic import FileTopic
from stream_ops.topology.functions import function_ref

SPARK_TYPES = ("string", "long", "int", "double", "float", "boolean")
STATE_KINDS = ("transactional", "opaque", "non-transactional")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,62}$")


def _check_name(kind: str, name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise TopologyDefinitionError(
            f"{kind} name {name!r} is invalid: use letters, digits, '_' or '-', starting with a letter"
        )
    return name


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
        if typ not in SPARK_TYPES:
            raise TopologyDefinitionError(f"{what}: field {name!r} has unknown type {typ!r}; use one of {SPARK_TYPES}")
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
        f"state={state!r} is not a state kind: pass OpaqueMapState, TransactionalMapState or MapState "
        f"(or one of {STATE_KINDS})"
    )


# --- graph nodes ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceNode:
    """A source reading a FileTopic of JSON lines."""

    name: str
    topic: FileTopic
    schema: dict[str, str]


@dataclass(frozen=True)
class OperationNode:
    """One each/map/filter step; ``function`` is a ``module:qualname`` reference."""

    kind: str
    function: str
    fields: tuple[str, ...] | None
    out: dict[str, str]


@dataclass(frozen=True)
class AggregateNode:
    """``group_by(...).persistent_aggregate(...)``: a shuffle and a keyed map state."""

    name: str
    group_fields: tuple[str, ...]
    aggregator: CombinerAggregator
    out: str
    state_kind: str
    queues: int
    value_type: str


@dataclass
class _Chain:
    """Everything one source feeds, in order."""

    source: SourceNode
    operations: list[OperationNode] = field(default_factory=list)
    aggregate: AggregateNode | None = None


# --- public DSL ----------------------------------------------------------------------------


class Topology:
    """A named streaming topology: sources, the operations on them, states and queries."""

    def __init__(self, name: str) -> None:
        self.name = _check_name("topology", name)
        self._chains: list[_Chain] = []
        self._queries: dict[str, StateHandle] = {}

    def source(
        self,
        name: str,
        topic: FileTopic,
        *,
        schema: Mapping[str, str] | Sequence[str],
    ) -> Stream:
        """Declare a source reading JSON-lines records from ``topic``.

        Args:
            name: unique source name.
            topic: the FileTopic to read; its queues become the first stage's tasks.
            schema: field -> Spark type ('string', 'long', 'double', 'boolean', ...) or a list
                of string field names.
        """
        _check_name("source", name)
        if any(chain.source.name == name for chain in self._chains):
            raise TopologyDefinitionError(f"topology {self.name!r}: source {name!r} is declared twice")
        if not isinstance(topic, FileTopic):
            raise TopologyDefinitionError(f"source {name!r}: topic must be a FileTopic, got {type(topic).__name__}")
        types = _field_types(schema, f"source {name!r} schema")
        chain = _Chain(SourceNode(name, topic, types))
        self._chains.append(chain)
        return Stream(self, chain, types)

    def query(self, name: str, state: StateHandle) -> None:
        """Expose a state for key lookups (Trident's DRPC ``stateQuery``).

        ``stream-ops query TOPOLOGY NAME KEY...`` then returns the current value of each key.
        """
        _check_name("query", name)
        if name in self._queries:
            raise TopologyDefinitionError(f"topology {self.name!r}: query {name!r} is declared twice")
        if not isinstance(state, StateHandle) or state.topology is not self:
            raise TopologyDefinitionError(f"query {name!r}: pass a state returned by persistent_aggregate of this topology")
        self._queries[name] = state

    # read access for the planner
    @property
    def chains(self) -> list[_Chain]:
        return list(self._chains)

    @property
    def queries(self) -> dict[str, StateHandle]:
        return dict(self._queries)

    def _state_names(self) -> set[str]:
        return {c.aggregate.name for c in self._chains if c.aggregate is not None}


class Stream:
    """A stream of records (field name -> value) with a known set of fields."""

    def __init__(self, topology: Topology, chain: _Chain, fields: Mapping[str, str]) -> None:
        self._topology = topology
        self._chain = chain
        self._fields = dict(fields)
        self._consumed = False

    @property
    def fields(self) -> tuple[str, ...]:
        """The fields each record of this stream carries, in order."""
        return tuple(self._fields)

    def _what(self, op: str) -> str:
        return f"{op}() on source {self._chain.source.name!r}"

    def _extend(self, node: OperationNode, fields: Mapping[str, str]) -> Stream:
        if self._consumed:
            raise TopologyDefinitionError(
                f"{self._what(node.kind)}: this stream already continues elsewhere; a stream has one consumer here"
            )
        self._consumed = True
        self._chain.operations.append(node)
        return Stream(self._topology, self._chain, fields)

    def _check_fields(self, names: Iterable[str], what: str) -> tuple[str, ...]:
        names = tuple(names)
        for name in names:
            if name not in self._fields:
                raise TopologyDefinitionError(f"{what}: unknown field {name!r}; the stream has {list(self._fields)}")
        return names

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

    def group_by(self, *fields: str, queues: int | None = None) -> GroupedStream:
        """Partition the stream by ``fields``: equal keys meet in one task after a shuffle.

        Args:
            fields: the key fields.
            queues: number of shuffle queues (= tasks of the keyed stage); defaults to the
                source's number of queues.
        """
        what = self._what("group_by")
        if not fields:
            raise TopologyDefinitionError(f"{what}: name at least one field to group by")
        keys = self._check_fields(fields, what)
        if len(set(keys)) != len(keys):
            raise TopologyDefinitionError(f"{what}: a field is named twice in {list(keys)}")
        n = self._chain.source.topic.queues if queues is None else queues
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise TopologyDefinitionError(f"{what}: queues must be a positive integer, got {queues!r}")
        if self._consumed:
            raise TopologyDefinitionError(f"{what}: this stream already continues elsewhere")
        self._consumed = True
        return GroupedStream(self, keys, n)

    def persistent_aggregate(self, *args: Any, **kwargs: Any) -> StateHandle:
        """Not allowed on an ungrouped stream: group first."""
        raise TopologyDefinitionError(
            f"{self._what('persistent_aggregate')}: call group_by(...) first; an aggregate needs key fields"
        )


class GroupedStream:
    """A stream partitioned by key fields, ready for a keyed aggregate."""

    def __init__(self, stream: Stream, keys: tuple[str, ...], queues: int) -> None:
        self._stream = stream
        self.keys = keys
        self.queues = queues

    def persistent_aggregate(
        self,
        aggregator: CombinerAggregator,
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
                exactly-once guarantee; see the README).
            name: the state's name (defaults to ``out``).
        """
        stream = self._stream
        chain = stream._chain
        what = stream._what("persistent_aggregate")
        if not isinstance(aggregator, CombinerAggregator):
            raise TopologyDefinitionError(f"{what}: {aggregator!r} is not an aggregator such as Count() or Sum(field)")
        stream._check_fields(aggregator.input_fields(), what)
        if not isinstance(out, str) or not out.isidentifier():
            raise TopologyDefinitionError(f"{what}: out={out!r} must be a field name")
        if out in self.keys:
            raise TopologyDefinitionError(f"{what}: out={out!r} clashes with a key field")
        kind = state_kind_of(state)
        state_name = _check_name("state", name or out)
        topology = stream._topology
        if state_name in topology._state_names():
            raise TopologyDefinitionError(f"topology {topology.name!r}: state {state_name!r} is declared twice")
        if chain.aggregate is not None:
            raise TopologyDefinitionError(f"{what}: source {chain.source.name!r} already feeds a state")
        chain.aggregate = AggregateNode(
            name=state_name,
            group_fields=self.keys,
            aggregator=aggregator,
            out=out,
            state_kind=kind,
            queues=self.queues,
            value_type=aggregator.value_type(stream._fields),
        )
        return StateHandle(topology, state_name, self.keys, out)


@dataclass(frozen=True, eq=False)
class StateHandle:
    """A persistent state of a topology (Trident's ``TridentState``), usable in queries."""

    topology: Topology
    name: str
    keys: tuple[str, ...]
    value_field: str
