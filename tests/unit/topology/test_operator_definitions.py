"""Definition-time errors and plans of joins, processing elements and Trident state ops."""

from __future__ import annotations

import pytest

from stream_ops import Count, FileTopic, Min, OpaqueMapState, Topology
from stream_ops.dsl import build_plan
from stream_ops.errors import TopologyDefinitionError
from stream_ops.examples.counter_pe import WordCounterPE, build_counter
from stream_ops.examples.uuid_join import build_uuid_join
from stream_ops.examples.wordcount import split
from stream_ops.examples.wordcount_db import QueryWordCount, WordCountDB, WordCountUpdater, build_wordcount_db
from stream_ops.operators import JoinBolt, Trigger


def _two_sources(tmp_path):
    t = Topology("j")
    a = t.source("a", FileTopic(tmp_path / "a"), schema={"id": "string", "x": "long"})
    b = t.source("b", FileTopic(tmp_path / "b"), schema={"id": "string", "y": "long"})
    return t, a, b


def test_join_plan_routes_both_streams_by_their_join_field(tmp_path):
    plan = build_plan(build_uuid_join(tmp_path, queues=2))
    s1, s2, join, keyed = plan.stages
    assert (s1.outputs[0].to_stage, s1.outputs[0].stream, s1.outputs[0].key_fields) == (2, "spout1", ("uuid",))
    assert (s2.outputs[0].to_stage, s2.outputs[0].stream) == (2, "spout2")
    assert join.kind == "join" and join.from_stages == (0, 1) and join.keeps_state
    assert [o.kind for o in join.outputs] == ["partials"] and join.outputs[0].to_stage == 3
    assert keyed.state.name == "joined"


def test_join_errors_name_the_problem(tmp_path):
    t, a, b = _two_sources(tmp_path)
    unselected = JoinBolt("a", "id").join("b", "id", "a").with_tumbling_window(count=2)
    with pytest.raises(TopologyDefinitionError, match="select"):
        t.join(unselected, a=a, b=b)
    no_window = JoinBolt("a", "id").join("b", "id", "a").select("id, x, y")
    with pytest.raises(TopologyDefinitionError, match="with_tumbling_window"):
        t.join(no_window, a=a, b=b)
    bolt = JoinBolt("a", "id").join("b", "id", "a").select("id, x, y").with_tumbling_window(count=2)
    with pytest.raises(TopologyDefinitionError, match=r"joins streams \['a', 'b'\], but streams \['a'\]"):
        t.join(bolt, a=a)
    with pytest.raises(TopologyDefinitionError, match="expected a JoinBolt"):
        t.join(object(), a=a, b=b)
    wrong_field = JoinBolt("a", "uid").join("b", "id", "a").select("id").with_tumbling_window(count=2)
    with pytest.raises(TopologyDefinitionError, match="unknown field 'uid'"):
        t.join(wrong_field, a=a, b=b)


def test_joined_stream_must_be_kept(tmp_path):
    t, a, b = _two_sources(tmp_path)
    t.join(JoinBolt("a", "id").join("b", "id", "a").select("id, x, y").with_tumbling_window(count=2), a=a, b=b)
    with pytest.raises(TopologyDefinitionError, match="ends without"):
        build_plan(t)


def test_process_plan_and_errors(tmp_path):
    plan = build_plan(build_counter(tmp_path / "in", trigger=Trigger.count(2) | Trigger.every(5), ttl_seconds=60))
    pe = plan.stage(1)
    assert pe.kind == "process" and pe.process.key_field == "word" and pe.process.ttl_seconds == 60
    assert pe.process.trigger == {"every_events": 2, "every_seconds": 5}
    assert plan.stage(0).outputs[0].key_fields == ("word",)

    t = Topology("p")
    words = t.source("s", FileTopic(tmp_path / "s"), schema={"sentence": "string"}).each(split, out="word", fields=["sentence"])
    with pytest.raises(TopologyDefinitionError, match="not a ProcessingElement subclass"):
        words.process(dict, key="word", out="n")
    with pytest.raises(TopologyDefinitionError, match="unknown field 'wrd'"):
        words.process(WordCounterPE, key="wrd", out="n")
    with pytest.raises(TopologyDefinitionError, match="ttl_seconds"):
        words.process(WordCounterPE, key="word", out="n", ttl_seconds=0)
    with pytest.raises(TopologyDefinitionError, match="trigger"):
        words.process(WordCounterPE, key="word", out="n", trigger=3)


