"""The input clock of shuffle-reading queries (``spark/input_wake.py``, ``InputWakeClock.java``).

The clock's rule is tested directly through py4j (a wait ends at its target time, at once when
every upstream task published a newer batch file, when the rest of a round a timed trigger read
half of lands, never for hidden temp files or files it already saw), then on real streaming queries whose
trigger is far longer than the test: a batch that runs shows the clock was set and woke it.
"""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stream_ops.errors import ConfigError
from stream_ops.spark import input_wake
from stream_ops.spark.checkpoint import batch_input_files
from stream_ops.spark.input_wake import SHUFFLE_WAKE_CONF, shuffle_wake_setting, wake_on_input
from stream_ops.topics.file_topic import batch_file_name

LONG_TRIGGER = "60 seconds"
"""Far longer than any test here waits: a batch within the test means the clock woke the query."""


def _clock(spark, directory: Path, producers: int):
    return spark.sparkContext._jvm.io.streamops.spark.InputWakeClock(str(directory), producers, 2)


def _publish(directory: Path, task: int, txid: int) -> None:
    table = pa.table({"key": ["a"], "value": [1]})
    hidden = directory / f".{batch_file_name(task, txid, 1, '.parquet')}.tmp"
    pq.write_table(table, hidden)
    hidden.rename(directory / batch_file_name(task, txid, 1, ".parquet"))


def _waited_ms(clock, wait_ms: int) -> float:
    started = time.monotonic()
    clock.waitTillTime(int(time.time() * 1000) + wait_ms)
    return (time.monotonic() - started) * 1000.0


def test_a_wait_without_new_input_lasts_until_its_target(spark, tmp_path):
    clock = _clock(spark, tmp_path, producers=2)
    assert _waited_ms(clock, 300) >= 250
    assert clock.wakes() == 0


def test_every_upstream_task_publishing_ends_the_wait_at_once(spark, tmp_path):
    clock = _clock(spark, tmp_path, producers=2)
    _publish(tmp_path, task=0, txid=0)
    _publish(tmp_path, task=1, txid=0)
    assert _waited_ms(clock, 20_000) < 5_000
    assert clock.wakes() == 1
    # what that wait saw is the new baseline: the same files do not end the next wait
    assert _waited_ms(clock, 300) >= 250
    _publish(tmp_path, task=0, txid=1)
    _publish(tmp_path, task=1, txid=1)
    assert _waited_ms(clock, 20_000) < 5_000
    assert clock.wakes() == 2


def test_half_a_round_waits_for_the_trigger_and_its_other_half_ends_the_next_wait(spark, tmp_path):
    clock = _clock(spark, tmp_path, producers=2)
    _publish(tmp_path, task=0, txid=0)
    assert _waited_ms(clock, 300) >= 250, "one upstream task of two: the trigger reads it"
    _publish(tmp_path, task=1, txid=0)
    assert _waited_ms(clock, 20_000) < 5_000, "the rest of the round ends the wait"
    assert clock.wakes() == 1
    _publish(tmp_path, task=1, txid=1)
    assert _waited_ms(clock, 300) >= 250, "a new round needs both upstream tasks"
    assert clock.wakes() == 1


def test_hidden_temp_files_do_not_end_a_wait(spark, tmp_path):
    clock = _clock(spark, tmp_path, producers=1)
    pq.write_table(pa.table({"key": ["a"]}), tmp_path / f".{batch_file_name(0, 0, 1, '.parquet')}.tmp")
    (tmp_path / "notes.txt").write_text("not a batch file")
    assert _waited_ms(clock, 300) >= 250
    assert clock.wakes() == 0


def _parquet_query(
    spark, tmp_path: Path, batches: list[tuple[int, float]], trigger: dict[str, object], queue: Path | None = None
):
    if queue is None:
        queue = tmp_path / "queue"
        queue.mkdir()
    query = (
        spark.readStream.schema("key string, value long")
        .parquet(str(queue))
        .writeStream.foreachBatch(lambda df, batch_id: batches.append((batch_id, time.monotonic())))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(**trigger)
        .start()
    )
    return queue, query


def test_a_query_with_the_clock_runs_a_batch_when_its_upstream_tasks_published(spark, tmp_path):
    batches: list[tuple[int, float]] = []
    queue = tmp_path / "queue"
    queue.mkdir()
    # A first file makes the first trigger a batch: the clock is set long before its first wait.
    _publish(queue, task=0, txid=0)
    _, query = _parquet_query(spark, tmp_path, batches, {"processingTime": LONG_TRIGGER}, queue=queue)
    try:
        installer = wake_on_input(spark, query, queue, producers=2)
        assert installer is not None
        installer.join(10)
        deadline = time.monotonic() + 30
        while query.lastProgress is None and time.monotonic() < deadline:  # batch 0 committed
            time.sleep(0.02)
        assert [b for b, _ in batches] == [0]
        published = time.monotonic()
        _publish(queue, task=0, txid=1)
        _publish(queue, task=1, txid=0)
        deadline = time.monotonic() + 20
        while len(batches) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(batches) == 2, f"no second batch within 20 s of the upstream files (trigger {LONG_TRIGGER})"
        assert batches[1][1] - published < 20
        files = batch_input_files(tmp_path / "checkpoint", 1)
        assert files is not None and sorted(f.rsplit("/", 1)[1] for f in files) == [
            batch_file_name(0, 1, 1, ".parquet"),
            batch_file_name(1, 0, 1, ".parquet"),
        ], "one batch read both upstream tasks' files"
        stopping = time.monotonic()
        query.stop()
        assert time.monotonic() - stopping < 10, "a query waiting on the clock stops at once"
    finally:
        query.stop()


def test_a_query_without_a_processing_time_trigger_keeps_its_executor(spark, tmp_path, caplog):
    batches: list[tuple[int, float]] = []
    queue, query = _parquet_query(spark, tmp_path, batches, {"availableNow": True})
    try:
        with caplog.at_level("WARNING", logger="stream_ops.spark.input_wake"):
            installer = wake_on_input(spark, query, queue, producers=1)
            assert installer is not None
            installer.join(10)
        assert "could not set the input clock" in caplog.text
    finally:
        query.stop()


def test_the_setting_is_true_false_or_refused(spark, monkeypatch):
    assert shuffle_wake_setting(spark) is True
    spark.conf.set(SHUFFLE_WAKE_CONF, "false")
    try:
        assert shuffle_wake_setting(spark) is False
        spark.conf.set(SHUFFLE_WAKE_CONF, "sometimes")
        with pytest.raises(ConfigError, match="shuffleWake must be true or false"):
            shuffle_wake_setting(spark)
    finally:
        spark.conf.unset(SHUFFLE_WAKE_CONF)


def test_without_the_class_the_query_keeps_its_trigger(spark, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(input_wake, "WAKE_CLASS", "io.streamops.spark.Missing")
    batches: list[tuple[int, float]] = []
    queue, query = _parquet_query(spark, tmp_path, batches, {"processingTime": LONG_TRIGGER})
    try:
        with caplog.at_level("INFO", logger="stream_ops.spark.input_wake"):
            assert wake_on_input(spark, query, queue, producers=1) is None
        assert "waits for its trigger" in caplog.text
    finally:
        query.stop()
