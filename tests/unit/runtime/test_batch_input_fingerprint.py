"""The input fingerprint of a batch, from Spark's checkpoint: files for a file source, the offset
range for any other source (Kafka partitions, rate), so a re-planned replay is caught."""

from __future__ import annotations

import json
from pathlib import Path

from stream_ops.spark.checkpoint import batch_input


def _offsets(checkpoint: Path, batch: int, *offsets: object) -> None:
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    lines = ["v1", json.dumps({"batchWatermarkMs": 0}), *(json.dumps(o) for o in offsets)]
    (checkpoint / "offsets" / str(batch)).write_text("\n".join(lines) + "\n", encoding="utf-8")


def _files(checkpoint: Path, batch: int, *paths: str) -> None:
    (checkpoint / "sources" / "0").mkdir(parents=True, exist_ok=True)
    lines = ["v1", *(json.dumps({"path": p, "batchId": batch}) for p in paths)]
    (checkpoint / "sources" / "0" / str(batch)).write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_a_kafka_batch_is_fingerprinted_by_its_offset_range(tmp_path):
    _offsets(tmp_path, 0, {"words": {"0": 10, "1": 7}})
    _offsets(tmp_path, 1, {"words": {"0": 25, "1": 7}})
    first, second = batch_input(tmp_path, 0), batch_input(tmp_path, 1)
    assert first is not None and second is not None
    assert first.offsets and second.offsets and first.files == 0
    assert first.digest != second.digest
    assert batch_input(tmp_path, 1) == second  # the same plan, the same digest
    _offsets(tmp_path, 1, {"words": {"0": 30, "1": 7}})  # Spark re-planned batch 1 further
    assert batch_input(tmp_path, 1).digest != second.digest
    _offsets(tmp_path, 0, {"words": {"0": 11, "1": 7}})  # or its start moved
    assert batch_input(tmp_path, 1).digest != second.digest


def test_a_file_source_batch_is_fingerprinted_by_its_files(tmp_path):
    _offsets(tmp_path, 0, {"logOffset": 0})
    _files(tmp_path, 0, "/in/b.jsonl", "/in/a.jsonl")
    found = batch_input(tmp_path, 0)
    assert found is not None and not found.offsets and found.files == 2


def test_nothing_logged_is_no_fingerprint(tmp_path):
    assert batch_input(tmp_path, 3) is None
