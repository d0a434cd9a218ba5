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


def short_word(word: str) -> bool:
    if word == "boom":
        raise ValueError("no short booms")
    return len(word) < 4


def test_a_tree_gives_each_tap_its_records():
    each = _op("each", split_words, ("sentence",), {"word": "string"})
    ops = [
        each,
        _op("filter", not_the, ("word",), {}).model_copy(update={"input": 0}),
        _op("filter", short_word, ("word",), {}).model_copy(update={"input": 0}),
    ]
    pipeline = RecordPipeline(ops, taps=[1, 2, -1])
    by_tap, letter = pipeline.run_taps({"sentence": "the fox jumps"})
    assert letter is None
    assert [r["word"] for r in by_tap[1]] == ["fox", "jumps"]
    assert [r["word"] for r in by_tap[2]] == ["the", "fox"]
    assert by_tap[-1] == [{"sentence": "the fox jumps"}]


def test_a_failure_on_one_branch_dead_letters_the_record_for_every_branch():
    ops = [
        _op("each", split_words, ("sentence",), {"word": "string"}),
        _op("filter", short_word, ("word",), {}).model_copy(update={"input": 0}),
    ]
    by_tap, letter = RecordPipeline(ops, taps=[0, 1]).run_taps({"sentence": "a boom"})
    assert by_tap == {}
    assert letter is not None and letter.record == {"sentence": "a boom"} and "no short booms" in letter.error


class Row(dict):
    """A mapping that is not a plain dict: outputs of this type take the checked path."""


def mixed_outputs(sentence: str):
    # a plain value, a one-field mapping, a mapping subclass, a tuple (one value for one field)
    return ("a", {"word": "b"}, Row(word="c"), ("d", 1))


def wrong_mapping(sentence: str):
    return [{"other": "x"}]


def one_string(sentence: str):
    return "not a list of outputs"


def as_set(sentence: str):
    return {sentence}


def missing_field_peek(record: dict) -> None:
    raise AssertionError("peek must not run when its field is missing")


def test_one_field_outputs_keep_the_rules_of_as_fields():
    each = RecordPipeline([_op("each", mixed_outputs, ("sentence",), {"word": "string"})])
    out, dead = each.run({"sentence": "s"})
    assert dead is None
    assert [o["word"] for o in out] == ["a", "b", "c", ("d", 1)]
    mapped = RecordPipeline([_op("map", mixed_outputs, ("sentence",), {"word": "string"})])
    assert mapped.run({"sentence": "s"})[0] == [{"word": ("a", {"word": "b"}, Row(word="c"), ("d", 1))}]
    assert RecordPipeline([_op("each", as_set, ("sentence",), {"word": "string"})]).run({"sentence": "s"})[0] == [
        {"sentence": "s", "word": "s"}
    ]


def test_outputs_that_do_not_fit_are_dead_letters():
    for fn, reason in ((wrong_mapping, "expected ['word']"), (one_string, "must return an iterable")):
        _, dead = RecordPipeline([_op("each", fn, ("sentence",), {"word": "string"})]).run({"sentence": "s"})
        assert dead is not None and reason in dead.error, fn.__name__
    _, dead = RecordPipeline([_op("peek", missing_field_peek, ("nope",), {})]).run({"sentence": "s"})
    assert dead is not None and "KeyError" in dead.error


def words_then_lengths(word: str):
    return len(word)


def test_field_values_give_the_field_of_what_run_gives():
    """The counting shortcut: a chain's values of its last one-field output, records not built."""
    chains = {
        "each": [_op("each", mixed_outputs, ("sentence",), {"word": "string"})],
        "map": [_op("map", mixed_outputs, ("sentence",), {"word": "string"})],
        "each, set": [_op("each", as_set, ("sentence",), {"word": "string"})],
        "each then map": [
            _op("each", split_words, ("sentence",), {"word": "string"}),
            _op("map", words_then_lengths, ("word",), {"size": "long"}),
        ],
        "fails": [_op("each", explode, ("sentence",), {"word": "string"})],
        "wrong mapping": [_op("each", wrong_mapping, ("sentence",), {"word": "string"})],
        "not a list": [_op("each", one_string, ("sentence",), {"word": "string"})],
        "fails first": [
            _op("each", explode, ("sentence",), {"word": "string"}),
            _op("map", words_then_lengths, ("word",), {"size": "long"}),
        ],
    }
    for name, operations in chains.items():
        pipeline = RecordPipeline(operations)
        field = next(iter(operations[-1].out))
        values_of = pipeline.field_values(field)
        assert values_of is not None, name
        for record in ({"sentence": "a bb"}, {"sentence": ""}):
            outputs, letter = pipeline.run(dict(record))
            values, values_letter = values_of(dict(record))
            assert values == [out[field] for out in outputs], name
            assert (letter, values_letter) == (None, None) or letter == values_letter, name
    assert RecordPipeline(chains["fails"]).field_values("word")({"sentence": "x"})[1] is not None


def test_field_values_only_for_a_chain_ending_in_that_one_field():
    split_op = _op("each", split_words, ("sentence",), {"word": "string"})
    assert RecordPipeline([split_op]).field_values("sentence") is None  # not the field it emits
    assert RecordPipeline([_op("each", pairs, ("sentence",), {"word": "string", "n": "long"})]).field_values("word") is None
    assert RecordPipeline([split_op, _op("filter", not_the, ("word",), {})]).field_values("word") is None
    assert RecordPipeline([split_op], taps=[-1]).field_values("word") is None  # the input is read, not the end
    assert RecordPipeline([]).field_values("word") is None


def test_column_values_give_what_field_values_give_from_the_one_field_read():
    for operations in (
        [_op("each", mixed_outputs, ("sentence",), {"word": "string"})],
        [_op("map", mixed_outputs, ("sentence",), {"word": "string"})],
        [_op("each", wrong_mapping, ("sentence",), {"word": "string"})],
        [_op("each", one_string, ("sentence",), {"word": "string"})],
        [_op("each", explode, ("sentence",), {"word": "string"})],
    ):
        pipeline = RecordPipeline(operations)
        column = pipeline.column_values("word")
        assert column is not None and column.field == "sentence"
        values, letter = pipeline.field_values("word")({"sentence": "a bb", "n": 1})
        try:
            assert column.values_of("a bb") == values and letter is None
        except Exception as e:  # noqa: BLE001 - the same failure, as the same dead letter
            assert letter is not None and column.dead_letter({"sentence": "a bb", "n": 1}, e) == letter


def test_column_values_only_for_one_per_record_operation_reading_one_top_level_field():
    split_op = _op("each", split_words, ("sentence",), {"word": "string"})
    assert RecordPipeline([split_op, _op("map", words_then_lengths, ("word",), {"size": "long"})]).column_values("size") is None
    assert RecordPipeline([_op("each", split_words, None, {"word": "string"})]).column_values("word") is None
    assert RecordPipeline([_op("each", split_words, ("a.b",), {"word": "string"})]).column_values("word") is None
    assert RecordPipeline([_op("each", pairs, ("sentence", "n"), {"word": "string"})]).column_values("word") is None
    assert RecordPipeline([split_op]).column_values("sentence") is None
