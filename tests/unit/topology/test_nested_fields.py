"""Nested fields (``user.id``) wherever fields are accepted: checked at definition, read at run time."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from stream_ops import Count, FileTopic, OpaqueMapState, Sum, Topology
from stream_ops.compute.stage_function import OutputPlan, stage_rows
from stream_ops.dsl.build_plan import build_plan
from stream_ops.errors import TopologyDefinitionError
from stream_ops.helpers.field_paths import path_type, value_at, value_or_none
from stream_ops.operators import JoinBolt

SCHEMA = {"user": "struct<id:long,name:string,address:struct<city:string>>", "tags": "map<string,string>", "n": "long"}


def _source(t: Topology, tmp_path, name: str = "events"):
    return t.source(name, FileTopic(tmp_path / name, 1), schema=SCHEMA)


def test_paths_into_structs_and_maps_have_the_members_types():
    assert path_type(SCHEMA, "user.id", "x") == "long"
    assert path_type(SCHEMA, "user.address.city", "x") == "string"
    assert path_type(SCHEMA, "tags.colour", "x") == "string"
    with pytest.raises(TopologyDefinitionError, match="has no member 'age'"):
        path_type(SCHEMA, "user.age", "x")
    with pytest.raises(TopologyDefinitionError, match="steps into 'n', a long field"):
        path_type(SCHEMA, "n.x", "x")
    with pytest.raises(TopologyDefinitionError, match="unknown field 'who.id'"):
        path_type(SCHEMA, "who.id", "x")


def test_value_at_walks_mappings_and_prefers_a_dotted_top_level_name():
    record = {"user": {"id": 7, "address": None}, "a.b": 1}
    assert value_at(record, "user.id") == 7
    assert value_at(record, "user.address.city") is None
    assert value_at(record, "a.b") == 1
    with pytest.raises(KeyError):
        value_at(record, "missing")
    assert value_or_none(record, "missing") is None


def test_group_by_join_and_sinks_accept_nested_fields(tmp_path):
    t = Topology("nested")
    events = _source(t, tmp_path)
    counts = events.group_by("user.id").persistent_aggregate(Count(), out="count", state=OpaqueMapState)
    events.group_by("user.address.city").persistent_aggregate(Sum("n"), out="total", state=OpaqueMapState)
    events.to_parquet(tmp_path / "out", partition_by=["user.address.city"])
    orders = t.source("orders", FileTopic(tmp_path / "orders", 1), schema={"uid": "long", "amount": "double"})
    bolt = JoinBolt("events", "user.id").join("orders", "uid", "events").select("user.id, user.name, amount")
    joined = t.join(bolt.with_tumbling_window(count=2), events=events, orders=orders)
    assert joined._fields == {"user.id": "long", "user.name": "string", "amount": "double"}
    joined.print()
    counts.new_values().print(name="changes")
    plan = build_plan(t)
    assert next(s for s in plan.stages if s.name == "count").fields == {"user.id": "long", "count": "long"}
    with pytest.raises(TopologyDefinitionError, match="steps into 'n', a long field"):
        events.group_by("n.x")


def test_a_source_stage_groups_by_a_nested_field_without_dead_letters():
    run = stage_rows((), [OutputPlan(0, -1, ("user.id",), Count().to_spec())], "typed", "long")
    batch = pa.RecordBatch.from_pylist(
        [
            {"user": {"id": 1, "name": "a"}, "_corrupt_record": None},
            {"user": {"id": 1, "name": "b"}, "_corrupt_record": None},
            {"user": {"id": 2, "name": "c"}, "_corrupt_record": None},
        ]
    )
    rows = next(iter(run(iter([batch])))).to_pylist()
    assert {r["key"]: r["value"] for r in rows if r["key"] is not None} == {json.dumps([1]): 2, json.dumps([2]): 1}
    assert [r for r in rows if r["dead"] is not None] == []
