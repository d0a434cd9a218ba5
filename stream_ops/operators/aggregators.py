"""Trident's aggregators: combiners and reducers, built in or the user's own.

A :class:`CombinerAggregator` turns each record into a value (``init``), merges two values
(``combine``, associative and commutative) and has a neutral value (``zero``). Partial
aggregates are combined on each side of a shuffle, as Trident does before it repartitions.
``spark_function`` names the Spark SQL aggregate that computes the same combination inside
Spark; a combiner without one (every user combiner, unless it sets one) is combined in Python.

A :class:`ReducerAggregator` starts from ``init()`` and folds records in with
``reduce(state, record)``. It has no ``combine``, so nothing can be pre-aggregated before a
shuffle: a ``persistent_aggregate`` (or ``aggregate``) with a reducer ships whole records to
the keyed stage (as JSON lists per key, :class:`ReducerCombiner`) and reduces them there, in
the order the batch delivers them: record order within each source partition.

User aggregators travel in the plan by reference, ``{"kind": "user", "ref": ...}`` (see
:func:`~stream_ops.topology.functions.object_ref`): a module-level class, stateless instance or
dataclass instance (its fields travel as JSON), shipped in the code archive like every user
function and rebuilt by workers from that archive only. :func:`check_aggregator` enforces
Trident's contract at definition time.

Value types: ``value_type_name`` declares the Spark type of a user aggregator's value
(``long``, ``int``, ``double``, ``float``, ``boolean`` or ``string``). A value that is not a
Spark scalar (a list, a dict, ...) must be declared ``string``: a user combiner declared
``string`` (without a ``spark_function``) has its values travel between stages as JSON text
(:class:`JsonCombiner`), and the state keeps the decoded value.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Number
from typing import Any, ClassVar

from stream_ops.arrow_types import ARROW_TYPES
from stream_ops.errors import AggregatorInputError, TopologyDefinitionError
from stream_ops.topology.code_scope import CODE_KEY, CodeScope
from stream_ops.topology.functions import object_ref, resolve_object

USER = "user"
"""The ``kind`` of a user aggregator's plan description (combiner or reducer)."""
SPARK_COMBINE_FUNCTIONS = frozenset({"sum", "min", "max"})
"""The Spark SQL aggregates a ``spark_function`` may name."""


def _field_value(record: Mapping[str, Any], field: str, aggregator: str, *, numeric: bool) -> Any:
    """``record[field]``, refusing a missing or null value (and a non-number when ``numeric``)."""
    value = record.get(field)
    if value is None:
        raise AggregatorInputError(f"{aggregator}({field!r}): field {field!r} is null or missing")
    if numeric and (isinstance(value, bool) or not isinstance(value, Number)):
        raise AggregatorInputError(f"{aggregator}({field!r}): field {field!r} is {value!r}, not a number")
    return value


def _user_spec(aggregator: CombinerAggregator | ReducerAggregator) -> dict[str, Any]:
    """``{"kind": "user", "ref": ...}``: a reference a worker resolves from the shipped code."""
    return {"kind": USER, "ref": object_ref(aggregator, what=f"aggregator {type(aggregator).__name__}")}


