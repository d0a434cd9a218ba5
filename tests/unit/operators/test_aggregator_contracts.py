"""Trident's aggregator contracts: plan descriptions, user classes from shipped code, checks.

User aggregators live in a package written under ``tmp_path`` (imported through ``sys.path``
as at definition time, or from a zip archive as a worker does); no Spark, no ZooKeeper.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from stream_ops import FileTopic, OpaqueMapState, Topology
from stream_ops.dsl.build_plan import build_plan
from stream_ops.errors import TopologyDefinitionError, TopologyLoadError
from stream_ops.operators import CombinerAggregator, Count, Max, Min, ReducerAggregator, Sum
from stream_ops.operators.aggregators import (
    JsonCombiner,
    ReducerCombiner,
    aggregator_from_spec,
    as_combiner,
    check_aggregator,
)
from stream_ops.topology.code_scope import CodeScope
from stream_ops.topology.plan_code import bind_plan, plan_references

AGGS = """\
from dataclasses import dataclass

from stream_ops.operators import CombinerAggregator, ReducerAggregator

ORIGIN = {origin!r}


class Longest(CombinerAggregator):
    value_type_name = "long"

    def init(self, record):
        return len(record["word"])

    def combine(self, a, b):
        return max(a, b)

    def zero(self):
        return 0


@dataclass(frozen=True)
class AtLeast(CombinerAggregator):
    field: str
    floor: int = 0
    value_type_name = "long"

    def init(self, record):
        return max(record[self.field], self.floor)

    def combine(self, a, b):
        return a + b

    def zero(self):
        return 0


class Words(CombinerAggregator):
    value_type_name = "string"

    def init(self, record):
        return [record["word"]]

    def combine(self, a, b):
        return sorted({{*a, *b}})

    def zero(self):
        return []


class InOrder(ReducerAggregator):
    def init(self):
        return []

    def reduce(self, state, record):
        return [*state, record["word"]]


def origin():
    return ORIGIN
"""


@pytest.fixture
def aggs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """``<unique package>.aggs`` written under tmp_path and importable from sys.path."""
    name = f"aggpkg_{uuid.uuid4().hex[:8]}"
    (tmp_path / "src" / name).mkdir(parents=True)
    (tmp_path / "src" / name / "__init__.py").write_text("")
    (tmp_path / "src" / name / "aggs.py").write_text(AGGS.format(origin="sys.path"))
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    module = __import__(f"{name}.aggs", fromlist=["aggs"])
    yield module
    for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[loaded]


def _archive(tmp_path: Path, package: str) -> CodeScope:
    """The same package as a verified code archive (marked ``archive``) a worker imports from."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(f"{package}/__init__.py", "")
        archive.writestr(f"{package}/aggs.py", AGGS.format(origin="archive"))
    data = buffer.getvalue()
    path = tmp_path / f"{package}-{uuid.uuid4().hex[:8]}.zip"
    path.write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    return CodeScope(digest=sha, code_sha256=sha, archive=str(path), file_name=path.name, modules=(package,))


def _through_json(spec: dict) -> dict:
    return json.loads(json.dumps(spec))


# --- plan descriptions -------------------------------------------------------------------------


@pytest.mark.parametrize("aggregator", [Count(), Sum("n"), Min("n"), Max("n")])
def test_builtins_round_trip_as_themselves(aggregator: CombinerAggregator) -> None:
    spec = aggregator.to_spec()
    assert spec["kind"] == type(aggregator).__name__
    assert aggregator_from_spec(_through_json(spec)) == aggregator


def test_an_unknown_kind_or_a_malformed_description_is_refused() -> None:
    with pytest.raises(TopologyDefinitionError, match="unknown aggregator kind 'Avg'"):
        aggregator_from_spec({"kind": "Avg"})
    with pytest.raises(TopologyDefinitionError, match="does not fit Sum"):
        aggregator_from_spec({"kind": "Sum"})
    with pytest.raises(TopologyDefinitionError, match="has no 'ref' naming a class"):
        aggregator_from_spec({"kind": "user"})


class Sum10(Sum):
    """A user subclass of a built-in: its own class, not Sum, must travel."""

    def init(self, record):
        return 10 * super().init(record)


def test_a_user_subclass_of_a_builtin_travels_as_a_user_class() -> None:
    spec = Sum10("n").to_spec()
    assert spec["kind"] == "user" and spec["ref"]["args"] == {"field": "n"}
    rebuilt = aggregator_from_spec(_through_json(spec))
    assert type(rebuilt) is Sum10 and rebuilt.init({"n": 2}) == 20


