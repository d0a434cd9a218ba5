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


def _compact(checkpoint: Path, batch: int, entries: dict[int, list[str]]) -> None:
    lines = ["v1", *(json.dumps({"path": p, "batchId": b}) for b, paths in entries.items() for p in paths)]
    (checkpoint / "sources" / "0" / f"{batch}.compact").write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_a_batch_reads_the_log_entries_its_offsets_span(tmp_path):
    # A query stopped after the file source logged entry 1 and before the batch's offset: after
    # the restart Spark plans batch 1 over entries 1 and 2, and every later batch one entry ahead.
    from stream_ops.spark.checkpoint import batch_input_files

    _offsets(tmp_path, 0, {"logOffset": 0})
    _files(tmp_path, 0, "/in/a")
    _files(tmp_path, 1, "/in/b")  # the stopped query's entry
    _files(tmp_path, 2, "/in/c")
    _offsets(tmp_path, 1, {"logOffset": 2})
    _files(tmp_path, 3, "/in/d")
    _offsets(tmp_path, 2, {"logOffset": 3})
    assert [batch_input_files(tmp_path, b) for b in (0, 1, 2)] == [["/in/a"], ["/in/b", "/in/c"], ["/in/d"]]
    assert batch_input(tmp_path, 1).files == 2
    # Entries compacted away are read from the compact file that holds them (the first after them).
    for entry in ("1", "2"):
        (tmp_path / "sources" / "0" / entry).unlink()
    _compact(tmp_path, 9, {0: ["/in/a"], 1: ["/in/b"], 2: ["/in/c"], 3: ["/in/d"]})
    assert batch_input_files(tmp_path, 1) == ["/in/b", "/in/c"]
    # A batch without a logged offset is read as the entry of its own id, if the log has one.
    assert batch_input_files(tmp_path, 3) == ["/in/d"]
    assert batch_input_files(tmp_path, 4) is None
