"""compact_json_lines: the text json.dumps gives, a batch at a time."""

from __future__ import annotations

import datetime
import decimal
import json
import math

import pytest

from stream_ops.helpers.compact_json import compact_json_lines

AWKWARD = [
    {"word": "été", "count": 3},
    {"emoji": '😀 \u2028 \u2029 \x00 \t \n \r " \\ /', "n": -0.0},
    {"floats": [0.1, 1e300, 5e-324, 1 / 3, float("nan"), float("inf"), -float("inf")]},
    {"nested": {"a": [1, {"b": None}], "c": (True, False)}, "big": 2**70},
    {1: "int key", 2.5: "float key", None: "none key", False: "bool key"},
    {"same": 1, 1: "clash after stringification"},
    [],
    "plain text",
    None,
    12,
    {},
]


@pytest.mark.parametrize("record", AWKWARD, ids=range(len(AWKWARD)))
def test_each_line_is_what_json_dumps_gives(record):
    assert compact_json_lines([record]) == [json.dumps(record, separators=(",", ":"), ensure_ascii=False)]


def test_a_batch_is_the_lines_of_its_records_in_order():
    assert compact_json_lines(AWKWARD) == [json.dumps(r, separators=(",", ":"), ensure_ascii=False) for r in AWKWARD]
    assert compact_json_lines([]) == []


def test_default_converts_what_json_cannot_encode_as_json_dumps_does():
    record = {"when": datetime.date(2026, 11, 29), "amount": decimal.Decimal("1.10"), "raw": b"\x00\xff", "set": {1}}
    expected = json.dumps(record, separators=(",", ":"), ensure_ascii=False, default=str)
    assert compact_json_lines([record], default=str) == [expected]


def test_a_value_json_cannot_encode_raises_type_error():
    with pytest.raises(TypeError, match="bytes"):
        compact_json_lines([{"ok": 1}, {"raw": b"x"}])


def test_a_record_that_holds_itself_raises_value_error():
    record: dict = {"a": 1}
    record["self"] = record
    with pytest.raises(ValueError, match="Circular"):
        compact_json_lines([record])


def test_nan_is_written_as_json_dumps_writes_it():
    (line,) = compact_json_lines([{"x": math.nan}])
    assert line == '{"x":NaN}'
