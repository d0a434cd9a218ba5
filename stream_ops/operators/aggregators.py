"""Trident's aggregators: combiners and reducers, built in or the user's own.

A :class:`CombinerAggregator` turns each record into a value (``init``), merges two values
(``combine``, associative and commutative) and has a neutral value (``zero``). Partial
aggregates are combined on each side of a shuffle, as Trident does before it repartitions.
``spark_function`` names the Spark SQL aggregate that computes the same combination inside
Spark; a user combiner without one is combined in Python.

A :class:`ReducerAggregator` starts from ``init()`` and folds records in with
``reduce(state, record)``; it cannot be combined before a shuffle, so its records travel whole
to the keyed stage (as a JSON list per key, :class:`ReducerCombiner`) and are reduced there in
record order.

User aggregators travel in the plan by reference (``{"kind": "user", "ref": ...}``): a
module-level class or dataclass, shipped in the code archive like every user function.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Number
from typing import Any, ClassVar

from stream_ops.errors import AggregatorInputError, TopologyDefinitionError

USER = "user"
"""The ``kind`` of a user combiner's plan description."""
REDUCER = "reducer"
"""The ``kind`` of a user reducer's plan description."""


def _field_value(record: Mapping[str, Any], field: str, aggregator: str, *, numeric: bool) -> Any:
    """``record[field]``, refusing a missing or null value (and a non-number when ``numeric``)."""
    value = record.get(field)
    if value is None:
        raise AggregatorInputError(f"{aggregator}({field!r}): field {field!r} is null or missing")
    if numeric and (isinstance(value, bool) or not isinstance(value, Number)):
        raise AggregatorInputError(f"{aggregator}({field!r}): field {field!r} is {value!r}, not a number")
    return value


class CombinerAggregator(ABC):
    """Base class of combiners usable in ``persistent_aggregate`` and ``aggregate``.

    Subclass it with ``init``, ``combine`` and ``zero``; set ``value_type_name`` to the Spark
    type of the value (``long``, ``double``, ``string``, ...; a value of another Python type is
    declared ``string`` and travels as JSON).
    """

    spark_function: ClassVar[str | None] = None
    """Name of the Spark SQL aggregate equal to ``combine`` (``sum``, ``min``, ``max``); None:
    partials are combined in Python (on the driver after a shuffle)."""
    value_type_name: ClassVar[str | None] = None
    """The Spark type of the aggregated value; None: ``double``."""

    @abstractmethod
    def init(self, record: Mapping[str, Any]) -> Any:
        """The value one record contributes."""

    @abstractmethod
    def combine(self, a: Any, b: Any) -> Any:
        """Merge two values; must be associative and commutative."""

    @abstractmethod
    def zero(self) -> Any:
        """The value of an empty group."""

    def input_fields(self) -> tuple[str, ...]:
        """Fields ``init`` reads, checked against the stream at definition time."""
        return ()

    def value_type(self, field_types: Mapping[str, str]) -> str:
        """Spark SQL type of the aggregated value, given the stream's field types."""
        return self.value_type_name or "double"

    def apply(self, current: Any, partial: Any) -> Any:
        """The new state value of a key: its current value (None for a new key) with ``partial``."""
        return self.combine(self.zero() if current is None else current, partial)

    def to_spec(self) -> dict[str, Any]:
        """JSON description stored in the plan (a user combiner: a reference to its class)."""
        from stream_ops.topology.functions import object_ref  # topology imports this module

        return {"kind": USER, "ref": object_ref(self, what=f"aggregator {type(self).__name__}")}


class ReducerAggregator(ABC):
    """Trident's ``ReducerAggregator``: ``init()`` then ``reduce(state, record)`` per record.

    Set ``value_type_name`` to the Spark type of the state (default ``string``: JSON).
    """

    value_type_name: ClassVar[str | None] = None

    @abstractmethod
    def init(self) -> Any:
        """The state of a key before its first record."""

    @abstractmethod
    def reduce(self, state: Any, record: Mapping[str, Any]) -> Any:
        """The state after ``record``."""

    def input_fields(self) -> tuple[str, ...]:
        """Fields ``reduce`` reads, checked against the stream at definition time."""
        return ()

    def to_spec(self) -> dict[str, Any]:
        """JSON description stored in the plan: a reference to its class."""
        from stream_ops.topology.functions import object_ref  # topology imports this module

        return {"kind": REDUCER, "ref": object_ref(self, what=f"aggregator {type(self).__name__}")}


@dataclass(frozen=True)
class ReducerCombiner(CombinerAggregator):
    """A reducer in combiner form: partials are JSON lists of records, concatenated before the
    shuffle and reduced in order into the key's state after it."""

    reducer: ReducerAggregator

    def init(self, record: Mapping[str, Any]) -> str:
        return json.dumps([dict(record)], default=str)

    def combine(self, a: Any, b: Any) -> str:
        return json.dumps(json.loads(a) + json.loads(b))

    def zero(self) -> str:
        return "[]"

    def apply(self, current: Any, partial: Any) -> Any:
        state = self.reducer.init() if current is None else current
        for record in json.loads(partial):
            state = self.reducer.reduce(state, record)
        return state

    def input_fields(self) -> tuple[str, ...]:
        return self.reducer.input_fields()

    def value_type(self, field_types: Mapping[str, str]) -> str:
        return "string"  # the shuffled partials; the state's type is the reducer's

    def state_type(self) -> str:
        """The Spark type of the reduced state."""
        return self.reducer.value_type_name or "string"

    def to_spec(self) -> dict[str, Any]:
        return self.reducer.to_spec()


