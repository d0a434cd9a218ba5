"""Trident-style combiner aggregators used by ``persistent_aggregate``.

A combiner aggregator turns each record into a value (``init``), merges two values
(``combine``) and has a neutral value (``zero``). Partial aggregates are combined on each side
of a shuffle, as Trident does before it repartitions. ``spark_function`` names the Spark SQL
aggregate that computes the same combination inside Spark.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Number
from typing import Any, ClassVar

from stream_ops.errors import AggregatorInputError


def _field_value(record: Mapping[str, Any], field: str, aggregator: str, *, numeric: bool) -> Any:
    """``record[field]``, refusing a missing or null value (and a non-number when ``numeric``)."""
    value = record.get(field)
    if value is None:
        raise AggregatorInputError(f"{aggregator}({field!r}): field {field!r} is null or missing")
    if numeric and (isinstance(value, bool) or not isinstance(value, Number)):
        raise AggregatorInputError(f"{aggregator}({field!r}): field {field!r} is {value!r}, not a number")
    return value


class CombinerAggregator(ABC):
    """Base class of aggregators usable in ``GroupedStream.persistent_aggregate``."""

    spark_function: ClassVar[str]
    """Name of the Spark SQL aggregate equal to ``combine`` (``sum``, ``min``, ``max``)."""

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
        return "double"

    def to_spec(self) -> dict[str, Any]:
        """JSON description stored in the plan."""
        return {"kind": type(self).__name__}


@dataclass(frozen=True)
class Count(CombinerAggregator):
    """Counts records (Trident's ``Count``).

    Example:
        >>> words.group_by("word").persistent_aggregate(Count(), out="count", state=OpaqueMapState)
    """

    spark_function: ClassVar[str] = "sum"

    def init(self, record: Mapping[str, Any]) -> int:
        return 1

    def combine(self, a: Any, b: Any) -> Any:
        return a + b

    def zero(self) -> int:
        return 0

    def value_type(self, field_types: Mapping[str, str]) -> str:
        return "long"


@dataclass(frozen=True)
class Sum(CombinerAggregator):
    """Sums a numeric field (Trident's ``Sum``)."""

    field: str
    spark_function: ClassVar[str] = "sum"

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
    spark_function: ClassVar[str] = "min"

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

    spark_function: ClassVar[str] = "max"

    def combine(self, a: Any, b: Any) -> Any:
        return b if a is None else a if b is None else max(a, b)

    def to_spec(self) -> dict[str, Any]:
        return {"kind": "Max", "field": self.field}


_BY_KIND: dict[str, type[CombinerAggregator]] = {"Count": Count, "Sum": Sum, "Min": Min, "Max": Max}


def aggregator_from_spec(spec: Mapping[str, Any]) -> CombinerAggregator:
    """Rebuild an aggregator from its plan description."""
    kind = spec["kind"]
    cls = _BY_KIND.get(kind)
    if cls is None:
        raise ValueError(f"unknown aggregator kind {kind!r}; known: {sorted(_BY_KIND)}")
    args = {k: v for k, v in spec.items() if k != "kind"}
    return cls(**args)
