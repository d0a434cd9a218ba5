"""A query killed while writing its first offset-log entry leaves a temp file that makes Spark 4
refuse the checkpoint ("should be empty on batch 0"); the task removes it before starting."""

from __future__ import annotations

import json

import pytest
from pyspark.errors import PySparkException

from stream_ops.spark.checkpoint import remove_crashed_writes


def _run_once(spark, source, checkpoint) -> list:
    seen: list = []
    query = (
        spark.readStream.schema("n long")
        .json(str(source))
        .writeStream.foreachBatch(lambda df, _: seen.extend(r["n"] for r in df.collect()))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    if query.exception() is not None:
        raise query.exception()
    return seen


def test_a_temp_file_left_in_the_offset_log_is_removed_and_the_query_starts(spark, tmp_path):
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    source.mkdir()
    (source / "a.json").write_text(json.dumps({"n": 1}) + "\n")
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "metadata").write_text(json.dumps({"id": "4d0c1d77-4a4e-4c3e-9a61-6c0a5b1d6f1e"}))
    leftover = checkpoint / "offsets" / ".0.9c1e0a4e-1b2c-4d5e-8f90-123456789abc.tmp"
    leftover.write_text("v1\n")
    with pytest.raises(PySparkException, match="STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY|should be empty"):
        _run_once(spark, source, checkpoint)  # what a task restarted on this checkpoint met
    leftover.write_text("v1\n")
    assert remove_crashed_writes(checkpoint) == [leftover]
    assert _run_once(spark, source, checkpoint) == [1]
    assert remove_crashed_writes(checkpoint) == []
