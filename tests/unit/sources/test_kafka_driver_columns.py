"""A Kafka batch read on the driver, turned into the source's columns (``sources/kafka_arrow.py``),
and the offset ranges Spark logged for a batch (``spark/checkpoint.py:batch_offset_ranges``).

The rows here are built by hand in the schema of Spark's Kafka source; the integration tests
(``tests/integration/kafka/test_kafka_driver_path.py``) compare the same batches with Spark.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from stream_ops.kafka.range_reader import SPARK_KAFKA_SCHEMA
from stream_ops.sources import KafkaTopic, OffsetRange, source_spec
from stream_ops.sources.kafka_arrow import HEADERS_ARROW_TYPE, source_table
from stream_ops.sources.kafka_source import METADATA_FIELDS
from stream_ops.spark.checkpoint import batch_offset_ranges, starting_offsets


def _raw(rows: list[dict[str, Any]]) -> pa.Table:
    full = [
        {
            "topic": "t",
            "partition": 0,
            "timestampType": 0,
            "headers": None,
            "key": None,
            **row,
            "timestamp": row.get("ms", 5) * 1000,
        }
        for row in rows
    ]
    columns = {name: [row.get(name) for row in full] for name in SPARK_KAFKA_SCHEMA.names}
    columns["timestamp"] = pa.array(columns["timestamp"], pa.int64()).cast(SPARK_KAFKA_SCHEMA.field("timestamp").type)
    return pa.table(columns, schema=SPARK_KAFKA_SCHEMA)


def _fields(fmt: str = "json") -> dict[str, str]:
    schema = {"sentence": "string", "n": "long"} if fmt == "json" else None
    return dict(source_spec(KafkaTopic("b:9", "t", format=fmt, partitions=1), schema).fields)


def test_json_values_become_the_declared_fields_with_the_kafka_metadata() -> None:
    raw = _raw(
        [
            {"key": b"k1", "value": b'{"sentence":"a b","n":2}', "offset": 3, "ms": 1700},
            {"key": None, "value": None, "offset": 4, "headers": [{"key": "h", "value": b"v"}, {"key": "h", "value": None}]},
            {"key": b"k3", "value": b'{"n":7,"other":1}', "offset": 6, "ms": -1},
        ]
    )
    table = source_table(raw, _fields(), METADATA_FIELDS, fmt="json", encoding="utf8")
    assert table is not None
    assert table.column_names == list(_fields())
    assert table.schema.field("kafka_headers").type == HEADERS_ARROW_TYPE
    assert table.to_pylist() == [
        {
            "sentence": "a b",
            "n": 2,
            "kafka_key": "k1",
            "kafka_partition": 0,
            "kafka_offset": 3,
            "kafka_timestamp": 1700,
            "kafka_headers": None,
        },
        {
            "sentence": None,
            "n": None,
            "kafka_key": None,
            "kafka_partition": 0,
            "kafka_offset": 4,
            "kafka_timestamp": 5,
            "kafka_headers": [{"key": "h", "value": "v"}, {"key": "h", "value": None}],
        },
        {
            "sentence": None,
            "n": 7,
            "kafka_key": "k3",
            "kafka_partition": 0,
            "kafka_offset": 6,
            "kafka_timestamp": -1,
            "kafka_headers": None,
        },
    ]


def test_what_only_spark_reads_exactly_leaves_the_batch_to_spark() -> None:
    fields = _fields()
    for value in (b'{"n":"7"}', b'{"n":1}\n{"n":2}', b"", b" {}", b"[1]", b'{"sentence":"\xff"}', b"{} {}"):
        raw = _raw([{"value": b'{"n":1}', "offset": 0}, {"value": value, "offset": 1}])
        assert source_table(raw, fields, METADATA_FIELDS, fmt="json", encoding="utf8") is None, value
    not_utf8_key = _raw([{"key": b"\xc3(", "value": b"{}", "offset": 0}])
    assert source_table(not_utf8_key, fields, METADATA_FIELDS, fmt="json", encoding="utf8") is None
    not_utf8_header = _raw([{"value": b"{}", "offset": 0, "headers": [{"key": "h", "value": b"\xff"}]}])
    assert source_table(not_utf8_header, fields, METADATA_FIELDS, fmt="json", encoding="utf8") is None


def test_base64_encodes_keys_values_and_headers_up_to_the_unchunked_length() -> None:
    raw = _raw([{"key": b"\xff\x00", "value": b"\xc3(", "offset": 0, "headers": [{"key": "h", "value": b"\x01"}]}])
    table = source_table(raw, _fields("raw"), METADATA_FIELDS, fmt="raw", encoding="base64")
    assert table is not None
    row = table.to_pylist()[0]
    assert (row["value"], row["kafka_key"], row["kafka_headers"]) == ("wyg=", "/wA=", [{"key": "h", "value": "AQ=="}])
    assert source_table(_raw([{"value": b"x" * 57, "offset": 0}]), _fields("raw"), METADATA_FIELDS, fmt="raw", encoding="base64")
    long = _raw([{"value": b"x" * 58, "offset": 0}])
    assert source_table(long, _fields("raw"), METADATA_FIELDS, fmt="raw", encoding="base64") is None


def test_raw_values_are_text_and_a_tombstone_is_null() -> None:
    raw = _raw([{"value": "é".encode(), "offset": 0}, {"value": None, "offset": 1}])
    table = source_table(raw, _fields("raw"), METADATA_FIELDS, fmt="raw", encoding="utf8")
    assert table is not None
    assert table.column("value").to_pylist() == ["é", None]


def _log(checkpoint: Path, batch: int, offsets: str) -> None:
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    meta = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1})
    (checkpoint / "offsets" / str(batch)).write_text(f"v1\n{meta}\n{offsets}\n", encoding="utf-8")


def test_a_batch_reads_from_the_previous_batchs_end_offsets_to_its_own(tmp_path: Path) -> None:
    _log(tmp_path, 0, '{"t":{"1":10}}')
    _log(tmp_path, 1, '{"t":{"1":25}}')
    assert batch_offset_ranges(tmp_path, 1) == [OffsetRange("t", 1, 10, 25)]
    assert batch_offset_ranges(tmp_path, 0) is None, "batch 0: no starting offsets kept"
    assert batch_offset_ranges(tmp_path, 2) is None, "not logged yet"


def _starting(checkpoint: Path, offsets: str) -> None:
    """The starting offsets as Spark's Kafka source keeps them: a NUL byte, the version, the JSON."""
    (checkpoint / "sources" / "0").mkdir(parents=True, exist_ok=True)
    (checkpoint / "sources" / "0" / "0").write_bytes(b"\0v1\n" + offsets.encode())


