"""The Python path's count per key (a dict of key values) equals the general combine path."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from stream_ops.operators import Count
from stream_ops.operators.record_pipeline import RecordPipeline
from stream_ops.spark import compiler
from stream_ops.spark.compiler import _OutputPlan, _python_count, _stage_rows
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
    run = _stage_rows((), [_OutputPlan(0, -1, key_fields, Count().to_spec())], "typed", "long")
    out = pa.Table.from_batches(list(run(iter([_MixedBatch()])))).to_pylist()  # type: ignore[list-item]
    partials = sorted((r["key"], r["value"]) for r in out if r["key"] is not None)
    dead = [json.loads(r["dead"])["error"].split(":")[0] for r in out if r["dead"] is not None]
    return partials, dead, sum(r["inputs"] for r in out if r["inputs"] is not None)


@pytest.mark.parametrize("key_fields", [("w",), ("w", "n")])
def test_the_count_tally_equals_the_combine_path(monkeypatch, key_fields):
    assert _python_count([_OutputPlan(0, -1, key_fields, Count().to_spec())], "typed") is not None
    tallied = _run(key_fields)
    monkeypatch.setattr(compiler, "_python_count", lambda outputs, mode: None)
    assert tallied == _run(key_fields)
    assert tallied[1] == ["partials"] and tallied[2] == len(RECORDS)
    assert (r'["a",1]' if len(key_fields) == 2 else '["a"]', 2) in tallied[0]


def split_some(sentence: str) -> list[Any]:
    """Words, an unhashable value for "list", and an error for "boom"."""
    if sentence == "boom":
        raise ValueError("boom")
    return [["x", 1]] if sentence == "list" else sentence.split(" ")


def _run_each() -> tuple[list[tuple[str, int]], list[str], int]:
    each = OperationSpec(kind="each", function=f"{__name__}:split_some", fields=("sentence",), out={"word": "string"})
    run = _stage_rows((each,), [_OutputPlan(0, 0, ("word",), Count().to_spec())], "typed", "long")
    batch = pa.RecordBatch.from_pylist([{"sentence": s} for s in ("a b a", "boom", "list", "b", "list", "")])
    out = pa.Table.from_batches(list(run(iter([batch])))).to_pylist()
    partials = sorted((r["key"], r["value"]) for r in out if r["key"] is not None)
    dead = [json.loads(r["dead"])["error"] for r in out if r["dead"] is not None]
    return partials, dead, sum(r["inputs"] for r in out if r["inputs"] is not None)


def test_counting_the_values_an_each_emits_equals_counting_its_records(monkeypatch):
    by_values = _run_each()
    assert by_values[0] == [('[""]', 1), ('["a"]', 2), ('["b"]', 2), ('[["x",1]]', 2)]
    assert len(by_values[1]) == 1 and "ValueError: boom" in by_values[1][0] and by_values[2] == 6
    monkeypatch.setattr(RecordPipeline, "field_values", lambda self, field: None)
    assert _run_each() == by_values
    monkeypatch.setattr(compiler, "_python_count", lambda outputs, mode: None)
    assert _run_each() == by_values
