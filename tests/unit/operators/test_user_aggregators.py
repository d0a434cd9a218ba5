"""User aggregators: Trident's CombinerAggregator and ReducerAggregator contracts, through the plan."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from stream_ops import FileTopic, OpaqueMapState, Topology
from stream_ops.dsl.build_plan import build_plan
from stream_ops.errors import TopologyDefinitionError
from stream_ops.operators import CombinerAggregator, Count, ReducerAggregator, Sum
from stream_ops.operators.aggregators import ReducerCombiner, aggregator_from_spec, as_combiner


@dataclass(frozen=True)
class LongestOf(CombinerAggregator):
    """The longest value of a field."""

    field: str
    value_type_name = "long"

    def init(self, record):
        return len(record[self.field])

    def combine(self, a, b):
        return max(a, b)

    def zero(self):
        return 0


class Distinct(ReducerAggregator):
    """The sorted distinct words seen."""

    def init(self):
        return []

    def reduce(self, state, record):
        return sorted({*state, record["word"]})


class BadZero(CombinerAggregator):
    def init(self, record):
        return 1

    def combine(self, a, b):
        return a + b

    def zero(self):
        return None


def test_builtins_and_user_aggregators_round_trip_through_their_plan_description():
    for agg in (Count(), Sum("n")):
        assert aggregator_from_spec(agg.to_spec()) == agg
    spec = LongestOf("word").to_spec()
    assert spec["kind"] == "user" and spec["ref"]["args"] == {"field": "word"}
    rebuilt = aggregator_from_spec(json.loads(json.dumps(spec)))
    assert rebuilt == LongestOf("word") and rebuilt.spark_function is None
    assert rebuilt.apply(None, rebuilt.combine(rebuilt.init({"word": "abc"}), 5)) == 5
    reducer = aggregator_from_spec(Distinct().to_spec())
    assert isinstance(reducer, ReducerCombiner) and isinstance(reducer.reducer, Distinct)


def test_a_reducer_folds_its_records_in_order_after_the_shuffle():
    combiner = as_combiner(Distinct(), "test")
    partial = combiner.combine(combiner.init({"word": "b"}), combiner.init({"word": "a"}))
    assert combiner.apply(None, partial) == ["a", "b"]
    assert combiner.apply(["c"], combiner.init({"word": "a"})) == ["a", "c"]


def test_contract_mistakes_fail_at_definition_naming_the_problem(tmp_path):
    with pytest.raises(TopologyDefinitionError, match=r"combine\(zero\(\), zero\(\)\) raises TypeError"):
        as_combiner(BadZero(), "agg")
    with pytest.raises(TopologyDefinitionError, match="pass an instance, Distinct"):
        as_combiner(Distinct, "agg")
    with pytest.raises(TopologyDefinitionError, match="is not an aggregator"):
        as_combiner(len, "agg")


def test_a_plan_keeps_user_aggregators_and_the_reducers_state_type(tmp_path):
    t = Topology("aggs")
    words = t.source("s", FileTopic(tmp_path / "in", 1), schema={"word": "string"})
    words.group_by("word").persistent_aggregate(LongestOf("word"), out="longest", state=OpaqueMapState)
    seen = words.persistent_aggregate(Distinct(), out="seen", state=OpaqueMapState, name="seen")
    assert seen.new_values().fields == ("seen",)
    plan = build_plan(t)
    longest, distinct = plan.stage(1), plan.stage(2)
    assert longest.state.aggregator["kind"] == "user" and longest.fields["longest"] == "long"
    assert distinct.state.aggregator["kind"] == "user"  # a reference like any user code: shipped and bound
    assert distinct.input_fields == {"key": "string", "value": "string"} and distinct.fields == {"seen": "string"}
