"""Plans of DAG topologies: fan-out, merge, sinks, and the definition mistakes they refuse."""

from __future__ import annotations

import pytest

from stream_ops import Count, FileTopic, OpaqueMapState, Topology
from stream_ops.dsl.build_plan import build_plan
from stream_ops.errors import TopologyDefinitionError
from stream_ops.examples.wordcount import split
from stream_ops.topology.plan import INPUT, Plan, RecordsSpec, ShuffleSpec, SinkSpec


def is_long(sentence: str) -> bool:
    return len(sentence) > 10


def upper(record: dict) -> dict:
    return {"sentence": record["sentence"].upper()}


def write_rows(txid, records, partition):
    """A sink function of three parameters."""


def write_two(txid, records):
    """A sink function of two parameters."""


def _source(t: Topology, tmp_path, name: str = "sentences", queues: int = 2):
    return t.source(name, FileTopic(tmp_path / name, queues=queues), schema={"sentence": "string"})


def test_fan_out_keeps_one_stage_with_an_operation_tree_and_two_outputs(tmp_path):
    t = Topology("fan")
    sentences = _source(t, tmp_path)
    words = sentences.each(split, out="word", fields=["sentence"])
    words.group_by("word").persistent_aggregate(Count(), out="count", state=OpaqueMapState)
    sentences.filter(is_long, fields=["sentence"]).to_parquet(tmp_path / "long", name="long")
    plan = build_plan(t)
    source = plan.stage(0)
    assert [op.kind for op in source.operations] == ["each", "filter"]
    assert [source.input_of(i) for i in range(2)] == [INPUT, INPUT]  # both read the source records
    shuffle, sink = source.outputs
    assert isinstance(shuffle, ShuffleSpec) and source.tap_of(shuffle) == 0 and shuffle.to_stage == 1
    assert isinstance(sink, SinkSpec) and sink.format == "parquet" and source.tap_of(sink) == 1
    assert sink.fields == {"sentence": "string"} and sink.path == str(tmp_path / "long")
    assert Plan.from_json(plan.to_json()) == plan


def test_merge_feeds_one_keyed_stage_from_two_sources_without_a_stage_of_its_own(tmp_path):
    t = Topology("merged")
    a = _source(t, tmp_path, "a")
    b = _source(t, tmp_path, "b", queues=1).map(upper, fields=None)
    merged = t.merge(a, b).each(split, out="word", fields=["sentence"])
    merged.group_by("word").persistent_aggregate(Count(), out="count", state=OpaqueMapState)
    plan = build_plan(t)
    assert [s.name for s in plan.stages] == ["a", "b", "count"]
    assert plan.stage(2).from_stages == (0, 1)
    assert plan.stage(0).downstream == (2,) and plan.stage(1).downstream == (2,)
    # the merged stream's each runs in both stages, after b's map
    assert [op.kind for op in plan.stage(1).operations] == ["map", "each"]
    assert plan.stage(1).input_of(1) == 0


def test_merge_refuses_streams_with_other_fields_or_the_same_stream_twice(tmp_path):
    t = Topology("bad")
    a = _source(t, tmp_path, "a")
    words = a.each(split, out="word", fields=["sentence"])
    with pytest.raises(TopologyDefinitionError, match="same fields to merge"):
        t.merge(a, words)
    with pytest.raises(TopologyDefinitionError, match="merged twice"):
        t.merge(a, a)
    with pytest.raises(TopologyDefinitionError, match="at least two"):
        t.merge(a)


def test_a_branch_without_a_consumer_names_where_it_ends(tmp_path):
    t = Topology("dangling")
    sentences = _source(t, tmp_path)
    sentences.each(split, out="word", fields=["sentence"]).print()
    sentences.filter(is_long, fields=["sentence"])
    with pytest.raises(TopologyDefinitionError, match=r"after filter\(.*is_long\) in stage 'sentences' ends without a consumer"):
        build_plan(t)


