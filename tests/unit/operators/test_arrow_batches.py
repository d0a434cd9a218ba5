"""map_batches' core: output conformance and the isolation of failing rows by halving."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from stream_ops import FileTopic, Topology
from stream_ops.errors import TopologyDefinitionError
from stream_ops.examples.wordcount import split, split_batch
from stream_ops.operators.arrow_batches import apply_isolating, arrow_schema, conform

WORDS = arrow_schema({"word": "string"})


def test_conform_selects_declared_columns_and_casts_safely():
    out = conform(pa.table({"extra": [1], "n": pa.array([7], pa.int32())}), arrow_schema({"n": "long"}))
    assert out.schema == arrow_schema({"n": "long"}) and out.to_pydict() == {"n": [7]}
    with pytest.raises(ValueError, match="missing the declared"):
        conform(pa.table({"x": [1]}), WORDS)
    with pytest.raises(ValueError, match="not a pyarrow.RecordBatch or Table"):
        conform([{"word": "a"}], WORDS)
    with pytest.raises(ValueError, match="do not fit"):
        conform(pa.table({"n": [1.5]}), arrow_schema({"n": "long"}))
    assert conform(pa.table({"word": pa.array([], pa.string())}), WORDS).num_rows == 0


def _explode_unless_bad(batch: pa.RecordBatch) -> pa.Table:
    sentences = batch.column("sentence").to_pylist()
    if any(s.startswith("bad") for s in sentences):
        raise ValueError("bad sentence")
    return split_batch(batch)


def test_failing_rows_are_isolated_and_every_other_row_counts_once():
    sentences = ["a b", "bad one", "c", "d e f", "bad two", "g"]
    out, dead = apply_isolating(_explode_unless_bad, pa.record_batch({"sentence": sentences}), WORDS, "ops:explode")
    words = [w for batch in out for w in batch.column("word").to_pylist()]
    assert words == ["a", "b", "c", "d", "e", "f", "g"]
    assert [d["record"]["sentence"] for d in dead] == ["bad one", "bad two"]
    assert dead[0]["error"] == "map_batches ops:explode: ValueError: bad sentence"


def test_a_function_that_returns_the_wrong_shape_dead_letters_its_rows():
    out, dead = apply_isolating(lambda b: pa.table({"nope": [1]}), pa.record_batch({"sentence": ["x"]}), WORDS, "f")
    assert out == [] and "missing the declared ['word']" in dead[0]["error"]


def test_the_arrow_split_equals_the_row_split():
    sentences = ["the cow jumped", "over the moon", ""]
    by_rows = [w for s in sentences for w in split(s)]
    by_batch = pc.cast(split_batch(pa.record_batch({"sentence": sentences})).column("word"), pa.string()).to_pylist()
    assert by_batch == by_rows


def test_map_batches_is_checked_at_definition_time(tmp_path):
    t = Topology("batches")
    lines = t.source("lines", FileTopic(tmp_path / "in", 1), schema={"sentence": "string"})
    words = lines.map_batches(split_batch, schema={"word": "string"})
    assert words._fields == {"word": "string"}
    with pytest.raises(TopologyDefinitionError, match="not scalar"):
        lines.map_batches(split_batch, schema={"doc": "struct<a:long>"})
    with pytest.raises(TopologyDefinitionError, match="must come first"):
        words.each(split, out="part", fields=["word"]).map_batches(split_batch, schema={"word": "string"})
    with pytest.raises(TopologyDefinitionError, match="reads a shuffle"):
        words.partition_by("word").map_batches(split_batch, schema={"word": "string"})
    fresh = Topology("again").source("lines", FileTopic(tmp_path / "in", 1), schema={"sentence": "string"})
    with pytest.raises(TopologyDefinitionError, match="Spark SQL operations run before map_batches"):
        fresh.map_batches(split_batch, schema={"word": "string"}).where("length(word) > 1")
