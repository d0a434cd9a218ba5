"""A Kafka source stage's streaming query whose every batch is computed both ways, in a process
of its own (its SparkSession has Spark's Kafka connector, which the tests' shared session lacks).

Run by ``test_kafka_driver_path.py``: the query reads partition 0 of ``--topic`` as a task of the
source stage does (:func:`~stream_ops.compute.stage_query.start_stage_query`, so each batch's
offset ranges are noted from the checkpoint), and for each batch writes one JSON line to
``--out``: the offset ranges, the path :func:`~stream_ops.compute.decision.choose_path` chose and
why, the result of that path (:func:`~stream_ops.compute.decision.source_batch`) next to Spark's
(``on_driver=False``), and whether the rows the driver read
(:meth:`~stream_ops.sources.base.SourceKind.read_offsets`) are exactly the rows of Spark's
batch DataFrame. It stops when ``--stop`` exists.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

from stream_ops import Count, OpaqueMapState, Topology
from stream_ops.compute.batch_inputs import noted_offsets
from stream_ops.compute.decision import batch_path, source_batch
from stream_ops.compute.results import SourceBatchResult
from stream_ops.compute.settings import DRIVER_RECORDS_CONF
from stream_ops.compute.stage_query import start_stage_query
from stream_ops.dsl.build_plan import build_plan
from stream_ops.sources import CORRUPT_COLUMN, KafkaTopic, source_kind
from stream_ops.spark.session import create_spark_session
from stream_ops.topology.plan import StageSpec

logger = logging.getLogger("driver_parity")


def _stage(args: argparse.Namespace) -> StageSpec:
    options: dict[str, Any] = {"partitions": 1, "format": args.format, "encoding": args.encoding}
    if args.isolation:
        options["spark_options"] = {"isolation.level": args.isolation}
    if args.max_offsets:
        options["max_offsets_per_trigger"] = args.max_offsets
    t = Topology("driver-parity")
    if args.format == "json":
        source = t.source("in", KafkaTopic(args.bootstrap, args.topic, **options), schema={"sentence": "string"})
        grouped = source.select_expr("explode(split(sentence, ' ')) AS word").group_by("word")
    else:
        grouped = t.source("in", KafkaTopic(args.bootstrap, args.topic, **options)).group_by("value")
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


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--bootstrap", "--topic", "--checkpoint", "--out", "--stop"):
        parser.add_argument(name, required=True)
    parser.add_argument("--format", default="json")
    parser.add_argument("--encoding", default="utf8")
    parser.add_argument("--isolation", default="")
    parser.add_argument("--max-offsets", type=int, default=0)
    parser.add_argument("--driver-records", type=int, default=50_000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    logging.getLogger("stream_ops.compute").setLevel(logging.DEBUG)
    spark = create_spark_session(
        master="local[2]",
        app_name="driver-parity",
        conf={DRIVER_RECORDS_CONF: str(args.driver_records), "spark.ui.enabled": "false"},
        kafka_connector=True,
    )
    stage = _stage(args)
    assert stage.source is not None
    kind = source_kind(stage.source.kind)
    out = Path(args.out)

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
        line = {
            "batch": batch_id,
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

    query = start_stage_query(
        spark,
        stage=stage,
        queue=0,
        input_dir=None,
        checkpoint_dir=Path(args.checkpoint),
        query_name="driver_parity",
        on_batch=on_batch,
        trigger_seconds=0.2,
        max_files_per_trigger=1,
    )
    try:
        while not Path(args.stop).exists():
            if query.exception() is not None:
                raise RuntimeError(f"the query failed: {query.exception()}")
            time.sleep(0.1)
    finally:
        query.stop()
        spark.stop()


if __name__ == "__main__":
    main()