class CombinerAggregator(ABC):
    """Base class of combiners usable in ``persistent_aggregate`` and ``aggregate``.

    Subclass it at module level with ``init``, ``combine`` and ``zero``; set
    ``value_type_name`` to the Spark type of the value. ``init`` must not rely on the
    grouping fields: a global aggregate has none.

    Example:
        >>> class Longest(CombinerAggregator):
        ...     value_type_name = "long"
        ...     def init(self, record): return len(record["word"])
        ...     def combine(self, a, b): return max(a, b)
        ...     def zero(self): return 0
    """

    spark_function: ClassVar[str | None] = None
    """Name of the Spark SQL aggregate equal to ``combine`` (one of
    :data:`SPARK_COMBINE_FUNCTIONS`), so that Spark combines the partials itself. None (the
    default, and what a user combiner normally keeps): ``combine`` runs in Python, the partials
    being combined on the driver after each shuffle. A subclass that changes ``combine`` of a
    built-in must set it back to None."""
    value_type_name: ClassVar[str | None] = None
    """The Spark type of the value (``long``, ``int``, ``double``, ``float``, ``boolean``,
    ``string``); None: ``double``. Values that are not Spark scalars are declared ``string``
    and travel as JSON."""

    @abstractmethod
    def init(self, record: Mapping[str, Any]) -> Any:
        """The value one record contributes."""

    @abstractmethod
    def combine(self, a: Any, b: Any) -> Any:
        """Merge two values; must be associative and commutative."""

    @abstractmethod
    def zero(self) -> Any:
        """The value of an empty group, neutral for ``combine``."""

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
        """JSON description stored in the plan (a user combiner: a reference to its class).

        Raises:
            TopologyDefinitionError: a worker could not rebuild this object (see
                :func:`~stream_ops.topology.functions.object_ref`).
        """
        return _user_spec(self)

    def _builtin_spec(self, kind: str, **args: Any) -> dict[str, Any]:
        """A built-in's description; a user subclass of a built-in is a user aggregator."""
        return {"kind": kind, **args} if type(self) is _BUILTINS[kind] else _user_spec(self)


class ReducerAggregator(ABC):
    """Trident's ``ReducerAggregator``: ``init()`` then ``reduce(state, record)`` per record.

    A reducer cannot be pre-aggregated before a shuffle: a ``persistent_aggregate`` with a
    reducer ships whole records to the keyed stage and reduces them there, in the order the
    batch delivers them (record order within each source partition). Set ``value_type_name``
    to the Spark type of the state (default ``string``: a non-scalar state such as a list is
    kept as JSON).

    Example:
        >>> class Distinct(ReducerAggregator):
        ...     def init(self): return []
        ...     def reduce(self, state, record): return sorted({*state, record["word"]})
    """

    value_type_name: ClassVar[str | None] = None
    """The Spark type of the state; None: ``string``."""

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
        """JSON description stored in the plan: ``{"kind": "user", "ref": ...}``.

        Raises:
            TopologyDefinitionError: a worker could not rebuild this object.
        """
        return _user_spec(self)


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
class JsonCombiner(CombinerAggregator):
    """A user combiner declared ``string`` as workers run it: its partials travel as JSON
    text, decoded for each ``combine``; the state keeps the decoded value."""

    combiner: CombinerAggregator

    def init(self, record: Mapping[str, Any]) -> str:
        return json.dumps(self.combiner.init(record))

    def combine(self, a: Any, b: Any) -> str:
        return json.dumps(self.combiner.combine(json.loads(a), json.loads(b)))

    def zero(self) -> str:
        return json.dumps(self.combiner.zero())

    def apply(self, current: Any, partial: Any) -> Any:
        return self.combiner.apply(current, json.loads(partial))

    def input_fields(self) -> tuple[str, ...]:
        return self.combiner.input_fields()

    def value_type(self, field_types: Mapping[str, str]) -> str:
        return "string"

    def to_spec(self) -> dict[str, Any]:
        return self.combiner.to_spec()


_WRAPPERS = (ReducerCombiner, JsonCombiner)
"""The forms workers run user aggregators in (not user classes themselves)."""


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
        return self._builtin_spec("Count")


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
        return self._builtin_spec("Sum", field=self.field)


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
        return self._builtin_spec("Min", field=self.field)


@dataclass(frozen=True)
class Max(Min):
    """Largest value of a field."""

    spark_function: ClassVar[str | None] = "max"

    def combine(self, a: Any, b: Any) -> Any:
        return b if a is None else a if b is None else max(a, b)

    def to_spec(self) -> dict[str, Any]:
        return self._builtin_spec("Max", field=self.field)


_BUILTINS: dict[str, type[CombinerAggregator]] = {"Count": Count, "Sum": Sum, "Min": Min, "Max": Max}