@dataclass(frozen=True)
class Count(CombinerAggregator):
    """Counts records (Trident's ``Count``).

    Example:
        >>> words.group_by("word").persistent_aggregate(Count(), out="count", state=OpaqueMapState)
    """

    spark_function: ClassVar[str | None] = "sum"

    def init(self, record: Mapping[str, Any]) -> int:
        return 1

    def combine(self, a: Any, b: Any) -> Any:
        return a + b

    def zero(self) -> int:
        return 0

    def value_type(self, field_types: Mapping[str, str]) -> str:
        return "long"

    def to_spec(self) -> dict[str, Any]:
        return {"kind": "Count"}


@dataclass(frozen=True)
class Sum(CombinerAggregator):
    """Sums a numeric field (Trident's ``Sum``)."""

    field: str
    spark_function: ClassVar[str | None] = "sum"

    def init(self, record: Mapping[str, Any]) -> Any:
        return _field_value(record, self.field, "Sum", numeric=True)

    def combine(self, a: Any, b: Any) -> Any:
        return a + b

    def zero(self) -> int:
        return 0

    def input_fields(self) -> tuple[str, ...]:
        return (self.field,)

    def value_type(self, field_types: Mapping[str, str]) -> str:
        declared = field_types.get(self.field, "double")
        return declared if declared in ("int", "long", "double", "float") else "double"

    def to_spec(self) -> dict[str, Any]:
        return {"kind": "Sum", "field": self.field}


@dataclass(frozen=True)
class Min(CombinerAggregator):
    """Smallest value of a field."""

    field: str
    spark_function: ClassVar[str | None] = "min"

    def init(self, record: Mapping[str, Any]) -> Any:
        return _field_value(record, self.field, type(self).__name__, numeric=False)

    def combine(self, a: Any, b: Any) -> Any:
        return b if a is None else a if b is None else min(a, b)

    def zero(self) -> None:
        return None

    def input_fields(self) -> tuple[str, ...]:
        return (self.field,)

    def value_type(self, field_types: Mapping[str, str]) -> str:
        return field_types.get(self.field, "double")

    def to_spec(self) -> dict[str, Any]:
        return {"kind": "Min", "field": self.field}


@dataclass(frozen=True)
class Max(Min):
    """Largest value of a field."""

    spark_function: ClassVar[str | None] = "max"

    def combine(self, a: Any, b: Any) -> Any:
        return b if a is None else a if b is None else max(a, b)

    def to_spec(self) -> dict[str, Any]:
        return {"kind": "Max", "field": self.field}


_BY_KIND: dict[str, type[CombinerAggregator]] = {"Count": Count, "Sum": Sum, "Min": Min, "Max": Max}


def aggregator_from_spec(spec: Mapping[str, Any]) -> CombinerAggregator:
    """Rebuild an aggregator from its plan description (a reducer in its combiner form).

    Raises:
        TopologyDefinitionError: an unknown kind, or a user class that is not an aggregator.
        TopologyLoadError: a user class that cannot be imported.
    """
    kind = spec.get("kind")
    if kind in (USER, REDUCER):
        from stream_ops.topology.functions import resolve_object  # topology imports this module

        obj = resolve_object(spec["ref"])
        if kind == REDUCER and isinstance(obj, ReducerAggregator):
            return ReducerCombiner(obj)
        if kind == USER and isinstance(obj, CombinerAggregator):
            return obj
        raise TopologyDefinitionError(f"{spec['ref'].get('class')!r} is not a {kind} aggregator")
    cls = _BY_KIND.get(str(kind))
    if cls is None:
        raise TopologyDefinitionError(f"unknown aggregator kind {kind!r}; known: {sorted(_BY_KIND)}, {USER!r}, {REDUCER!r}")
    args = {k: v for k, v in spec.items() if k != "kind"}
    return cls(**args)


def as_combiner(aggregator: Any, what: str) -> CombinerAggregator:
    """``aggregator`` as a combiner (a reducer wrapped), after Trident's contract checks.

    Raises:
        TopologyDefinitionError: not an aggregator, methods left abstract, or ``zero()`` /
            ``combine(zero(), zero())`` / ``init()`` raising.
    """
    if isinstance(aggregator, type) and issubclass(aggregator, CombinerAggregator | ReducerAggregator):
        raise TopologyDefinitionError(f"{what}: pass an instance, {aggregator.__name__}(), not the class")
    if isinstance(aggregator, ReducerAggregator):
        try:
            aggregator.init()
        except Exception as e:
            raise TopologyDefinitionError(f"{what}: {type(aggregator).__name__}.init() raises {type(e).__name__}: {e}") from e
        aggregator.to_spec()  # a reference a worker can rebuild
        return ReducerCombiner(aggregator)
    if not isinstance(aggregator, CombinerAggregator):
        raise TopologyDefinitionError(
            f"{what}: {aggregator!r} is not an aggregator such as Count() or Sum(field), nor a CombinerAggregator "
            "(init/combine/zero) or ReducerAggregator (init/reduce)"
        )
    try:
        zero = aggregator.zero()
        aggregator.combine(zero, zero)
    except Exception as e:
        raise TopologyDefinitionError(
            f"{what}: {type(aggregator).__name__}.combine(zero(), zero()) raises {type(e).__name__}: {e}; "
            "zero() must be the neutral value of combine"
        ) from e
    aggregator.to_spec()  # a reference a worker can rebuild
    return aggregator
