"""Compile a stage into a Spark streaming query and its per-batch DataFrame work.

A task is one ``readStream`` of its input queue directory with a ``foreachBatch`` callback;
the callback (the runtime's commit protocol) asks this module for the batch's results:

* source stage: records parsed against the source schema (malformed ones kept in a corrupt
  column), each/map/filter applied in ``mapInArrow``, and a partial aggregate per key computed
  by Spark, collected to the driver together with the dead letters and the input count;
* keyed stage: the shuffled partial aggregates combined per key by Spark.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from stream_ops.hashing import encode_key
from stream_ops.operators.aggregators import aggregator_from_spec
from stream_ops.operators.record_pipeline import RecordPipeline, needs_driver
from stream_ops.topology.plan import OperationSpec, StageSpec

CORRUPT_COLUMN = "_corrupt_record"
_MISSING = object()
_ARROW_TYPES = {
    "string": pa.string(),
    "long": pa.int64(),
    "int": pa.int32(),
    "double": pa.float64(),
    "float": pa.float32(),
    "boolean": pa.bool_(),
}


def schema_ddl(fields: dict[str, str]) -> str:
    """Spark DDL such as ``sentence string, n long``."""
    return ", ".join(f"`{name}` {typ}" for name, typ in fields.items())


def start_stage_query(
    spark: SparkSession,
    *,
    stage: StageSpec,
    input_dir: Path,
    checkpoint_dir: Path,
    query_name: str,
    on_batch: Callable[[DataFrame, int], None],
    trigger_seconds: float,
    max_files_per_trigger: int,
    max_file_age: str = "7d",
) -> StreamingQuery:
    """Start the streaming query of one task; ``on_batch(df, txid)`` runs per micro-batch.

    ``max_file_age`` is Spark's ``maxFileAge``: a file whose modification time is older than
    the newest file seen by more than this is never read (published batch files are touched
    when published, so only files landed with old times are concerned).
    """
    fields = dict(stage.input_fields)
    reader = spark.readStream.option("maxFilesPerTrigger", max_files_per_trigger).option("maxFileAge", max_file_age)
    if stage.reads_source:
        fields[CORRUPT_COLUMN] = "string"
        reader = reader.option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", CORRUPT_COLUMN)
    df = reader.schema(schema_ddl(fields)).json(str(input_dir))
    return (
        df.writeStream.queryName(query_name)
        .foreachBatch(on_batch)
        .option("checkpointLocation", str(checkpoint_dir))
        .trigger(processingTime=f"{trigger_seconds} seconds")
        .start()
    )


@dataclass(frozen=True)
class SourceBatchResult:
    """What a source-stage batch produced, collected to the driver."""

    partials: list[tuple[str, Any]]
    """(encoded key, partial aggregate) per key, for a stage that shuffles partials."""
    records: list[tuple[str | None, dict[str, Any]]]
    """(encoded key or None, record) per output record, for the other outputs."""
    dead_letters: list[dict[str, Any]]
    """{"record": ..., "error": ...} per bad record (repeated records repeated)."""
    input_rows: int


def _stage_rows(
    operations: tuple[OperationSpec, ...],
    mode: str,
    key_fields: tuple[str, ...],
    aggregator_spec: dict[str, Any] | None,
    value_type: str,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function of a source stage (runs in Spark's Python workers).

    ``mode`` is ``"partials"`` (emit key and the aggregator's value per output record),
    ``"records"`` (emit key and the record as JSON) or ``"raw"`` (emit the parsed input
    record as JSON, for stages whose operations run in the driver). Bad records come out as
    ``dead``; one extra row per Arrow batch carries the input count.
    """
    out_schema = pa.schema(
        [
            ("key", pa.string()),
            ("value", _ARROW_TYPES[value_type]),
            ("dead", pa.string()),
            ("inputs", pa.int64()),
            ("record", pa.string()),
        ]
    )

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        pipeline = RecordPipeline(operations if mode != "raw" else ())
        aggregator = aggregator_from_spec(aggregator_spec) if aggregator_spec else None
        for batch in batches:
            keys: list[str | None] = []
            values: list[Any] = []
            dead: list[str | None] = []
            recs: list[str | None] = []

            def add(key: str | None, value: Any, letter: str | None, rec: str | None) -> None:
                # called only within this iteration, so the lists of this batch are the ones bound
                keys.append(key)  # noqa: B023
                values.append(value)  # noqa: B023
                dead.append(letter)  # noqa: B023
                recs.append(rec)  # noqa: B023

            records = batch.to_pylist()
            # Trident combines partial aggregates before it shuffles: per Arrow batch, one row
            # per distinct key instead of one per output record.
            partial: dict[Any, Any] = {}
            for record in records:
                corrupt = record.pop(CORRUPT_COLUMN, None)
                if corrupt is not None:
                    add(None, None, json.dumps({"record": corrupt, "error": "does not parse against the source schema"}), None)
                    continue
                outputs, letter = pipeline.run(record)
                if letter is not None:
                    add(None, None, json.dumps({"record": record, "error": letter.error}, default=str), None)
                    continue
                for out in outputs:
                    try:
                        if mode == "partials":
                            assert aggregator is not None
                            key_values = tuple(out[f] for f in key_fields)
                            value = aggregator.init(out)
                            try:
                                slot: Any = key_values
                                previous = partial.get(slot, _MISSING)
                            except TypeError:  # unhashable key values (lists, dicts)
                                slot = encode_key(list(key_values))
                                previous = partial.get(slot, _MISSING)
                            partial[slot] = value if previous is _MISSING else aggregator.combine(previous, value)
                        else:
                            key = encode_key([out[f] for f in key_fields]) if key_fields else None
                            add(key, None, None, json.dumps(out, default=str))
                    except Exception as e:  # noqa: BLE001 - a bad field value must not stop the task
                        add(
                            None,
                            None,
                            json.dumps({"record": record, "error": f"{mode}: {type(e).__name__}: {e}"}, default=str),
                            None,
                        )
            for slot, value in partial.items():
                add(slot if isinstance(slot, str) else encode_key(list(slot)), value, None, None)
            add(None, None, None, None)
            inputs: list[int | None] = [None] * (len(keys) - 1) + [len(records)]
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array(keys, pa.string()),
                    pa.array(values, _ARROW_TYPES[value_type]),
                    pa.array(dead, pa.string()),
                    pa.array(inputs, pa.int64()),
                    pa.array(recs, pa.string()),
                ],
                schema=out_schema,
            )

    return run


