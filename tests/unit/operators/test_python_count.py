"""The Python path's count per key (a dict of key values) equals the general combine path."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from stream_ops.compute import stage_function
from stream_ops.compute.stage_function import OutputPlan, _python_count, stage_rows
from stream_ops.operators import Count
from stream_ops.operators.record_pipeline import RecordPipeline
from stream_ops.topology.plan import OperationSpec

RECORDS = [
    {"w": "a", "n": 1},
    {"w": "a", "n": 1.0},  # the key 1, as encode_key has it
    {"w": "b", "n": 2},
    {"w": ["x", 1], "n": 2},  # unhashable key values
    {"w": ["x", 1], "n": 2},
    {"n": 3},  # no key field: the record is a dead letter
]


class _MixedBatch:
    """The rows of a record batch whose fields have mixed types (what Arrow cannot hold)."""

    num_rows = len(RECORDS)

    def to_pylist(self) -> list[dict[str, Any]]:
        return [{**r, "_corrupt_record": None} for r in RECORDS]


def _run(key_fields: tuple[str, ...]) -> tuple[list[tuple[str, int]], list[str], int]:
    run = stage_rows((), [OutputPlan(0, -1, key_fields, Count().to_spec())], "typed", "long")
    out = pa.Table.from_batches(list(run(iter([_MixedBatch()])))).to_pylist()  # type: ignore[list-item]
    partials = sorted((r["key"], r["value"]) for r in out if r["key"] is not None)
    dead = [json.loads(r["dead"])["error"].split(":")[0] for r in out if r["dead"] is not None]
    return partials, dead, sum(r["inputs"] for r in out if r["inputs"] is not None)


@pytest.mark.parametrize("key_fields", [("w",), ("w", "n")])
def test_the_count_tally_equals_the_combine_path(monkeypatch, key_fields):
    assert _python_count([OutputPlan(0, -1, key_fields, Count().to_spec())], "typed") is not None
    tallied = _run(key_fields)
    monkeypatch.setattr(stage_function, "_python_count", lambda outputs, mode: None)
    assert tallied == _run(key_fields)
    assert tallied[1] == ["partials"] and tallied[2] == len(RECORDS)
    assert (r'["a",1]' if len(key_fields) == 2 else '["a"]', 2) in tallied[0]


def split_some(sentence: str) -> list[Any]:
    """Words, an unhashable value for "list", and an error for "boom"."""
    if sentence == "boom":
        raise ValueError("boom")
    return [["x", 1]] if sentence == "list" else sentence.split(" ")


SENTENCES = ("a b a", "boom", "list", "b", None, "list", "", "{broken")
"""``None`` makes ``split_some`` raise an AttributeError; "{broken" stands for a line that did not parse."""


def _run_each(*, sql_first: bool = False) -> tuple[list[tuple[str, int]], list[Any], int]:
    each = OperationSpec(kind="each", function=f"{__name__}:split_some", fields=("sentence",), out={"word": "string"})
    head = (
        OperationSpec(
            kind="select_expr", function="", fields=None, exprs=("sentence", "n"), out={"sentence": "string", "n": "long"}
        ),
    )
    run = stage_rows(
        (*head, each) if sql_first else (each,),
        [OutputPlan(0, 1 if sql_first else 0, ("word",), Count().to_spec())],
        "typed",
        "long",
    )
    rows = [
        {"sentence": None, "n": None, "_corrupt_record": s}
        if s == "{broken"
        else {"sentence": s, "n": i, "_corrupt_record": None}
        for i, s in enumerate(SENTENCES)
    ]
    batch = pa.RecordBatch.from_pylist(rows)
    out = pa.Table.from_batches(list(run(iter([batch])))).to_pylist()
    partials = sorted((r["key"], r["value"]) for r in out if r["key"] is not None)
    dead = [json.loads(r["dead"]) for r in out if r["dead"] is not None]
    return partials, dead, sum(r["inputs"] for r in out if r["inputs"] is not None)


@pytest.mark.parametrize("sql_first", [False, True], ids=["each", "select_expr then each"])
def test_counting_the_values_an_each_emits_equals_counting_its_records(monkeypatch, sql_first):
    columns: list[int] = []
    real_column_slots = stage_function._column_slots
    monkeypatch.setattr(stage_function, "_column_slots", lambda *a: columns.append(1) or real_column_slots(*a))
    by_column = _run_each(sql_first=sql_first)
    assert columns == [1], "the values were read from the input column"
    assert by_column[0] == [('[""]', 1), ('["a"]', 2), ('["b"]', 2), ('[["x",1]]', 2)]
    expected_letters = [
        ({"sentence": "boom", "n": 1}, "ValueError: boom"),
        ({"sentence": None, "n": 4}, "AttributeError"),
        ("{broken", "does not parse against the source schema"),
    ]
    assert len(by_column[1]) == len(expected_letters), by_column[1]
    for letter, (record, error) in zip(by_column[1], expected_letters, strict=True):
        assert letter["record"] == record and error in letter["error"], letter
    assert by_column[2] == len(SENTENCES)
    monkeypatch.setattr(RecordPipeline, "column_values", lambda self, field: None)
    assert _run_each(sql_first=sql_first) == by_column
    monkeypatch.setattr(RecordPipeline, "field_values", lambda self, field: None)
    assert _run_each(sql_first=sql_first) == by_column
    monkeypatch.setattr(stage_function, "_python_count", lambda outputs, mode: None)
    assert _run_each(sql_first=sql_first) == by_column