def test_sinks_on_a_grouped_stream_and_duplicate_sink_names_are_refused(tmp_path):
    t = Topology("sinks")
    sentences = _source(t, tmp_path)
    with pytest.raises(TopologyDefinitionError, match="a grouped stream only feeds persistent_aggregate"):
        sentences.group_by("sentence").to_parquet(tmp_path / "x")
    with pytest.raises(TopologyDefinitionError, match="a grouped stream only feeds"):
        sentences.group_by("sentence").print()
    sentences.print(name="out")
    with pytest.raises(TopologyDefinitionError, match="already has a sink named 'out'"):
        sentences.to_parquet(tmp_path / "x", name="out")
    with pytest.raises(TopologyDefinitionError, match="unknown field 'day'"):
        sentences.to_parquet(tmp_path / "y", partition_by=["day"])
    with pytest.raises(TopologyDefinitionError, match="names every field"):
        sentences.to_parquet(tmp_path / "y", partition_by=["sentence"])
    with pytest.raises(TopologyDefinitionError, match="must be a FileTopic"):
        sentences.to_topic(str(tmp_path / "topic"))


def test_a_sink_function_of_a_stage_with_several_tasks_must_take_the_partition(tmp_path):
    t = Topology("fn")
    sentences = _source(t, tmp_path, queues=2)
    with pytest.raises(TopologyDefinitionError, match="take a third parameter, partition"):
        sentences.sink(write_two)
    sentences.sink(write_rows)
    (sink,) = build_plan(t).stage(0).outputs
    assert isinstance(sink, SinkSpec) and sink.arity == 3 and sink.function and sink.function.endswith(":write_rows")
    single = Topology("single")
    _source(single, tmp_path, "one", queues=1).sink(write_two)
    assert build_plan(single).stage(0).outputs[0].arity == 2  # type: ignore[union-attr]


def test_a_plan_whose_stages_form_a_cycle_is_refused_naming_them(tmp_path):
    t = Topology("cyc")
    _source(t, tmp_path).partition_by("sentence", name="by-sentence").print()
    plan = build_plan(t)
    data = plan.model_dump()
    # stage 1 shuffles back into stage 0: a hand-edited plan
    data["stages"][1]["outputs"] = [
        RecordsSpec(tap=INPUT, to_stage=0, queues=2, key_fields=("sentence",), stream="x").model_dump()
    ]
    with pytest.raises(TopologyDefinitionError, match="form a cycle: sentences -> by-sentence -> sentences"):
        Plan.model_validate(data)
    data["stages"][1]["outputs"] = [RecordsSpec(tap=5, to_stage=0, queues=2, key_fields=(), stream="x").model_dump()]
    with pytest.raises(TopologyDefinitionError, match="taps operation 5, which is not there"):
        Plan.model_validate(data)


def test_new_values_of_an_aggregate_run_in_its_keyed_stage_and_can_be_aggregated_again(tmp_path):
    t = Topology("chained")
    counts = (
        _source(t, tmp_path)
        .each(split, out="word", fields=["sentence"])
        .group_by("word")
        .persistent_aggregate(Count(), out="count", state=OpaqueMapState)
    )
    changed = counts.new_values()
    assert changed.fields == ("word", "count")
    changed.print(name="changes")
    changed.group_by("count").persistent_aggregate(Count(), out="words", state=OpaqueMapState, name="histogram")
    plan = build_plan(t)
    keyed = plan.stage(1)
    assert [o.kind for o in keyed.outputs] == ["sink", "partials"]
    assert all(keyed.tap_of(o) == INPUT for o in keyed.outputs)
    assert plan.stage(2).name == "histogram" and plan.stage(2).from_stages == (1,)


def test_new_values_of_a_partition_persist_need_its_emitted_fields(tmp_path):
    from stream_ops.examples.wordcount_db import WordCountDB, WordCountUpdater

    t = Topology("persisted")
    words = _source(t, tmp_path).each(split, out="word", fields=["sentence"]).partition_by("word")
    plain = words.partition_persist(WordCountDB(str(tmp_path / "db")), ["word"], WordCountUpdater, name="plain")
    with pytest.raises(
        TopologyDefinitionError, match=r"declare the fields its updater emits with partition_persist\(..., out=...\)"
    ):
        plain.new_values()
    t2 = Topology("persisted2")
    words2 = _source(t2, tmp_path).each(split, out="word", fields=["sentence"]).partition_by("word")
    state = words2.partition_persist(
        WordCountDB(str(tmp_path / "db")), ["word"], WordCountUpdater, name="db", out={"word": "string", "n": "long"}
    )
    values = state.new_values()
    assert values.fields == ("word", "n")
    assert state.new_values()._segment is values._segment  # one stage however often it is asked for
    values.print()
    plan = build_plan(t2)
    persisting = plan.stage(1)
    assert persisting.persist is not None and persisting.persist.emits is not None
    assert plan.stage(persisting.persist.emits.to_stage).name == "db-values"
    assert persisting.downstream == (2,)
