"""The sink registry: a plan's sink format is a registered kind, which checks its spec."""

from __future__ import annotations

import json

import pytest

from stream_ops import FileTopic, Topology
from stream_ops.dsl.build_plan import build_plan
from stream_ops.errors import TopologyDefinitionError
from stream_ops.topology import sink_kinds as sink_kinds_module
from stream_ops.topology.plan import SinkSpec
from stream_ops.topology.sink_kinds import SinkContext, SinkKind, SinkWriter, register_sink_kind, sink_kinds


class _NoWriterKind(SinkKind):
    name = "nowhere"

    def writer(self, spec: SinkSpec, context: SinkContext) -> SinkWriter:
        raise AssertionError("never opened here")


def test_the_five_built_in_sinks_are_registered():
    assert [kind.name for kind in sink_kinds()] == ["parquet", "topic", "function", "print", "kafka"]


def test_a_format_nobody_registered_is_refused():
    with pytest.raises(TopologyDefinitionError, match="unknown sink kind 'csv'"):
        SinkSpec(name="s", format="csv", fields={"a": "string"})


def test_each_kind_refuses_a_spec_without_what_it_needs():
    with pytest.raises(TopologyDefinitionError, match="parquet sink 's': needs a path"):
        SinkSpec(name="s", format="parquet", fields={"a": "string"})
    with pytest.raises(TopologyDefinitionError, match="needs a path and a number of queues"):
        SinkSpec(name="s", format="topic", path="/t", fields={"a": "string"})
    with pytest.raises(TopologyDefinitionError, match="needs a function reference"):
        SinkSpec(name="s", format="function", fields={"a": "string"})
    with pytest.raises(TopologyDefinitionError, match="needs its Kafka options"):
        SinkSpec(name="s", format="kafka", fields={"a": "string"})


def test_a_registered_kinds_options_go_into_the_plan_and_empty_ones_stay_out(tmp_path, monkeypatch):
    monkeypatch.setattr(sink_kinds_module, "_KINDS", sink_kinds_module._KINDS.copy())  # registered for this test only
    register_sink_kind(_NoWriterKind())
    t = Topology("t")
    words = t.source("words", FileTopic(tmp_path / "in", 1), schema={"word": "string"})
    words.to_sink("nowhere", options={"level": 3}, name="n")
    words.print(name="p")
    sinks = {o["name"]: o for o in json.loads(build_plan(t).to_json())["stages"][0]["outputs"]}
    assert sinks["n"]["options"] == {"level": 3}
    assert "options" not in sinks["p"]


def test_to_sink_refuses_an_unknown_kind(tmp_path):
    words = Topology("t").source("words", FileTopic(tmp_path / "in", 1), schema={"word": "string"})
    with pytest.raises(TopologyDefinitionError, match="unknown sink kind 'nowhere'"):
        words.to_sink("nowhere")