def test_a_user_combiner_from_a_package_round_trips_and_computes(aggs: ModuleType) -> None:
    spec = aggs.Longest().to_spec()
    assert spec == {"kind": "user", "ref": {"class": f"{aggs.__name__}:Longest", "args": None}}
    rebuilt = aggregator_from_spec(_through_json(spec))
    assert isinstance(rebuilt, aggs.Longest) and rebuilt.spark_function is None
    partial = rebuilt.combine(rebuilt.init({"word": "abc"}), rebuilt.init({"word": "hello"}))
    assert rebuilt.apply(None, partial) == 5 and rebuilt.apply(7, partial) == 7
    assert rebuilt.value_type({}) == "long"


def test_a_user_dataclass_combiner_keeps_its_arguments(aggs: ModuleType) -> None:
    spec = aggs.AtLeast("n", floor=3).to_spec()
    assert spec["ref"]["args"] == {"field": "n", "floor": 3}
    rebuilt = aggregator_from_spec(_through_json(spec))
    assert rebuilt == aggs.AtLeast("n", 3)
    assert rebuilt.combine(rebuilt.init({"n": 1}), rebuilt.init({"n": 5})) == 8


def test_a_user_reducer_round_trips_and_reduces_in_record_order(aggs: ModuleType) -> None:
    spec = aggs.InOrder().to_spec()
    assert spec["kind"] == "user" and spec["ref"]["class"] == f"{aggs.__name__}:InOrder"
    rebuilt = aggregator_from_spec(_through_json(spec))
    assert isinstance(rebuilt, ReducerCombiner) and isinstance(rebuilt.reducer, aggs.InOrder)
    assert rebuilt.spark_function is None and rebuilt.value_type({}) == "string" and rebuilt.state_type() == "string"
    # whole records travel, concatenated in order, and are reduced after the shuffle
    partial = rebuilt.combine(rebuilt.init({"word": "b"}), rebuilt.init({"word": "a"}))
    assert json.loads(partial) == [{"word": "b"}, {"word": "a"}]
    assert rebuilt.apply(None, partial) == ["b", "a"]
    assert rebuilt.apply(["z"], rebuilt.init({"word": "c"})) == ["z", "c"]


def test_a_user_combiner_declared_string_travels_as_json(aggs: ModuleType) -> None:
    rebuilt = aggregator_from_spec(_through_json(aggs.Words().to_spec()))
    assert isinstance(rebuilt, JsonCombiner) and isinstance(rebuilt.combiner, aggs.Words)
    partial = rebuilt.combine(rebuilt.init({"word": "b"}), rebuilt.init({"word": "a"}))
    assert isinstance(partial, str) and json.loads(partial) == ["a", "b"]
    assert rebuilt.apply(None, partial) == ["a", "b"]  # the state keeps the decoded value
    assert rebuilt.apply(["c"], partial) == ["a", "b", "c"]
    assert rebuilt.value_type({}) == "string" and rebuilt.to_spec() == aggs.Words().to_spec()


def test_a_user_aggregator_resolves_in_the_code_scope(aggs: ModuleType, tmp_path: Path) -> None:
    package = aggs.__name__.partition(".")[0]
    scope = _archive(tmp_path, package)
    spec = _through_json(aggs.Longest().to_spec())
    from_archive = aggregator_from_spec(spec, scope=scope)
    assert sys.modules[type(from_archive).__module__].ORIGIN == "archive"
    assert from_archive.combine(from_archive.init({"word": "abcd"}), 1) == 4
    reducer = aggregator_from_spec({"kind": "user", "ref": {**spec["ref"], "class": f"{package}.aggs:InOrder"}}, scope)
    assert isinstance(reducer, ReducerCombiner) and reducer.apply(None, reducer.init({"word": "x"})) == ["x"]
    with pytest.raises(TopologyLoadError, match="neither in the submitted code archive"):
        aggregator_from_spec(Sum10("n").to_spec(), scope=scope)


def test_a_user_class_that_is_no_aggregator_is_refused(aggs: ModuleType) -> None:
    spec = {"kind": "user", "ref": {"class": "collections:OrderedDict", "args": None}}
    with pytest.raises(TopologyDefinitionError, match="not a CombinerAggregator or a ReducerAggregator"):
        aggregator_from_spec(spec)


def test_a_plan_ships_checks_and_binds_user_combiners_and_reducers(aggs: ModuleType, tmp_path: Path) -> None:
    t = Topology("contracts")
    words = t.source("s", FileTopic(tmp_path / "in", 1), schema={"word": "string"})
    words.group_by("word").persistent_aggregate(aggs.Longest(), out="longest", state=OpaqueMapState)
    words.persistent_aggregate(aggs.InOrder(), out="seen", state=OpaqueMapState, name="seen")
    plan = build_plan(t)
    refs = {r.ref for r in plan_references(plan)}
    assert {f"{aggs.__name__}:Longest", f"{aggs.__name__}:InOrder"} <= refs
    scope = _archive(tmp_path, aggs.__name__.partition(".")[0])
    bound = bind_plan(plan, scope)
    for index in (1, 2):
        assert bound.stage(index).state.aggregator["ref"]["code"] == scope