def aggregator_from_spec(spec: Mapping[str, Any], scope: CodeScope | None = None) -> CombinerAggregator:
    """Rebuild an aggregator from its plan description, in the form workers run it.

    A user reducer comes back wrapped in :class:`ReducerCombiner`, a user combiner declared
    ``string`` without a ``spark_function`` in :class:`JsonCombiner`.

    Args:
        spec: the description (:meth:`CombinerAggregator.to_spec`).
        scope: the verified code archive to resolve a user aggregator in. None: the binding
            its reference carries (a worker's bound plan, see
            :func:`~stream_ops.topology.plan_code.bind_plan`), else a plain import.

    Raises:
        TopologyDefinitionError: an unknown kind, a malformed description, or a user class
            that is not an aggregator.
        TopologyLoadError: a user class that cannot be imported (or lies outside ``scope``).

    Example:
        >>> aggregator_from_spec({"kind": "Sum", "field": "n"})
        Sum(field='n')
    """
    kind = spec.get("kind")
    if kind == USER:
        ref = spec.get("ref")
        if not isinstance(ref, Mapping) or not isinstance(ref.get("class"), str):
            raise TopologyDefinitionError(f"user aggregator description {dict(spec)!r} has no 'ref' naming a class")
        obj = resolve_object({**ref, CODE_KEY: scope} if scope is not None else dict(ref))
        if isinstance(obj, ReducerAggregator) and not isinstance(obj, CombinerAggregator):
            return ReducerCombiner(obj)
        if isinstance(obj, CombinerAggregator) and not isinstance(obj, ReducerAggregator):
            return JsonCombiner(obj) if _travels_as_json(obj) else obj
        raise TopologyDefinitionError(
            f"{ref['class']!r} is {type(obj).__name__}, not a CombinerAggregator or a ReducerAggregator"
        )
    cls = _BUILTINS.get(str(kind))
    if cls is None:
        raise TopologyDefinitionError(f"unknown aggregator kind {kind!r}; known: {sorted(_BUILTINS)} and {USER!r}")
    args = {k: v for k, v in spec.items() if k != "kind"}
    try:
        return cls(**args)
    except TypeError as e:
        raise TopologyDefinitionError(f"aggregator description {dict(spec)!r} does not fit {kind}: {e}") from e


def _travels_as_json(combiner: CombinerAggregator) -> bool:
    """Whether a user combiner's values travel as JSON text (declared ``string``, combined in Python)."""
    return combiner.value_type_name == "string" and combiner.spark_function is None


def _fits(value: Any, type_name: str) -> bool:
    """Whether a Python value can be stored as Spark type ``type_name`` (``string``: as JSON)."""
    if type_name == "string":
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            return False
        return True
    if type_name == "boolean":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if type_name in ("long", "int"):
        return isinstance(value, int)
    return isinstance(value, int | float)  # double, float


def _not_overridden(aggregator: object, base: type, names: tuple[str, ...]) -> list[str]:
    """The methods of ``base`` among ``names`` that ``aggregator``'s class leaves as they are."""
    return [n for n in names if getattr(type(aggregator), n, None) in (None, getattr(base, n))]


def _check_declarations(aggregator: CombinerAggregator | ReducerAggregator, what: str) -> str:
    """Check ``value_type_name`` (and a combiner's ``spark_function``); the declared type."""
    name = type(aggregator).__name__
    declared = aggregator.value_type_name
    if declared is not None and declared not in ARROW_TYPES:
        raise TopologyDefinitionError(
            f"{what}: {name}.value_type_name is {declared!r}; use one of {sorted(ARROW_TYPES)} "
            "('string' for values that are not Spark scalars: they are stored as JSON)"
        )
    if isinstance(aggregator, CombinerAggregator):
        spark_function = aggregator.spark_function
        if spark_function is not None and spark_function not in SPARK_COMBINE_FUNCTIONS:
            raise TopologyDefinitionError(
                f"{what}: {name}.spark_function is {spark_function!r}; use one of {sorted(SPARK_COMBINE_FUNCTIONS)} "
                "or None to combine in Python"
            )
        return declared or "double"
    return declared or "string"


