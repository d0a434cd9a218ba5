"""The sink that hands a task its micro-batches unplanned (``spark/callback_sink.py``,
``CallbackSink.java``), on real streaming queries over JSON files.

A batch the callback uses gives the rows ``foreachBatch`` gives, with the same batch ids; a
batch it does not use is never planned, nor its session made (a used one is the batch's own); a
query started with a ``shape`` plans its batches without it and hands the callback the shaped
batch, with or without the JVM class; without the JVM class the query runs on
``foreachBatch``; a failing callback fails the query with its Python error; and no
registration outlives a query's start.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stream_ops.spark import callback_sink
from stream_ops.spark.callback_sink import SINK, BatchFrame, start_with_callback
from stream_ops.spark.jvm_classes import jvm_class


def _write_input(directory: Path, files: int, per_file: int) -> list[dict[str, object]]:
    directory.mkdir(parents=True, exist_ok=True)
    records = []
    for f in range(files):
        lines = []
        for i in range(per_file):
            record = {"word": f"w{f}-{i}", "n": f * per_file + i}
            records.append(record)
            lines.append(json.dumps(record))
        (directory / f"part-{f:03d}.json").write_text("\n".join(lines) + "\n")
    return records


def _writer(spark, source: Path, checkpoint: Path, name: str):
    frame = spark.readStream.option("maxFilesPerTrigger", 1).schema("word string, n long").json(str(source))
    return frame.writeStream.queryName(name).option("checkpointLocation", str(checkpoint)).trigger(processingTime="0.1 seconds")


def _run(spark, tmp_path: Path, name: str, on_batch, *, foreach_batch: bool = False, shape=None, plans=None) -> dict:
    writer = _writer(spark, tmp_path / "in", tmp_path / f"checkpoint-{name}", name)
    if foreach_batch:
        query = writer.foreachBatch(on_batch).start()
    else:
        query = start_with_callback(spark, writer, on_batch, shape=shape)
    try:
        query.processAllAvailable()
        if plans is not None:  # the logical plan Spark analysed, optimised and planned for the last batch
            plans.append(query._jsq.streamingQuery().lastExecution().analyzed().toString())
        return query.lastProgress
    finally:
        query.stop()


def _doubled(df):
    from pyspark.sql import functions as F

    return df.select(F.upper("word").alias("word"), (F.col("n") * 2).alias("n"))


def test_a_used_batch_holds_what_foreach_batch_gives(spark, tmp_path):
    expected = _write_input(tmp_path / "in", files=3, per_file=50)
    seen: dict[str, dict[int, list]] = {"sink": {}, "foreachBatch": {}}

    def collect(into: str):
        def run(df, batch_id):
            seen[into][batch_id] = sorted((r["word"], r["n"]) for r in df.collect())
            if into == "sink":
                assert isinstance(df, BatchFrame) and df.planned

        return run

    progress = _run(spark, tmp_path, "sink-rows", collect("sink"))
    _run(spark, tmp_path, "foreach-rows", collect("foreachBatch"), foreach_batch=True)
    assert "CallbackSink" in progress["sink"]["description"]
    assert seen["sink"] == seen["foreachBatch"]
    assert sorted(seen["sink"]) == [0, 1, 2]  # one file a batch, same batch ids
    assert sorted(row for rows in seen["sink"].values() for row in rows) == sorted((r["word"], r["n"]) for r in expected)


def test_a_batch_the_callback_does_not_use_is_never_planned(spark, tmp_path):
    _write_input(tmp_path / "in", files=2, per_file=10)
    batches: list[tuple[int, bool, object]] = []

    def note(df, batch_id):
        batches.append((batch_id, df.planned, df.sparkSession))

    _run(spark, tmp_path, "sink-unplanned", note)
    assert [(b, planned) for b, planned, _ in batches] == [(0, False), (1, False)]
    assert all(session is not None for _, _, session in batches)


def test_a_batch_session_is_made_only_when_used_and_is_the_batch_own(spark, tmp_path):
    _write_input(tmp_path / "in", files=2, per_file=10)
    made: list[bool] = []
    sessions: list[tuple[object, object]] = []

    def note(df, batch_id):
        made.append(df.session_made)
        if batch_id == 1:  # this batch uses its session: the clone Spark runs the batch in
            session = df.sparkSession
            sessions.append((session._jsparkSession, df._streaming.sparkSession()))
            assert session.range(3).count() == 3

    _run(spark, tmp_path, "sink-session", note)
    assert made == [False, False]
    [(batch_session, streaming_session)] = sessions
    assert batch_session.equals(streaming_session)
    assert not batch_session.equals(spark._jsparkSession)


@pytest.mark.parametrize("sink_class", [True, False], ids=["sink", "foreachBatch"])
def test_a_shaped_query_plans_its_batches_bare_and_hands_over_the_shaped_rows(spark, tmp_path, monkeypatch, sink_class):
    records = _write_input(tmp_path / "in", files=2, per_file=10)
    if not sink_class:
        monkeypatch.setattr(callback_sink, "jvm_class", lambda session, name: None)
    seen: dict[int, list] = {}
    unplanned: list[bool] = []

    def collect(df, batch_id):
        if isinstance(df, BatchFrame):
            unplanned.append(not df.planned)
        seen[batch_id] = sorted((r["word"], r["n"]) for r in df.collect())

    plans: list[str] = []
    _run(spark, tmp_path, f"shaped-{sink_class}", collect, shape=_doubled, plans=plans)
    assert sorted(row for rows in seen.values() for row in rows) == sorted(
        (str(r["word"]).upper(), 2 * int(str(r["n"]))) for r in records
    )
    assert sorted(seen) == [0, 1]
    assert unplanned == ([True, True] if sink_class else [])
    [plan] = plans
    assert "upper" not in plan.lower(), plan  # Spark planned the relation alone


def test_without_the_sink_class_the_query_runs_on_foreach_batch(spark, tmp_path, monkeypatch):
    _write_input(tmp_path / "in", files=1, per_file=5)
    monkeypatch.setattr(callback_sink, "jvm_class", lambda session, name: None)
    rows: list[int] = []
    progress = _run(spark, tmp_path, "fallback", lambda df, batch_id: rows.append(df.count()))
    assert rows == [5]
    assert "ForeachBatchSink" in progress["sink"]["description"]


def test_a_failing_callback_fails_the_query_with_its_python_error(spark, tmp_path):
    _write_input(tmp_path / "in", files=1, per_file=5)

    def fail(df, batch_id):
        raise ValueError("the callback refuses batch 0")

    writer = _writer(spark, tmp_path / "in", tmp_path / "checkpoint-fail", "failing")
    query = start_with_callback(spark, writer, fail)
    try:
        with pytest.raises(Exception, match="the callback refuses batch 0"):
            query.processAllAvailable()
        assert "ValueError: the callback refuses batch 0" in str(query.exception())
    finally:
        query.stop()


def test_no_callback_stays_registered_after_a_start(spark, tmp_path):
    sink = jvm_class(spark, SINK)
    _write_input(tmp_path / "in", files=1, per_file=5)
    writer = _writer(spark, tmp_path / "in", tmp_path / "checkpoint-a", "registered-once")
    query = start_with_callback(spark, writer, lambda df, batch_id: None)
    try:
        assert sink.registered() == 0  # the sink took it
        again = _writer(spark, tmp_path / "in", tmp_path / "checkpoint-b", "registered-once")
        with pytest.raises(Exception, match="already active"):
            start_with_callback(spark, again, lambda df, batch_id: None)
        assert sink.registered() == 0  # the failed start left nothing behind
    finally:
        query.stop()
