"""Source specs from what users pass to ``topology.source``: schemas given or inferred from
landed files, the errors a bad definition raises, the lag of file sources, and the registry."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest

from stream_ops.errors import SourceError, TopologyDefinitionError
from stream_ops.helpers.line_counts import count_lines
from stream_ops.sources import (
    CORRUPT_COLUMN,
    CsvFiles,
    JsonFiles,
    ParquetFiles,
    RateSource,
    SourceKind,
    SourceLag,
    SourceSpec,
    register_source_kind,
    source_kind,
    source_spec,
)
from stream_ops.sources import base as source_base
from stream_ops.sources.base import files_newer_than
from stream_ops.topics.file_topic import FileTopic

NOW_MS = int(time.time() * 1000)


def _set_mtime(path: Path, ms: int) -> None:
    os.utime(path, ns=(ms * 1_000_000, ms * 1_000_000))


def _write_parquet(path: Path, table: pa.Table, mtime_ms: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    if mtime_ms is not None:
        _set_mtime(path, mtime_ms)
    return path


def _write_text(path: Path, text: str, mtime_ms: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    if mtime_ms is not None:
        _set_mtime(path, mtime_ms)
    return path


# --- specs ---------------------------------------------------------------------------------


def test_a_file_topic_spec_is_plain_json_that_round_trips(tmp_path: Path) -> None:
    spec = source_spec(FileTopic(tmp_path / "in", queues=3), {"sentence": "string", "n": "long"})
    assert spec.kind == "file_topic"
    assert (spec.path, spec.queues, spec.fields, spec.options) == (
        str(tmp_path / "in"),
        3,
        {"sentence": "string", "n": "long"},
        {},
    )
    assert SourceSpec.model_validate_json(spec.model_dump_json()) == spec
    assert list(SourceSpec.model_validate(json.loads(spec.model_dump_json())).fields) == ["sentence", "n"]


def test_a_file_topic_takes_a_list_of_string_fields_and_nested_types(tmp_path: Path) -> None:
    assert source_spec(FileTopic(tmp_path), ["a", "b"]).fields == {"a": "string", "b": "string"}
    nested = source_spec(FileTopic(tmp_path), {"user": "struct<id:long,name:string>"})
    assert nested.fields == {"user": "struct<id:long,name:string>"}


def test_a_file_topic_needs_a_schema(tmp_path: Path) -> None:
    with pytest.raises(TopologyDefinitionError, match="needs schema="):
        source_spec(FileTopic(tmp_path), None)


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"a": "timestamp"}, "unsupported type 'timestamp'"),
        ({"a b": "long"}, "not a valid identifier"),
        ({}, "names no field"),
        ({CORRUPT_COLUMN: "string"}, "reserved"),
        (42, "mapping or a list"),
    ],
)
def test_a_bad_schema_is_refused(tmp_path: Path, schema: object, message: str) -> None:
    with pytest.raises(TopologyDefinitionError, match=message):
        source_spec(FileTopic(tmp_path), schema)  # type: ignore[arg-type]


def test_anything_else_as_a_source_is_refused() -> None:
    with pytest.raises(TopologyDefinitionError, match="must be a FileTopic, ParquetFiles.*got str"):
        source_spec("/data/in", {"a": "string"})


def test_a_spec_of_an_unknown_kind_or_bad_queues_is_refused() -> None:
    with pytest.raises(TopologyDefinitionError, match="unknown source kind 'kafka'; known kinds: .*'file_topic'"):
        SourceSpec(kind="kafka", fields={"a": "string"})
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        SourceSpec(kind="rate", queues=0, fields={"a": "string"})
    with pytest.raises(ValueError, match="JSON|json|valid"):
        SourceSpec(kind="rate", fields={"a": "string"}, options={"x": object()})


def test_a_rate_source_has_fixed_fields_and_positive_counts() -> None:
    spec = source_spec(RateSource(rows_per_second=500, num_partitions=2))
    assert (spec.kind, spec.path, spec.queues) == ("rate", None, 1)
    assert spec.fields == {"timestamp": "long", "value": "long"}
    assert spec.options == {"rows_per_second": 500, "num_partitions": 2}
    assert source_spec(RateSource(), {"timestamp": "long", "value": "long"}).fields == spec.fields
    with pytest.raises(TopologyDefinitionError, match="fixed"):
        source_spec(RateSource(), {"value": "string"})
    with pytest.raises(TopologyDefinitionError, match="rows_per_second must be a positive integer"):
        source_spec(RateSource(rows_per_second=0))
    with pytest.raises(TopologyDefinitionError, match="num_partitions"):
        source_spec(RateSource(num_partitions=True))


# --- landed files: inference ---------------------------------------------------------------


def test_a_parquet_schema_is_read_from_the_first_file(tmp_path: Path) -> None:
    table = pa.table(
        {
            "id": pa.array([1], pa.int64()),
            "n": pa.array([1], pa.int32()),
            "score": pa.array([1.5], pa.float64()),
            "ratio": pa.array([0.5], pa.float32()),
            "ok": pa.array([True]),
            "name": pa.array(["x"], pa.string()),
            "tag": pa.array(["t"], pa.large_string()),
            "kind": pa.array(["k"]).dictionary_encode(),
        }
    )
    _write_parquet(tmp_path / "b.parquet", table)
    _write_parquet(tmp_path / "c.parquet", pa.table({"other": [1]}))
    _write_text(tmp_path / "_SUCCESS", "")
    spec = source_spec(ParquetFiles(tmp_path))
    assert spec.kind == "parquet_files"
    assert spec.fields == {
        "id": "long",
        "n": "int",
        "score": "double",
        "ratio": "float",
        "ok": "boolean",
        "name": "string",
        "tag": "string",
        "kind": "string",
    }
    assert (spec.queues, spec.options) == (1, {})


def test_a_parquet_timestamp_cannot_be_inferred_but_can_be_left_out(tmp_path: Path) -> None:
    table = pa.table({"id": [1], "at": pa.array([0], pa.timestamp("us"))})
    _write_parquet(tmp_path / "a.parquet", table)
    with pytest.raises(TopologyDefinitionError, match=r"field 'at' of a.parquet has type timestamp\[us\]"):
        source_spec(ParquetFiles(tmp_path))
    assert source_spec(ParquetFiles(tmp_path), {"id": "long"}).fields == {"id": "long"}


def test_a_given_parquet_schema_must_match_the_files(tmp_path: Path) -> None:
    _write_parquet(tmp_path / "a.parquet", pa.table({"id": pa.array([1], pa.int32()), "name": ["x"]}))
    assert source_spec(ParquetFiles(tmp_path, schema={"ID": "long"})).fields == {"ID": "long"}  # widened, by name
    with pytest.raises(TopologyDefinitionError, match="no column 'missing'"):
        source_spec(ParquetFiles(tmp_path), {"missing": "string"})
    with pytest.raises(TopologyDefinitionError, match="field 'name' is 'long' in schema=, the file has string"):
        source_spec(ParquetFiles(tmp_path), {"name": "long"})


def test_a_csv_schema_is_inferred_from_the_header_and_values(tmp_path: Path) -> None:
    text = "id,name,score,ok,at,day,empty\n1,x,1.5,true,2024-01-01 00:00:00,2024-01-02,\n2,,NA,false,2024-01-01 00:00:01,2024-01-03,\n"
    _write_text(tmp_path / "a.csv", text)
    spec = source_spec(CsvFiles(tmp_path))
    assert spec.kind == "csv_files"
    assert spec.fields == {
        "id": "long",
        "name": "string",
        "score": "string",  # "NA" is text to Spark, not a null
        "ok": "boolean",
        "at": "string",
        "day": "string",
        "empty": "string",
    }
    assert spec.options == {"header": True, "delimiter": ",", "check_header": True}


def test_a_csv_without_header_gets_sparks_column_names(tmp_path: Path) -> None:
    _write_text(tmp_path / "a.csv", "1;x\n2;y\n")
    spec = source_spec(CsvFiles(tmp_path, header=False, delimiter=";"))
    assert spec.fields == {"_c0": "long", "_c1": "string"}
    assert spec.options == {"header": False, "delimiter": ";"}


def test_a_given_csv_schema_names_every_column_and_renames_by_position(tmp_path: Path) -> None:
    _write_text(tmp_path / "a.csv", "user id,amount\nu1,3\n")
    with pytest.raises(TopologyDefinitionError, match="'user id' is not a valid identifier"):
        source_spec(CsvFiles(tmp_path))
    spec = source_spec(CsvFiles(tmp_path), {"user_id": "string", "amount": "long"})
    assert spec.options["check_header"] is False  # renamed: read by position
    with pytest.raises(TopologyDefinitionError, match="names 1 fields, the file has 2 columns"):
        source_spec(CsvFiles(tmp_path), {"user_id": "string"})
    with pytest.raises(TopologyDefinitionError, match="unsupported type 'struct<a:long>'"):
        source_spec(CsvFiles(tmp_path), {"user_id": "string", "amount": "struct<a:long>"})


@pytest.mark.parametrize("delimiter", ["", ";;", '"', "\n"])
def test_a_csv_delimiter_is_one_plain_character(tmp_path: Path, delimiter: str) -> None:
    with pytest.raises(TopologyDefinitionError, match="delimiter"):
        source_spec(CsvFiles(tmp_path, delimiter=delimiter), {"a": "string"})


def test_a_json_lines_schema_is_inferred_and_nested_values_need_a_schema(tmp_path: Path) -> None:
    _write_text(
        tmp_path / "a.jsonl", '{"id": 1, "name": "x", "score": 1.5, "ok": true, "at": "2024-01-01 00:00:00", "none": null}\n'
    )
    spec = source_spec(JsonFiles(tmp_path))
    assert spec.kind == "json_files"
    assert spec.fields == {"id": "long", "name": "string", "score": "double", "ok": "boolean", "at": "string", "none": "string"}
    _write_text(tmp_path / "0.jsonl", '{"user": {"id": 1}}\n')
    with pytest.raises(TopologyDefinitionError, match="field 'user' of 0.jsonl has type struct"):
        source_spec(JsonFiles(tmp_path))
    assert source_spec(JsonFiles(tmp_path), {"user": "struct<id:long>"}).fields == {"user": "struct<id:long>"}


@pytest.mark.parametrize("source_class", [ParquetFiles, CsvFiles, JsonFiles])
def test_inferring_from_a_missing_or_empty_directory_asks_for_a_schema(tmp_path: Path, source_class: type) -> None:
    with pytest.raises(TopologyDefinitionError, match="directory does not exist; pass schema="):
        source_spec(source_class(tmp_path / "missing"))
    _write_text(tmp_path / "empty" / "a.data", "")
    _write_text(tmp_path / "empty" / ".hidden", "x")
    with pytest.raises(TopologyDefinitionError, match="has no non-empty file; pass schema="):
        source_spec(source_class(tmp_path / "empty"))
    assert source_spec(source_class(tmp_path / "missing"), {"a": "string"}).fields == {"a": "string"}


def test_an_unreadable_first_file_is_named(tmp_path: Path) -> None:
    _write_text(tmp_path / "a.parquet", "not parquet")
    with pytest.raises(TopologyDefinitionError, match="cannot infer the schema from a.parquet"):
        source_spec(ParquetFiles(tmp_path))
    _write_text(tmp_path / "json" / "a.jsonl", "{not json\n")
    with pytest.raises(TopologyDefinitionError, match="cannot infer the schema from a.jsonl"):
        source_spec(JsonFiles(tmp_path / "json"))


def test_a_schema_on_the_source_and_in_schema_must_agree(tmp_path: Path) -> None:
    source = JsonFiles(tmp_path, schema={"a": "long"})
    assert source_spec(source, {"a": "long"}).fields == {"a": "long"}
    with pytest.raises(TopologyDefinitionError, match="two different schemas"):
        source_spec(source, {"a": "string"})


def test_an_unknown_landed_format_is_refused(tmp_path: Path) -> None:
    from stream_ops.sources.landed_files import landed_files_spec

    with pytest.raises(TopologyDefinitionError, match="unknown format 'avro'"):
        landed_files_spec(tmp_path, "avro", {"a": "string"})


# --- lag -----------------------------------------------------------------------------------


def test_lines_are_counted_with_or_without_a_last_newline(tmp_path: Path) -> None:
    assert count_lines(_write_text(tmp_path / "a", "")) == 0
    assert count_lines(_write_text(tmp_path / "b", "x\ny\n")) == 2
    assert count_lines(_write_text(tmp_path / "c", "x\ny")) == 2


def test_only_visible_files_modified_after_the_consumed_time_are_unread(tmp_path: Path) -> None:
    _write_text(tmp_path / "old", "x\n", NOW_MS - 10_000)
    _write_text(tmp_path / "same", "x\n", NOW_MS)
    new = _write_text(tmp_path / "new", "x\n", NOW_MS + 1)
    _write_text(tmp_path / ".hidden", "x\n", NOW_MS + 1)
    _write_text(tmp_path / "_SUCCESS", "", NOW_MS + 1)
    (tmp_path / "subdir").mkdir()
    assert files_newer_than(tmp_path, NOW_MS) == [new]
    assert files_newer_than(tmp_path / "missing", 0) == []


def test_file_topic_lag_counts_the_lines_of_unread_files(tmp_path: Path) -> None:
    topic = FileTopic(tmp_path / "topic", queues=2)
    spec = source_spec(topic, {"a": "long"})
    kind = source_kind(spec.kind)
    read = topic.write_file(1, "a.jsonl", [{"a": 1}] * 5)
    _set_mtime(read, NOW_MS)
    for name, count in (("b.jsonl", 3), ("c.jsonl", 4)):
        _set_mtime(topic.write_file(1, name, [{"a": 2}] * count), NOW_MS + 5)
    topic.write_file(0, "d.jsonl", [{"a": 3}])
    assert kind.lag(spec, 1, NOW_MS) == SourceLag(records=7, files=2)
    assert kind.lag(spec, 1, 0) == SourceLag(records=12, files=3)
    assert kind.queue_dir(spec, 1) == topic.queue_path(1)
    with pytest.raises(SourceError, match="queue 2 out of range"):
        kind.lag(spec, 2, 0)


def test_parquet_lag_reads_the_row_counts_from_the_footers(tmp_path: Path) -> None:
    _write_parquet(tmp_path / "a.parquet", pa.table({"a": list(range(10))}), NOW_MS)
    _write_parquet(tmp_path / "b.parquet", pa.table({"a": list(range(7))}), NOW_MS + 5)
    _write_parquet(tmp_path / "c.parquet", pa.table({"a": list(range(3))}), NOW_MS + 6)
    spec = source_spec(ParquetFiles(tmp_path))
    kind = source_kind(spec.kind)
    assert kind.queue_dir(spec, 0) == tmp_path
    assert kind.lag(spec, 0, NOW_MS) == SourceLag(records=10, files=2)
    _write_text(tmp_path / "d.parquet", "being written", NOW_MS + 7)
    assert kind.lag(spec, 0, NOW_MS) == SourceLag(records=None, files=3)


def test_csv_lag_counts_lines_less_the_header_and_json_lag_counts_lines(tmp_path: Path) -> None:
    table = pa.table({"a": [1, 2, 3], "b": ["x", "y", "z"]})
    (tmp_path / "csv").mkdir()
    pa_csv.write_csv(table, tmp_path / "csv" / "a.csv")
    _set_mtime(tmp_path / "csv" / "a.csv", NOW_MS + 1)
    _write_text(tmp_path / "csv" / "b.csv", '"a","b"\n4,"w"\n', NOW_MS + 1)
    spec = source_spec(CsvFiles(tmp_path / "csv"))
    assert spec.fields == {"a": "long", "b": "string"}
    assert source_kind(spec.kind).lag(spec, 0, NOW_MS) == SourceLag(records=4, files=2)
    headerless = source_spec(CsvFiles(tmp_path / "csv", header=False), {"a": "string", "b": "string"})
    assert source_kind(headerless.kind).lag(headerless, 0, NOW_MS) == SourceLag(records=6, files=2)

    _write_text(tmp_path / "json" / "a.jsonl", '{"a": 1}\n{"a": 2}\n{"a": 3}', NOW_MS + 1)
    spec = source_spec(JsonFiles(tmp_path / "json"))
    assert source_kind(spec.kind).lag(spec, 0, NOW_MS) == SourceLag(records=3, files=1)
    assert source_kind(spec.kind).lag(spec, 0, NOW_MS + 1) == SourceLag(records=0, files=0)


def test_rate_lag_is_unknown_and_it_has_no_directory() -> None:
    spec = source_spec(RateSource())
    kind = source_kind("rate")
    assert kind.lag(spec, 0, 0) == SourceLag(records=None, files=None)
    assert kind.queue_dir(spec, 0) is None


# --- registry and kinds --------------------------------------------------------------------


def test_the_corrupt_column_is_added_where_the_format_has_one(tmp_path: Path) -> None:
    fields = {"a": "long"}
    assert source_kind("file_topic").columns(source_spec(FileTopic(tmp_path), fields)) == {"a": "long", CORRUPT_COLUMN: "string"}
    assert CORRUPT_COLUMN in source_kind("csv_files").columns(source_spec(CsvFiles(tmp_path), fields))
    assert CORRUPT_COLUMN in source_kind("json_files").columns(source_spec(JsonFiles(tmp_path), fields))
    assert source_kind("parquet_files").columns(source_spec(ParquetFiles(tmp_path), fields)) == fields
    assert not source_kind("rate").supports_corrupt_column


def test_a_kind_refuses_a_spec_of_another_kind(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="given a spec of kind 'rate'"):
        source_kind("file_topic").queue_dir(source_spec(RateSource()), 0)


def test_describe_says_what_is_read(tmp_path: Path) -> None:
    assert "FileTopic" in source_kind("file_topic").describe(source_spec(FileTopic(tmp_path, 2), ["a"]))
    assert "Parquet files landed in" in source_kind("parquet_files").describe(source_spec(ParquetFiles(tmp_path), ["a"]))
    assert "100 rows per second" in source_kind("rate").describe(source_spec(RateSource()))


class _EchoKind(SourceKind):
    name = "echo-test"

    def read_stream(self, spark: Any, spec: SourceSpec, queue: int, *, max_files_per_trigger: int, max_file_age: str) -> Any:
        raise NotImplementedError

    def queue_dir(self, spec: SourceSpec, queue: int) -> Path | None:
        return None

    def lag(self, spec: SourceSpec, queue: int, consumed_until_ms: int) -> SourceLag:
        return SourceLag(records=0, files=None)

    def describe(self, spec: SourceSpec) -> str:
        return "echo"


class _EchoSource:
    def to_source_spec(self, schema: object) -> SourceSpec:
        return SourceSpec(kind="echo-test", fields={"a": "string"})


def test_a_new_kind_is_one_registration_and_a_definition_object(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(source_base, "_KINDS", source_base._KINDS.copy())  # registered for this test only
    with pytest.raises(TopologyDefinitionError, match="unknown source kind 'echo-test'"):
        source_spec(_EchoSource())
    kind = register_source_kind(_EchoKind())
    assert source_kind("echo-test") is kind
    assert source_spec(_EchoSource()).kind == "echo-test"
    with pytest.raises(TopologyDefinitionError, match="registered already"):
        register_source_kind(_EchoKind())