def _check_value(aggregator: object, value: Any, type_name: str, called: str, what: str) -> None:
    """Refuse a ``zero()`` / ``init()`` value its declared type cannot hold (None fits any)."""
    if value is not None and not isinstance(aggregator, _WRAPPERS) and not _fits(value, type_name):
        raise TopologyDefinitionError(
            f"{what}: {type(aggregator).__name__}.{called} is {value!r}, which does not fit its value type "
            f"{type_name!r}; set value_type_name (e.g. 'string' for values that are not Spark scalars: stored as JSON)"
        )


def check_aggregator(aggregator: Any, what: str) -> None:
    """Trident's aggregator contract, checked cheaply at definition time.

    ``aggregator`` must be an instance of a :class:`CombinerAggregator` subclass overriding
    ``init``/``combine``/``zero``, whose ``zero()`` and ``combine(zero(), zero())`` run, or of
    a :class:`ReducerAggregator` subclass overriding ``init``/``reduce``, whose ``init()``
    runs; its declared types must be known and fit ``zero()`` (``init()``), and a worker must
    be able to rebuild it from its plan description.

    Args:
        aggregator: what the user passed.
        what: how the caller names the operation in messages (e.g. "persistent_aggregate on stream 'words'").

    Raises:
        TopologyDefinitionError: naming the broken part of the contract.
    """
    if isinstance(aggregator, type) and issubclass(aggregator, CombinerAggregator | ReducerAggregator):
        raise TopologyDefinitionError(f"{what}: pass an instance, {aggregator.__name__}(), not the class")
    mro = type(aggregator).__mro__
    is_combiner, is_reducer = CombinerAggregator in mro, ReducerAggregator in mro
    if is_combiner == is_reducer:
        both = "is both a CombinerAggregator and a ReducerAggregator" if is_combiner else "is not an aggregator"
        raise TopologyDefinitionError(
            f"{what}: {aggregator!r} {both}; pass Count(), Sum(field), Min(field), Max(field) or an instance of a "
            "subclass of stream_ops.operators.CombinerAggregator (init/combine/zero) or ReducerAggregator (init/reduce)"
        )
    name = type(aggregator).__name__
    base, methods = (CombinerAggregator, ("init", "combine", "zero")) if is_combiner else (ReducerAggregator, ("init", "reduce"))
    missing = _not_overridden(aggregator, base, methods)
    if missing:
        raise TopologyDefinitionError(f"{what}: {name} does not override {', '.join(missing)} of {base.__name__}")
    type_name = _check_declarations(aggregator, what)
    if is_combiner:
        try:
            zero = aggregator.zero()
        except Exception as e:
            raise TopologyDefinitionError(f"{what}: {name}.zero() raises {type(e).__name__}: {e}") from e
        try:
            aggregator.combine(zero, zero)
        except Exception as e:
            raise TopologyDefinitionError(
                f"{what}: {name}.combine(zero(), zero()) raises {type(e).__name__}: {e}; "
                "zero() must be the neutral value of combine"
            ) from e
        _check_value(aggregator, zero, type_name, "zero()", what)
    else:
        try:
            state = aggregator.init()
        except Exception as e:
            raise TopologyDefinitionError(f"{what}: {name}.init() raises {type(e).__name__}: {e}") from e
        _check_value(aggregator, state, type_name, "init()", what)
    try:
        json.dumps(aggregator.to_spec())  # a reference a worker can rebuild
    except TopologyDefinitionError as e:
        raise TopologyDefinitionError(f"{what}: {e}") from e
    except (TypeError, ValueError) as e:
        raise TopologyDefinitionError(f"{what}: the plan description of {name} is not JSON: {e}") from e


def as_combiner(aggregator: Any, what: str) -> CombinerAggregator:
    """``aggregator`` as a combiner (a reducer wrapped), after :func:`check_aggregator`.

    Raises:
        TopologyDefinitionError: the contract does not hold (see :func:`check_aggregator`).
    """
    check_aggregator(aggregator, what)
    return ReducerCombiner(aggregator) if isinstance(aggregator, ReducerAggregator) else aggregator
