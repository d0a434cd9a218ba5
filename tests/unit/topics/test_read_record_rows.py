"""Records shuffle files read on the driver: the rows Spark's JSON reader with the records
fields would give, each record parsed, in file and line order."""

from __future__ import annotations

import json

import pytest

from stream_ops.errors import TopicError
from stream_ops.topics.file_topic import write_json_lines_atomically
from stream_ops.topics.shuffle_files import read_record_rows


def test_rows_come_in_file_and_line_order_and_lines_without_a_record_are_skipped(tmp_path):
    first, second = tmp_path / "t0-x1-e1.jsonl", tmp_path / "t0-x2-e1.jsonl"
    write_json_lines_atomically(
        first,
        [
            {"__previous_txid": 0},
            {"stream": "clicks", "key": '["dé"]', "record": json.dumps({"user": "dé", "ts": 1.5})},
            {"stream": "__tick__", "key": None, "record": None},
        ],
    )
    second.write_text('\n{"stream": "clicks", "key": "[1]", "record": "{\\"user\\": 1}"}\n\n', encoding="utf-8")
    assert read_record_rows([first, second]) == [
        ("clicks", '["dé"]', {"user": "dé", "ts": 1.5}),
        ("clicks", "[1]", {"user": 1}),
    ]
    assert read_record_rows([]) == []


def test_a_line_that_is_not_a_records_line_is_an_error(tmp_path):
    bad = tmp_path / "t0-x1-e1.jsonl"
    bad.write_text('{"stream": "s", "record": "{broken"}\n', encoding="utf-8")
    with pytest.raises(TopicError, match="not a records shuffle line"):
        read_record_rows([bad])