def source_batch(df: DataFrame, stage: StageSpec) -> SourceBatchResult:
    """Run a source stage's operations (and partial aggregation) on one micro-batch."""
    driver_side = needs_driver(stage.operations)
    if stage.shuffle is not None and not driver_side:
        shuffle = stage.shuffle
        spark_fn = aggregator_from_spec(shuffle.aggregator).spark_function
        fn = _stage_rows(stage.operations, "partials", shuffle.key_fields, shuffle.aggregator, shuffle.value_type)
        out_ddl = f"key string, value {shuffle.value_type}, dead string, inputs long, record string"
        rows = (
            df.mapInArrow(fn, out_ddl)
            .groupBy("key", "dead")
            .agg(
                getattr(F, spark_fn)("value").alias("value"),
                F.count(F.lit(1)).alias("n"),
                F.sum("inputs").alias("inputs"),
                F.lit(None).cast("string").alias("record"),
            )
            .collect()
        )
    else:
        mode = "raw" if driver_side else "records"
        key_fields = stage.records.key_fields if (stage.records is not None and not driver_side) else ()
        fn = _stage_rows(stage.operations, mode, key_fields, None, "string")
        rows = (
            df.mapInArrow(fn, "key string, value string, dead string, inputs long, record string")
            .withColumn("n", F.lit(1))
            .collect()
        )
    partials: list[tuple[str, Any]] = []
    records: list[tuple[str | None, dict[str, Any]]] = []
    dead_letters: list[dict[str, Any]] = []
    input_rows = 0
    for row in rows:
        if row["dead"] is not None:
            dead_letters.extend([json.loads(row["dead"])] * int(row["n"]))
        elif row["inputs"] is not None:
            input_rows += int(row["inputs"] or 0)
        elif row["record"] is not None:
            records.append((row["key"], json.loads(row["record"])))
        elif row["key"] is not None:
            partials.append((row["key"], row["value"]))
    return SourceBatchResult(partials=partials, records=records, dead_letters=dead_letters, input_rows=input_rows)


def records_batch(df: DataFrame) -> list[tuple[str, str | None, dict[str, Any]]]:
    """The (stream tag, encoded key, record) rows of a records shuffle batch."""
    return [(row["stream"], row["key"], json.loads(row["record"])) for row in df.collect() if row["record"] is not None]


def keyed_batch(df: DataFrame, stage: StageSpec) -> tuple[list[tuple[str, Any]], int]:
    """Combine the shuffled partial aggregates of one micro-batch per key.

    Returns ((encoded key, combined partial) per key, number of shuffled rows read).
    """
    assert stage.state is not None
    spark_fn = aggregator_from_spec(stage.state.aggregator).spark_function
    rows = df.groupBy("key").agg(getattr(F, spark_fn)("value").alias("value"), F.count(F.lit(1)).alias("n")).collect()
    return [(row["key"], row["value"]) for row in rows if row["key"] is not None], sum(int(r["n"]) for r in rows)
