"""Kafka source stages' streaming queries whose every batch is computed both ways, in a process
of its own (its SparkSession has Spark's Kafka connector, which the tests' shared session lacks).

Run by ``test_kafka_driver_path.py`` with ``--runs``, a JSON file listing one query per test
(topic, checkpoint, output file and the source's options), so the tests share one Spark JVM:
each query runs in a session of its own (``newSession()``, for its own
``spark.stream_ops.kafkaDriverRecords``) and reads partition 0 of its topic as a task of the
source stage does (:func:`~stream_ops.compute.stage_query.start_stage_query`, so each batch's
offset ranges are noted from the checkpoint). For each batch it writes one JSON line to the
run's ``out``: the offset ranges, the path :func:`~stream_ops.compute.decision.choose_path`
chose and why, the result of that path (:func:`~stream_ops.compute.decision.source_batch`) next
to Spark's (``on_driver=False``), and whether the rows the driver read
(:meth:`~stream_ops.sources.base.SourceKind.read_offsets`) are exactly the rows of Spark's batch
DataFrame, and the logical plan Spark planned for the batch (the query reads Spark's Kafka relation
alone; the source's projection is applied only to a batch Spark computes). A query marked
``upgraded`` continues a checkpoint that a query with the projection in its streaming plan
began, as a task's checkpoint from before the bare relation. It stops when ``--stop`` exists.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from stream_ops import Count, OpaqueMapState, Topology
from stream_ops.compute.batch_inputs import noted_offsets
from stream_ops.compute.decision import batch_path, driver_bounded, source_batch
from stream_ops.compute.results import SourceBatchResult
from stream_ops.compute.settings import DRIVER_RECORDS_CONF
from stream_ops.compute.stage_query import start_stage_query
from stream_ops.dsl.build_plan import build_plan
from stream_ops.sources import CORRUPT_COLUMN, KafkaTopic, source_kind
from stream_ops.spark.callback_sink import start_with_callback
from stream_ops.spark.session import create_spark_session
from stream_ops.topology.plan import StageSpec

logger = logging.getLogger("driver_parity")


@dataclass(frozen=True)
class ParityQuery:
    """One query of ``--runs``: its topic, files and the Kafka source's options."""

    name: str
    topic: str
    checkpoint: str
    out: str
    format: str = "json"
    encoding: str = "utf8"
    isolation: str = ""
    max_offsets: int = 0
    driver_records: int = 50_000
    upgraded: bool = False
    """Its checkpoint begun by a query of the form before the bare relation (the source's
    projection in the streaming plan), run to the topic's end and stopped first."""


def _stage(bootstrap: str, run: ParityQuery) -> StageSpec:
    options: dict[str, Any] = {"partitions": 1, "format": run.format, "encoding": run.encoding}
    if run.isolation:
        options["spark_options"] = {"isolation.level": run.isolation}
    if run.max_offsets:
        options["max_offsets_per_trigger"] = run.max_offsets
    t = Topology(f"driver-parity-{run.name}")
    if run.format == "json":
        source = t.source("in", KafkaTopic(bootstrap, run.topic, **options), schema={"sentence": "string"})
        grouped = source.select_expr("explode(split(sentence, ' ')) AS word").group_by("word")
    else:
        grouped = t.source("in", KafkaTopic(bootstrap, run.topic, **options)).group_by("value")
    grouped.persistent_aggregate(Count(), out="n", state=OpaqueMapState)
    return build_plan(t).stage(0)


def _result(result: SourceBatchResult) -> dict[str, Any]:
    """A batch result in a form that compares regardless of the order of keys and letters."""
    return {
        "outputs": {str(i): sorted(json.dumps(item, default=str) for item in items) for i, items in result.outputs.items()},
        "dead": sorted(json.dumps(letter, sort_keys=True, default=str) for letter in result.dead_letters),
        "input_rows": result.input_rows,
        "inputs": None if result.inputs is None else sorted(json.dumps(r, sort_keys=True, default=str) for r in result.inputs),
    }