# --- contract checks ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Ok(CombinerAggregator):
    """A valid combiner."""

    value_type_name = "long"

    def init(self, record):
        return 1

    def combine(self, a, b):
        return a + b

    def zero(self):
        return 0


class ZeroRaises(Ok):
    def zero(self):
        raise RuntimeError("no zero")


class NoneZero(Ok):
    def zero(self):
        return None

    def combine(self, a, b):
        return a + b  # None + None


class ListZero(Ok):
    def zero(self):
        return []


class BadType(Ok):
    value_type_name = "bigint"


class BadSparkFunction(Ok):
    spark_function = "collect_list"


class InitRaises(ReducerAggregator):
    def init(self):
        raise ValueError("no state")

    def reduce(self, state, record):
        return state


class Half(CombinerAggregator):
    """Overrides init only; its abstract methods are cleared so that it instantiates."""

    def init(self, record):
        return 1


Half.__abstractmethods__ = frozenset()


class Duck:
    """Has the methods, but is no CombinerAggregator."""

    def init(self, record):
        return 1

    def combine(self, a, b):
        return a + b

    def zero(self):
        return 0


@pytest.mark.parametrize(
    ("aggregator", "message"),
    [
        (len, "is not an aggregator"),
        (Duck(), r"is not an aggregator; .*subclass of stream_ops.operators.CombinerAggregator"),
        (Ok, r"pass an instance, Ok\(\), not the class"),
        (Half(), "Half does not override combine, zero of CombinerAggregator"),
        (ZeroRaises(), r"ZeroRaises.zero\(\) raises RuntimeError: no zero"),
        (NoneZero(), r"NoneZero.combine\(zero\(\), zero\(\)\) raises TypeError: .*neutral value of combine"),
        (ListZero(), r"ListZero.zero\(\) is \[\], which does not fit its value type 'long'.*'string'"),
        (BadType(), r"BadType.value_type_name is 'bigint'; use one of"),
        (BadSparkFunction(), r"BadSparkFunction.spark_function is 'collect_list'"),
        (InitRaises(), r"InitRaises.init\(\) raises ValueError: no state"),
    ],
)
def test_check_aggregator_names_the_broken_contract(aggregator: object, message: str) -> None:
    with pytest.raises(TopologyDefinitionError, match=rf"^agg on stream 's': .*{message}"):
        check_aggregator(aggregator, "agg on stream 's'")


def test_check_aggregator_refuses_what_a_worker_cannot_rebuild() -> None:
    class Local(Ok):
        pass

    with pytest.raises(TopologyDefinitionError, match="lambda or nested function"):
        check_aggregator(Local(), "agg")


@pytest.mark.parametrize("aggregator", [Count(), Sum("n"), Min("n"), Max("n"), Ok(), Sum10("n")])
def test_valid_aggregators_pass_the_checks(aggregator: CombinerAggregator) -> None:
    check_aggregator(aggregator, "agg")
    assert as_combiner(aggregator, "agg") is aggregator


def test_user_aggregators_combine_in_python_unless_they_name_a_spark_function(aggs: ModuleType) -> None:
    assert CombinerAggregator.spark_function is None
    for user in (aggs.Longest(), aggs.AtLeast("n"), aggs.Words(), Ok()):
        assert user.spark_function is None
    assert as_combiner(aggs.InOrder(), "agg").spark_function is None
    assert (Count.spark_function, Sum.spark_function, Min.spark_function, Max.spark_function) == ("sum", "sum", "min", "max")


def test_value_types_default_to_double_for_combiners_and_string_for_reducer_states(aggs: ModuleType) -> None:
    assert Ok().value_type({}) == "long"
    assert NoneZero.value_type_name == "long" and Half().value_type({"x": "long"}) == "double"
    assert as_combiner(aggs.InOrder(), "agg").state_type() == "string"


# --- global (ungrouped) aggregates -------------------------------------------------------------


def test_init_and_combine_need_no_grouping_fields(aggs: ModuleType) -> None:
    record = {"n": 2, "word": "hi"}  # a global aggregate's records: no key fields at all
    for aggregator, expected in [
        (Count(), 2),
        (Sum("n"), 4),
        (Max("n"), 2),
        (aggs.Longest(), 2),
        (as_combiner(aggs.InOrder(), "agg"), ["hi", "hi"]),
    ]:
        partial = aggregator.combine(aggregator.init(record), aggregator.init(record))
        assert aggregator.apply(None, partial) == expected
