"""Aggregators refuse what they cannot aggregate, so the record becomes a dead letter."""

from __future__ import annotations

import pyarrow as pa
import pytest

from stream_ops.compute.stage_function import OutputPlan, stage_rows
from stream_ops.errors import AggregatorInputError
from stream_ops.operators.aggregators import Max, Min, Sum


@pytest.mark.parametrize("aggregator", [Sum("n"), Min("n"), Max("n")])
def test_a_null_or_missing_field_is_refused(aggregator) -> None:
    with pytest.raises(AggregatorInputError, match="'n' is null or missing"):
        aggregator.init({"n": None})
    with pytest.raises(AggregatorInputError, match="'n' is null or missing"):
        aggregator.init({})


def test_sum_refuses_a_value_that_is_not_a_number() -> None:
    with pytest.raises(AggregatorInputError, match="not a number"):
        Sum("n").init({"n": "3"})
    with pytest.raises(AggregatorInputError, match="not a number"):
        Sum("n").init({"n": True})
    assert Sum("n").init({"n": 2.5}) == 2.5


def test_a_null_sum_field_is_a_dead_letter_in_the_source_stage_not_a_null_partial() -> None:
    run = stage_rows((), [OutputPlan(0, -1, ("word",), Sum("n").to_spec())], "typed", "long")
    batch = pa.RecordBatch.from_pylist(
        [
            {"word": "a", "n": None, "_corrupt_record": None},
            {"word": "a", "n": 2, "_corrupt_record": None},
            {"word": "b", "n": 5, "_corrupt_record": None},
        ]
    )
    (out,) = list(run(iter([batch])))
    rows = out.to_pylist()
    partials = {r["key"]: r["value"] for r in rows if r["key"] is not None}
    dead = [r["dead"] for r in rows if r["dead"] is not None]
    assert partials == {'["a"]': 2, '["b"]': 5}
    assert len(dead) == 1 and "'n' is null or missing" in dead[0]
