"""each/map/filter on single records; failures become dead letters, never exceptions."""

from __future__ import annotations

from stream_ops.operators.record_pipeline import RecordPipeline
from stream_ops.topology.plan import OperationSpec


def split_words(sentence: str):
    return sentence.split(" ")


def upper_record(record: dict) -> dict:
    return {"word": record["word"].upper()}


def not_the(word: str) -> bool:
    return word != "the"


def explode(sentence: str):
    raise ValueError("boom")


def pairs(sentence: str):
    return [(w, len(w)) for w in sentence.split()]


def _op(kind, fn, fields, out):
    return OperationSpec(kind=kind, function=f"{__name__}:{fn.__name__}", fields=fields, out=out)


def test_each_filter_map_chain():
    pipeline = RecordPipeline(
        [
            _op("each", split_words, ("sentence",), {"word": "string"}),
            _op("filter", not_the, ("word",), {}),
            _op("map", upper_record, None, {"word": "string"}),
        ]
    )
    out, dead = pipeline.run({"sentence": "the cow jumped"})
    assert dead is None
    assert out == [{"word": "COW"}, {"word": "JUMPED"}]


def test_each_keeps_input_fields_and_supports_several_outputs():
    pipeline = RecordPipeline([_op("each", pairs, ("sentence",), {"word": "string", "n": "long"})])
    out, _ = pipeline.run({"sentence": "a bb"})
    assert out == [{"sentence": "a bb", "word": "a", "n": 1}, {"sentence": "a bb", "word": "bb", "n": 2}]


def test_user_error_becomes_dead_letter_with_reason():
    pipeline = RecordPipeline([_op("each", explode, ("sentence",), {"word": "string"})])
    outputs, dead = pipeline.run_all([{"sentence": "x"}, {"sentence": "y"}])
    assert outputs == []
    assert [d.record for d in dead] == [{"sentence": "x"}, {"sentence": "y"}]
    assert "ValueError: boom" in dead[0].error and "explode" in dead[0].error


def test_wrong_output_shape_is_a_dead_letter():
    pipeline = RecordPipeline([_op("map", upper_record, None, {"word": "string", "extra": "long"})])
    _, dead = pipeline.run({"word": "x"})
    assert dead is not None and "expected" in dead.error