def _spark_rows(df: Any) -> tuple[list[dict[str, Any]], bool]:
    """The rows of Spark's batch (without the corrupt column), and whether any was corrupt."""
    rows = [row.asDict(recursive=True) for row in df.collect()]
    corrupt = any(row.get(CORRUPT_COLUMN) is not None for row in rows)
    for row in rows:
        row.pop(CORRUPT_COLUMN, None)
    return sorted(rows, key=lambda r: r["kafka_offset"]), corrupt


def _run_projected_query(session: SparkSession, stage: StageSpec, checkpoint: Path) -> None:
    """Run the query a source task started before its plan was bare (the projection in the
    streaming plan) over everything in the topic now, and stop it."""
    assert stage.source is not None
    projected = source_kind(stage.source.kind).read_stream(
        session, driver_bounded(session, stage.source), 0, max_files_per_trigger=1, max_file_age="7d"
    )
    writer = projected.writeStream.option("checkpointLocation", str(checkpoint)).trigger(processingTime="0.2 seconds")
    query = start_with_callback(session, writer, lambda df, batch_id: None)
    try:
        query.processAllAvailable()
    finally:
        query.stop()


def _start(spark: SparkSession, bootstrap: str, run: ParityQuery) -> StreamingQuery:
    session = spark.newSession()
    session.conf.set(DRIVER_RECORDS_CONF, str(run.driver_records))
    stage = _stage(bootstrap, run)
    assert stage.source is not None
    kind = source_kind(stage.source.kind)
    out = Path(run.out)
    if run.upgraded:
        _run_projected_query(session, stage, Path(run.checkpoint))

    def on_batch(df: Any, batch_id: int) -> None:
        offsets = noted_offsets(df)
        choice = batch_path(df, stage).choice
        chosen = source_batch(df, stage)
        in_spark = source_batch(df, stage, on_driver=False)
        spark_rows, corrupt = _spark_rows(df)
        driver_rows = None
        if offsets is not None:
            table = kind.read_offsets(stage.source, offsets.ranges)
            driver_rows = None if table is None else sorted(table.to_pylist(), key=lambda r: r["kafka_offset"])
        streaming = getattr(df, "_streaming", None)  # the batch as Spark planned it (stream_ops' sink)
        line = {
            "batch": batch_id,
            "spark_plan": None if streaming is None else streaming.queryExecution().analyzed().toString(),
            "ranges": None if offsets is None else [[r.topic, r.partition, r.start, r.end] for r in offsets.ranges],
            "path": choice.path.name,
            "reason": choice.reason.name,
            "not_arrow": None if choice.not_arrow is None else choice.not_arrow.name,
            "chosen": _result(chosen),
            "spark": _result(in_spark),
            "spark_rows": len(spark_rows),
            "spark_corrupt": corrupt,
            "driver_read": driver_rows is not None,
            "rows_equal": None if driver_rows is None else driver_rows == spark_rows,
            "rows_diff": None
            if driver_rows is None or driver_rows == spark_rows
            else json.dumps([driver_rows[:3], spark_rows[:3]], default=str)[:4000],
        }
        with out.open("a", encoding="utf-8") as f:
            f.write(json.dumps(line, default=str) + "\n")

    return start_stage_query(
        session,
        stage=stage,
        queue=0,
        input_dir=None,
        checkpoint_dir=Path(run.checkpoint),
        query_name=f"driver_parity_{run.name}",
        on_batch=on_batch,
        trigger_seconds=0.2,
        max_files_per_trigger=1,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--bootstrap", "--runs", "--stop"):
        parser.add_argument(name, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    logging.getLogger("stream_ops.compute").setLevel(logging.DEBUG)
    runs = [ParityQuery(**run) for run in json.loads(Path(args.runs).read_text(encoding="utf-8"))]
    spark = create_spark_session(
        master="local[2]", app_name="driver-parity", conf={"spark.ui.enabled": "false"}, kafka_connector=True
    )
    queries = [_start(spark, args.bootstrap, run) for run in runs]
    try:
        while not Path(args.stop).exists():
            for query in queries:
                if query.exception() is not None:
                    raise RuntimeError(f"the query {query.name} failed: {query.exception()}")
            time.sleep(0.1)
    finally:
        for query in queries:
            query.stop()
        spark.stop()


if __name__ == "__main__":
    main()