def test_batch_0_reads_from_the_starting_offsets_spark_kept(tmp_path: Path) -> None:
    _starting(tmp_path, '{"t":{"1":4}}')
    _log(tmp_path, 0, '{"t":{"1":10}}')
    _log(tmp_path, 1, '{"t":{"1":25}}')
    assert starting_offsets(tmp_path) == {("t", 1): 4}
    assert batch_offset_ranges(tmp_path, 0) == [OffsetRange("t", 1, 4, 10)]
    assert batch_offset_ranges(tmp_path, 1) == [OffsetRange("t", 1, 10, 25)], "later batches: from the previous batch's end"


def test_starting_offsets_that_are_not_a_kafka_sources_are_none(tmp_path: Path) -> None:
    _log(tmp_path, 0, '{"t":{"1":10}}')
    _starting(tmp_path, '{"t":{"0":4}}')
    assert batch_offset_ranges(tmp_path, 0) is None, "another partition"
    _starting(tmp_path, '{"t":{"1":-2}}')
    assert starting_offsets(tmp_path) is None, "an offset Spark has not resolved"
    _starting(tmp_path, '{"t":{"1":12}}')
    assert batch_offset_ranges(tmp_path, 0) is None, "an end below its start"
    # a file source's log entry 0 (one file): no starting offsets
    (tmp_path / "sources" / "0" / "0").write_text('v1\n{"path":"file:/in/a.json","timestamp":1,"batchId":0,"action":"add"}\n')
    assert starting_offsets(tmp_path) is None


def test_offsets_that_are_not_one_sources_partition_offsets_are_not_ranges(tmp_path: Path) -> None:
    _log(tmp_path, 0, '{"logOffset":3}')
    _log(tmp_path, 1, '{"logOffset":4}')
    assert batch_offset_ranges(tmp_path, 1) is None
    _log(tmp_path, 2, '{"t":{"0":5}}')
    _log(tmp_path, 3, '{"t":{"1":6}}')
    assert batch_offset_ranges(tmp_path, 3) is None, "another partition"
    _log(tmp_path, 4, '{"t":{"1":4}}')
    assert batch_offset_ranges(tmp_path, 4) is None, "an end below its start"
