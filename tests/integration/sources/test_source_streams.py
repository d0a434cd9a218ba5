"""Every source kind read by a real streaming query: the records, and lines that do not parse
landing in the corrupt column (JSON and CSV) instead of failing the query."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import DataFrame, SparkSession

from stream_ops.sources import CORRUPT_COLUMN, CsvFiles, JsonFiles, ParquetFiles, RateSource, SourceSpec, source_kind, source_spec
from stream_ops.topics.file_topic import FileTopic

QUERY_TIMEOUT_S = 60


def _read_all(spark: SparkSession, spec: SourceSpec, queue: int, checkpoint: Path) -> list[dict[str, Any]]:
    """Every record the kind's stream has now (trigger availableNow), as dicts."""
    rows: list[dict[str, Any]] = []

    def collect(df: DataFrame, batch_id: int) -> None:
        rows.extend(row.asDict() for row in df.collect())

    df = source_kind(spec.kind).read_stream(spark, spec, queue, max_files_per_trigger=1, max_file_age="7d")
    query = df.writeStream.foreachBatch(collect).option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    try:
        assert query.awaitTermination(QUERY_TIMEOUT_S), "the query did not finish in time"
        assert query.exception() is None
    finally:
        query.stop()
    return rows


def _good(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(({k: v for k, v in r.items() if k != CORRUPT_COLUMN} for r in rows if r.get(CORRUPT_COLUMN) is None), key=str)


def _corrupt(rows: list[dict[str, Any]]) -> list[str]:
    return sorted(r[CORRUPT_COLUMN] for r in rows if r.get(CORRUPT_COLUMN) is not None)


def test_a_file_topic_queue_is_read_with_bad_lines_in_the_corrupt_column(spark: SparkSession, tmp_path: Path) -> None:
    topic = FileTopic(tmp_path / "topic", queues=2)
    topic.create()
    topic.write_file(1, "a.jsonl", [{"word": "a", "n": 1}, {"word": "b", "n": 2}])
    topic.write_file(0, "other.jsonl", [{"word": "elsewhere", "n": 0}])
    (topic.queue_path(1) / "b.jsonl").write_text('{"word": "c", "n": 3}\n{"word": "d", "n": "many"}\nnot json\n')
    spec = source_spec(topic, {"word": "string", "n": "long"})

    rows = _read_all(spark, spec, 1, tmp_path / "checkpoint")

    assert set(rows[0]) == {"word", "n", CORRUPT_COLUMN}
    assert _good(rows) == sorted([{"word": "a", "n": 1}, {"word": "b", "n": 2}, {"word": "c", "n": 3}], key=str)
    assert _corrupt(rows) == sorted(['{"word": "d", "n": "many"}', "not json"])


def test_landed_json_lines_are_read_with_bad_lines_in_the_corrupt_column(spark: SparkSession, tmp_path: Path) -> None:
    landed = tmp_path / "landed"
    landed.mkdir()
    (landed / "a.json").write_text('{"id": 1, "name": "x"}\n{"id": 2, "name": "y"}\n')
    spec = source_spec(JsonFiles(landed))  # inferred: id long, name string
    (landed / "b.json").write_text('{"id": 3, "name": "z"}\n{"id": 1.5}\n')
    (landed / "_ignored.json").write_text('{"id": 99, "name": "no"}\n')

    rows = _read_all(spark, spec, 0, tmp_path / "checkpoint")

    assert _good(rows) == sorted([{"id": 1, "name": "x"}, {"id": 2, "name": "y"}, {"id": 3, "name": "z"}], key=str)
    assert _corrupt(rows) == ['{"id": 1.5}']


def test_landed_csv_is_read_with_bad_values_in_the_corrupt_column(spark: SparkSession, tmp_path: Path) -> None:
    landed = tmp_path / "landed"
    landed.mkdir()
    (landed / "a.csv").write_text("id;name;ok\n1;x;true\n2;y;false\n")
    spec = source_spec(CsvFiles(landed, delimiter=";"))
    assert spec.fields == {"id": "long", "name": "string", "ok": "boolean"}
    (landed / "b.csv").write_text("id;name;ok\nthree;z;true\n4;w;true\n")

    rows = _read_all(spark, spec, 0, tmp_path / "checkpoint")

    assert _good(rows) == sorted(
        [{"id": 1, "name": "x", "ok": True}, {"id": 2, "name": "y", "ok": False}, {"id": 4, "name": "w", "ok": True}], key=str
    )
    assert _corrupt(rows) == ["three;z;true"]


def test_a_csv_file_whose_columns_moved_fails_the_query(spark: SparkSession, tmp_path: Path) -> None:
    landed = tmp_path / "landed"
    landed.mkdir()
    (landed / "a.csv").write_text("id,name\n1,x\n")
    spec = source_spec(CsvFiles(landed))
    (landed / "b.csv").write_text("name,id\ny,2\n")

    with pytest.raises(Exception, match="CSV header does not conform to the schema"):
        _read_all(spark, spec, 0, tmp_path / "checkpoint")


def test_renamed_csv_columns_are_read_by_position(spark: SparkSession, tmp_path: Path) -> None:
    landed = tmp_path / "landed"
    landed.mkdir()
    (landed / "a.csv").write_text("user id,amount\nu1,3\n")
    spec = source_spec(CsvFiles(landed), {"user_id": "string", "amount": "long"})

    assert _good(_read_all(spark, spec, 0, tmp_path / "checkpoint")) == [{"user_id": "u1", "amount": 3}]


def test_landed_parquet_is_read_by_column_name(spark: SparkSession, tmp_path: Path) -> None:
    landed = tmp_path / "landed"
    landed.mkdir()
    pq.write_table(pa.table({"name": ["x", "y"], "id": pa.array([1, 2], pa.int32()), "extra": [0.5, 1.5]}), landed / "a.parquet")
    pq.write_table(pa.table({"id": pa.array([3], pa.int32()), "name": ["z"]}), landed / "b.parquet")
    spec = source_spec(ParquetFiles(landed), {"id": "long", "name": "string"})  # int32 in the files, widened

    rows = _read_all(spark, spec, 0, tmp_path / "checkpoint")

    assert set(rows[0]) == {"id", "name"}
    assert sorted(rows, key=str) == sorted([{"id": 1, "name": "x"}, {"id": 2, "name": "y"}, {"id": 3, "name": "z"}], key=str)


def test_a_parquet_file_spark_cannot_read_fails_the_query(spark: SparkSession, tmp_path: Path) -> None:
    landed = tmp_path / "landed"
    landed.mkdir()
    spec = source_spec(ParquetFiles(landed), {"id": "long"})
    (landed / "a.parquet").write_text("cut short")

    with pytest.raises(Exception, match="is not a Parquet file"):
        _read_all(spark, spec, 0, tmp_path / "checkpoint")


def test_a_landed_directory_that_does_not_exist_yet_is_created_and_read_empty(spark: SparkSession, tmp_path: Path) -> None:
    spec = source_spec(JsonFiles(tmp_path / "later"), {"id": "long"})

    assert _read_all(spark, spec, 0, tmp_path / "checkpoint") == []
    assert (tmp_path / "later").is_dir()


def test_a_rate_source_generates_epoch_millisecond_timestamps_and_values(spark: SparkSession, tmp_path: Path) -> None:
    spec = source_spec(RateSource(rows_per_second=50, num_partitions=2))
    rows: list[dict[str, Any]] = []
    lock = threading.Lock()

    def collect(df: DataFrame, batch_id: int) -> None:
        with lock:
            rows.extend(row.asDict() for row in df.collect())

    df = source_kind(spec.kind).read_stream(spark, spec, 0, max_files_per_trigger=1, max_file_age="7d")
    assert df.schema.simpleString() == "struct<timestamp:bigint,value:bigint>"
    started_ms = int(time.time() * 1000)
    query = (
        df.writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        deadline = time.monotonic() + QUERY_TIMEOUT_S
        while len(rows) < 20:
            assert query.exception() is None
            assert time.monotonic() < deadline, "no rows from the rate source"
            time.sleep(0.2)
    finally:
        query.stop()
    with lock:
        values = sorted(r["value"] for r in rows)
        assert values == list(range(len(values)))
        assert all(started_ms - 60_000 < r["timestamp"] < started_ms + 120_000 for r in rows)