def test_persist_and_state_query_plan(tmp_path):
    plan = build_plan(build_wordcount_db(tmp_path, kind="opaque"))
    words = plan.stage(1)
    assert words.kind == "partition" and words.persist.name == "word_counts"
    assert words.persist.factory == {
        "class": "stream_ops.examples.wordcount_db:WordCountDB",
        "args": {"path": str(tmp_path / "db"), "kind": "opaque"},
    }
    questions = plan.stage(2)
    assert questions.operations[0].kind == "state_query" and questions.operations[0].query["state"] == "word_counts"
    assert plan.states == {"word_counts": 1, "answers": 3}


def test_state_query_needs_a_partitioned_persist_and_matching_fields(tmp_path):
    t = Topology("q")
    words = t.source("s", FileTopic(tmp_path / "s"), schema={"sentence": "string"}).each(split, out="word", fields=["sentence"])
    unpartitioned = words.partition_persist(WordCountDB(str(tmp_path / "db")), ["word"], WordCountUpdater())
    questions = t.source("q", FileTopic(tmp_path / "q"), schema={"word": "string"})
    with pytest.raises(TopologyDefinitionError, match="not partitioned by key"):
        questions.state_query(unpartitioned, ["word"], QueryWordCount(), out={"count": "long"})

    t2 = Topology("q2")
    counts = (
        t2.source("s", FileTopic(tmp_path / "s"), schema={"sentence": "string"})
        .each(split, out="word", fields=["sentence"])
        .group_by("word")
        .persistent_aggregate(Count(), out="count", state=OpaqueMapState)
    )
    asks = t2.source("q", FileTopic(tmp_path / "q"), schema={"word": "string", "other": "string"})
    with pytest.raises(TopologyDefinitionError, match="keyed by"):
        asks.state_query(counts, ["word", "other"], QueryWordCount(), out="n")


def test_factory_with_unserialisable_state_is_rejected(tmp_path):
    class Holder:
        pass

    class Stateful:
        def __init__(self):
            self.conn = Holder()

    t = Topology("x")
    words = t.source("s", FileTopic(tmp_path / "s"), schema={"word": "string"}).partition_by("word")
    with pytest.raises(TopologyDefinitionError):
        words.partition_persist(Stateful(), ["word"], WordCountUpdater())


def test_join_output_types_come_from_the_joined_streams_and_the_output_stream_is_named(tmp_path):
    t = Topology("typed")
    a = t.source("a", FileTopic(tmp_path / "a", 1), schema={"id": "long", "ts": "long", "name": "string"})
    b = t.source("b", FileTopic(tmp_path / "b", 1), schema={"id": "long", "amount": "double"})
    bolt = (
        JoinBolt("a", "id")
        .join("b", "id", "a")
        .select("a:id, ts, b:amount, name as who, a:name.first")
        .with_tumbling_window(count=2)
        .with_output_stream("orders")
    )
    joined = t.join(bolt, a=a, b=b)
    assert joined._fields == {"a:id": "long", "ts": "long", "b:amount": "double", "who": "string", "a:name.first": "string"}
    assert t.stream("orders") is joined and t.stream("a") is a
    with pytest.raises(TopologyDefinitionError, match="no stream named 'nope'"):
        t.stream("nope")
    again = JoinBolt("a", "id").join("b", "id", "a").select("a:id").with_tumbling_window(count=2).with_output_stream("orders")
    with pytest.raises(TopologyDefinitionError, match="output stream 'orders' is a name taken already"):
        t.join(again, a=a, b=b)
    # Min over a joined long compares numbers: the aggregate's value type is the field's
    joined.group_by("a:id").persistent_aggregate(Min("ts"), out="first", state=OpaqueMapState)
    assert build_plan(t).stage(3).state.value_type == "long"
