"""Invalid topology definitions fail at definition time with a message naming the problem."""

from __future__ import annotations

import pytest

from stream_ops import Count, FileTopic, OpaqueMapState, Sum, Topology, TransactionalMapState
from stream_ops.dsl import build_plan
from stream_ops.errors import TopicError, TopologyDefinitionError
from stream_ops.examples.wordcount import build_wordcount, split


def keep_long(record: dict) -> bool:
    return len(record["word"]) > 3


def _sentences(topology: Topology, tmp_path, queues: int = 2):
    return topology.source("sentences", FileTopic(tmp_path / "in", queues=queues), schema={"sentence": "string"})


def test_unknown_field_in_each_names_the_field(tmp_path):
    t = Topology("wc")
    with pytest.raises(TopologyDefinitionError, match="unknown field 'sentense'"):
        _sentences(t, tmp_path).each(split, out="word", fields=["sentense"])


def test_unknown_group_by_field(tmp_path):
    t = Topology("wc")
    words = _sentences(t, tmp_path).each(split, out="word", fields=["sentence"])
    with pytest.raises(TopologyDefinitionError, match="unknown field 'wrd'"):
        words.group_by("wrd")


def test_unknown_sum_field(tmp_path):
    t = Topology("wc")
    grouped = _sentences(t, tmp_path).each(split, out="word", fields=["sentence"]).group_by("word")
    with pytest.raises(TopologyDefinitionError, match="unknown field 'amount'"):
        grouped.persistent_aggregate(Sum("amount"), out="total", state=OpaqueMapState)


def test_aggregate_without_group_by_is_one_global_key_in_one_task(tmp_path):
    t = Topology("wc")
    words = _sentences(t, tmp_path).each(split, out="word", fields=["sentence"])
    total = words.persistent_aggregate(Count(), out="words", state=OpaqueMapState)
    t.query("total", total)
    per_batch = words.aggregate(Count(), out="n")
    per_batch.print()
    plan = build_plan(t)
    keyed, batches = plan.stage(1), plan.stage(2)
    assert (keyed.kind, keyed.queues, keyed.state.key_fields, keyed.fields) == ("keyed", 1, (), {"words": "long"})
    assert (batches.kind, batches.queues, batches.keeps_state) == ("aggregate", 1, False)
    assert batches.batch_aggregate.value_field == "n" and batches.input_fields == {"key": "string", "value": "long"}
    assert plan.queries["total"].key_fields == ()
    with pytest.raises(TopologyDefinitionError, match="is not an aggregator"):
        words.aggregate(len, out="n2")


def test_zero_queues_in_topic_and_group_by(tmp_path):
    with pytest.raises(TopicError, match="queues must be a positive integer"):
        FileTopic(tmp_path / "in", queues=0)
    t = Topology("wc")
    words = _sentences(t, tmp_path).each(split, out="word", fields=["sentence"])
    with pytest.raises(TopologyDefinitionError, match="queues must be a positive integer"):
        words.group_by("word", queues=0)


def test_duplicate_names(tmp_path):
    t = Topology("wc")
    _sentences(t, tmp_path)
    with pytest.raises(TopologyDefinitionError, match="source 'sentences' is declared twice"):
        _sentences(t, tmp_path)
    t2 = build_wordcount(tmp_path / "in")
    handle = next(iter(t2.queries.values()))
    with pytest.raises(TopologyDefinitionError, match="query 'words' is declared twice"):
        t2.query("words", handle)


def test_duplicate_state_name(tmp_path):
    t = Topology("wc")
    _sentences(t, tmp_path).each(split, out="word", fields=["sentence"]).group_by("word").persistent_aggregate(
        Count(), out="count", state=OpaqueMapState
    )
    other = t.source("more", FileTopic(tmp_path / "more", 1), schema={"sentence": "string"})
    with pytest.raises(TopologyDefinitionError, match="state 'count' is declared twice"):
        other.each(split, out="word", fields=["sentence"]).group_by("word").persistent_aggregate(
            Count(), out="count", state=TransactionalMapState
        )


def test_lambda_is_not_importable(tmp_path):
    t = Topology("wc")
    with pytest.raises(TopologyDefinitionError, match="lambda or nested function"):
        _sentences(t, tmp_path).each(lambda s: s.split(), out="word", fields=["sentence"])


def test_nested_function_is_not_importable(tmp_path):
    def local_split(sentence: str):
        return sentence.split()

    t = Topology("wc")
    with pytest.raises(TopologyDefinitionError, match="cannot import"):
        _sentences(t, tmp_path).each(local_split, out="word", fields=["sentence"])


def test_function_from_main_is_rejected(tmp_path):
    def fake():
        return []

    fake.__module__ = "__main__"
    fake.__qualname__ = "fake"
    t = Topology("wc")
    with pytest.raises(TopologyDefinitionError, match="__main__"):
        _sentences(t, tmp_path).each(fake, out="word", fields=["sentence"])


def test_bad_state_kind_and_names(tmp_path):
    t = Topology("wc")
    grouped = _sentences(t, tmp_path).each(split, out="word", fields=["sentence"]).group_by("word")
    with pytest.raises(TopologyDefinitionError, match="not a state kind"):
        grouped.persistent_aggregate(Count(), out="count", state=dict)
    with pytest.raises(TopologyDefinitionError, match="topology name"):
        Topology("bad name!")
    with pytest.raises(TopologyDefinitionError, match="unsupported type .varchar."):
        Topology("x").source("s", FileTopic(tmp_path / "x"), schema={"a": "varchar"})


def test_output_field_clash(tmp_path):
    t = Topology("wc")
    sentences = _sentences(t, tmp_path)
    with pytest.raises(TopologyDefinitionError, match="already exist"):
        sentences.each(split, out="sentence", fields=["sentence"])


def test_stream_without_state_fails_at_plan_time(tmp_path):
    t = Topology("wc")
    _sentences(t, tmp_path).each(split, out="word", fields=["sentence"])
    with pytest.raises(
        TopologyDefinitionError,
        match=r"after each\(stream_ops.examples.wordcount:split\) in stage 'sentences' ends without a consumer",
    ):
        build_plan(t)
    with pytest.raises(TopologyDefinitionError, match="has no source"):
        build_plan(Topology("empty"))
