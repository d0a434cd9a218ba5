"""The keyed stage's combine in Arrow: Spark's groupBy/agg semantics per aggregator kind."""

from __future__ import annotations

import json
import math
from typing import ClassVar

import pyarrow as pa
import pytest

from stream_ops.operators import CombinerAggregator, Count, ReducerAggregator, Sum
from stream_ops.operators.aggregators import JsonCombiner, Max, Min, ReducerCombiner
from stream_ops.operators.partials_combine import combine_partials


def _table(rows: list[tuple[str | None, object]], value_type: pa.DataType) -> pa.Table:
    return pa.table({"key": pa.array([k for k, _ in rows], pa.string()), "value": pa.array([v for _, v in rows], value_type)})


class Longest(CombinerAggregator):
    value_type_name = "long"

    def init(self, record):
        return len(record["word"])

    def combine(self, a, b):
        return max(a, b)

    def zero(self):
        return 0


class SparkSummed(Longest):
    """A user combiner that lets Spark (here: Arrow) combine its partials."""

    spark_function: ClassVar[str | None] = "sum"

    def combine(self, a, b):
        return a + b


class Words(ReducerAggregator):
    def init(self):
        return []

    def reduce(self, state, record):
        return [*state, record["word"]]


class Pair(CombinerAggregator):
    value_type_name = "string"

    def init(self, record):
        return [1, record["n"]]

    def combine(self, a, b):
        return [a[0] + b[0], a[1] + b[1]]

    def zero(self):
        return [0, 0]


@pytest.mark.parametrize(
    ("aggregator", "value_type", "rows", "expected"),
    [
        (Count(), pa.int64(), [("a", 2), ("b", 1), ("a", 3)], {"a": 5, "b": 1}),
        (Sum("n"), pa.int32(), [("a", 2), ("a", 2**31 - 1)], {"a": 2**31 + 1}),  # Spark widens an int sum
        (Sum("x"), pa.float64(), [("a", 0.5), ("a", 0.25)], {"a": 0.75}),
        (Min("w"), pa.string(), [("a", "pear"), ("a", "apple"), ("b", "fig")], {"a": "apple", "b": "fig"}),
        (Max("w"), pa.string(), [("a", "pear"), ("a", "apple")], {"a": "pear"}),
        (Min("t"), pa.bool_(), [("a", True), ("a", False)], {"a": False}),
        (Max("x"), pa.float64(), [("a", 1.0), ("a", float("nan")), ("b", 2.0)], {"a": math.nan, "b": 2.0}),
        (Min("x"), pa.float64(), [("a", 1.0), ("a", float("nan"))], {"a": 1.0}),  # NaN is above every number
        (SparkSummed(), pa.int64(), [("a", 4), ("a", 5)], {"a": 9}),
        (Longest(), pa.int64(), [("a", 4), ("a", 7), ("b", 3)], {"a": 7, "b": 3}),
    ],
)
def test_each_aggregator_kind_combines_as_spark_does(aggregator, value_type, rows, expected):
    combined, read = combine_partials(_table(rows, value_type), aggregator)
    assert read == len(rows)
    assert len(combined) == len(dict(combined))
    assert {k: "nan" if isinstance(v, float) and math.isnan(v) else v for k, v in combined} == {
        k: "nan" if isinstance(v, float) and math.isnan(v) else v for k, v in expected.items()
    }


def test_json_and_reducer_partials_combine_in_row_order():
    reduced, _ = combine_partials(
        _table([("a", '[{"word": "x"}]'), ("a", '[{"word": "y"}]')], pa.string()), ReducerCombiner(Words())
    )
    assert [(k, json.loads(v)) for k, v in reduced] == [("a", [{"word": "x"}, {"word": "y"}])]
    paired, _ = combine_partials(_table([("a", "[1, 5]"), ("a", "[2, 7]")], pa.string()), JsonCombiner(Pair()))
    assert [(k, json.loads(v)) for k, v in paired] == [("a", [3, 12])]


@pytest.mark.parametrize("aggregator", [Count(), Sum("n"), Min("n"), Max("n")])
def test_nulls_are_skipped_a_key_of_nulls_only_comes_out_null_and_null_keys_only_count(aggregator):
    combined, read = combine_partials(_table([("a", None), ("a", 2), ("b", None), (None, 9)], pa.int64()), aggregator)
    assert read == 4
    assert dict(combined) == {"a": 2, "b": None}  # the keyed stage dead-letters b's null partial


def test_a_user_combiner_never_sees_a_null_key():
    combined, read = combine_partials(_table([(None, 9), ("a", 2), ("a", 5)], pa.int64()), Longest())
    assert (combined, read) == ([("a", 5)], 3)


def test_an_empty_batch_combines_to_nothing():
    assert combine_partials(_table([], pa.int64()), Count()) == ([], 0)
