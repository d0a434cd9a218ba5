"""Values from the cluster and from topology data reach Dagster's Markdown metadata as literal text.

State keys, sink rows and error texts are written by topologies (or by whoever feeds their
input); rendered unescaped they would add table columns and rows, links, images or HTML to the
control room's pages (issue: control room security, "escaping in Dagster metadata").
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from test_failure_observations import STATUS, _task

from stream_ops.orchestration.markdown import cell, table
from stream_ops.orchestration.observations import observe_topology
from stream_ops.orchestration.sinks import parquet_sink_metadata
from stream_ops.sinks import ParquetSink

HOSTILE = "a | b\n| injected | row |\n[click](http://evil.example) ![img](http://evil.example/x.png) <img src=x onerror=alert(1)> `code` **bold** \x1b[31mred"


def _unescaped(text: str, token: str) -> bool:
    """Whether ``token``'s first character appears in ``text`` without a backslash before it."""
    at = text.find(token)
    while at != -1:
        if at == 0 or text[at - 1] != "\\":
            return True
        at = text.find(token, at + 1)
    return False


@pytest.mark.parametrize("token", ["[click]", "![img]", "<img", "`code`", "**bold**"])
def test_a_cell_renders_markup_as_text(token: str) -> None:
    assert not _unescaped(cell(HOSTILE), token)


def test_a_cell_is_one_line_without_control_characters_and_bounded() -> None:
    text = cell(HOSTILE + "x" * 1000)
    assert "\n" not in text and "\x1b" not in text and "\\x1b" in text
    assert len(text) < 400 and text.endswith("…")


def test_a_table_keeps_its_columns_whatever_the_values() -> None:
    rendered = table(["key", "value"], [[HOSTILE, "|||"]])
    body = rendered.splitlines()[2]
    # Two cells: three unescaped pipes (the borders and the one between the cells).
    assert len(rendered.splitlines()) == 3
    assert sum(1 for i, c in enumerate(body) if c == "|" and (i == 0 or body[i - 1] != "\\")) == 3


def test_a_sink_preview_escapes_row_values_and_column_names(tmp_path: Path) -> None:
    root = tmp_path / "sink"
    root.mkdir()
    sink = ParquetSink(root, {"word": "string"})
    sink.stage_batch(0, 0, 1, [{"word": HOSTILE}])
    sink.publish_batch(0, 0, 1, sink.staged_sizes(0, 0, 1))
    found = parquet_sink_metadata(root)
    assert found is not None
    lines = found["preview"].splitlines()
    assert len(lines) == 3 and not _unescaped(lines[2], "[click]") and not _unescaped(lines[2], "<img")


def test_the_tasks_table_escapes_error_texts_and_worker_ids() -> None:
    status = dataclasses.replace(
        STATUS, tasks=[_task(0, 0), _task(1, 1, failures=2, last_error=HOSTILE, last_error_worker="w:1", last_error_at=1.0)]
    )
    tables = {o.asset_key.path[-1]: o.metadata["tasks"].value for o in observe_topology(status) if "tasks" in o.metadata}
    assert tables
    for text in tables.values():
        lines = text.splitlines()
        assert len(lines) == 3, text  # header, rule, the stage's one task: no injected row
        assert not any(_unescaped(line, "[click]") or _unescaped(line, "<img") for line in lines)
