"""Compile a stage into a Spark streaming query and its per-batch DataFrame work.

A task is one ``readStream`` of its input queue directory with a callback per micro-batch
(:mod:`stream_ops.spark.callback_sink`: ``foreachBatch``'s DataFrame, planned only when used);
the callback (the runtime's commit protocol) asks this module for the batch's results:

* source stage: records parsed against the source schema (malformed ones kept in a corrupt
  column), the operation tree applied in ``mapInArrow``, and per stage output its records or
  its partial aggregate per key (computed by Spark when the stage has that one output),
  collected to the driver together with the dead letters and the input count; a small batch
  is parsed by Spark and collected first, the same operations then run on the driver
  (:mod:`stream_ops.spark.driver_batches`);
* keyed stage: the shuffled partial aggregates combined per key: read from the batch's Parquet
  shuffle files and combined in Arrow on the driver (no Spark job), or by Spark for JSON
  shuffle files (topologies submitted before Parquet shuffles) and shuffles through Kafka.
"""

from __future__ import annotations

import json
import logging
import operator
import weakref
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from stream_ops.arrow_types import ARROW_TYPES
from stream_ops.hashing import encode_key
from stream_ops.helpers.field_paths import value_at
from stream_ops.helpers.spark_ddl import schema_ddl
from stream_ops.kafka.shuffle_reader import KafkaShuffleInput, read_shuffle_stream
from stream_ops.operators.aggregators import aggregator_from_spec
from stream_ops.operators.arrow_batches import apply_isolating, arrow_schema
from stream_ops.operators.partials_combine import combine_partials
from stream_ops.operators.record_pipeline import (
    BATCH_OPERATIONS,
    SQL_OPERATIONS,
    ColumnValues,
    RecordPipeline,
    needs_driver,
)
from stream_ops.sources import CORRUPT_COLUMN, source_kind
from stream_ops.spark.arrow_source_batches import (
    arrow_input,
    groups_on_driver,
    max_records_per_batch,
    start_row_processes,
)
from stream_ops.spark.callback_sink import start_with_callback
from stream_ops.spark.checkpoint import batch_input_files
from stream_ops.spark.driver_batches import (
    arrow_rows,
    computes_on_driver,
    driver_rows,
    grouped_rows,
    local_path,
    noting_input_bytes,
)
from stream_ops.spark.input_wake import shuffle_wake_setting, wake_on_input
from stream_ops.spark.shuffle_queue import batch_files, read_queue_stream, round_wait_ms, shuffle_suffix, uses_queue_source
from stream_ops.topics.shuffle_files import read_partials
from stream_ops.topology.functions import resolve_function
from stream_ops.topology.plan import OperationSpec, ShuffleSpec, StageSpec

logger = logging.getLogger(__name__)

HEAD_OPERATIONS = SQL_OPERATIONS + BATCH_OPERATIONS

UNPARSED_ERROR = "does not parse against the source schema"
"""The dead-letter error of an input line that does not parse (its text is the record)."""

_MISSING = object()


def start_stage_query(
    spark: SparkSession,
    *,
    stage: StageSpec,
    queue: int,
    input_dir: Path | None,
    checkpoint_dir: Path,
    query_name: str,
    on_batch: Callable[[DataFrame, int], None],
    trigger_seconds: float,
    max_files_per_trigger: int,
    max_file_age: str = "7d",
    kafka_input: KafkaShuffleInput | None = None,
    wake_producers: int = 0,
) -> StreamingQuery:
    """Start the streaming query of one task; ``on_batch(df, txid)`` runs per micro-batch.

    ``max_file_age`` is Spark's ``maxFileAge``: a file whose modification time is older than
    the newest file seen by more than this is never read (published batch files are touched
    when published, so only files landed with old times are concerned). A source stage reads
    as its source kind says (:mod:`stream_ops.sources`); other stages read their shuffle queue
    ``input_dir`` with the queue source (:mod:`stream_ops.spark.shuffle_queue`: offsets per
    upstream task, the batch's files read by the callback), or with Spark's file source where
    the checkpoint was started with it or the queue source cannot be loaded; with
    ``kafka_input`` (the topology keeps its shuffle in Kafka) they read the rows of their
    queue's partition of the stage's shuffle topic, committed ones only
    (:mod:`stream_ops.kafka.shuffle_reader`), parsed against the same fields. A stage whose
    partials shuffle is Parquet (``stage.shuffle_format``) reads its ``*.parquet`` files: its
    batches' files (from the checkpoint's offsets or the file source's log) are noted for
    :func:`keyed_batch`, which reads them itself; JSON-lines shuffles are read as JSON. A source stage's batches have their input
    size noted (file sources), so that :func:`source_batch` computes small ones on the driver.
    A stage reading shuffle files with ``wake_producers`` upstream tasks starts its next batch
    as soon as each of them published a newer file (:mod:`stream_ops.spark.input_wake`), and
    with the queue source a batch waits for the rest of such a round, at most
    :func:`~stream_ops.spark.shuffle_queue.round_wait_ms`.
    """
    reads_shuffle_files = not stage.reads_source and kafka_input is None and input_dir is not None
    wakes = reads_shuffle_files and wake_producers > 0 and shuffle_wake_setting(spark)
    if stage.reads_source:
        assert stage.source is not None
        df = source_kind(stage.source.kind).read_stream(
            spark, stage.source, queue, max_files_per_trigger=max_files_per_trigger, max_file_age=max_file_age
        )
        on_batch = noting_input_bytes(on_batch, checkpoint_dir)
        start_row_processes(spark, stage)
    elif kafka_input is not None:
        df = read_shuffle_stream(spark, kafka_input.shuffle, topic=kafka_input.topic, queue=queue, fields=stage.input_fields)
    elif input_dir is not None and uses_queue_source(spark, checkpoint_dir):
        suffix = shuffle_suffix(stage)
        df = read_queue_stream(
            spark,
            input_dir,
            stage.input_fields,
            suffix=suffix,
            max_files_per_trigger=max_files_per_trigger,
            producers=wake_producers if wakes else 0,
            round_wait_ms=round_wait_ms(spark, trigger_seconds) if wakes else 0,
        )
        on_batch = _reading_queue_batches(on_batch, stage, checkpoint_dir, input_dir, suffix)
    else:
        files = (
            spark.readStream.option("maxFilesPerTrigger", max_files_per_trigger)
            .option("maxFileAge", max_file_age)
            .schema(schema_ddl(stage.input_fields))
        )
        if shuffle_suffix(stage) == ".parquet":
            df = files.option("pathGlobFilter", "*.parquet").parquet(str(input_dir))
            on_batch = _noting_batch_files(on_batch, checkpoint_dir)
        else:
            df = files.json(str(input_dir))
    writer = (
        df.writeStream.queryName(query_name)
        .option("checkpointLocation", str(checkpoint_dir))
        .trigger(processingTime=f"{trigger_seconds} seconds")
    )
    query = start_with_callback(spark, writer, on_batch)
    if wakes:
        assert input_dir is not None
        wake_on_input(spark, query, input_dir, wake_producers)
    return query


_BATCH_FILES: weakref.WeakKeyDictionary[DataFrame, list[Path]] = weakref.WeakKeyDictionary()
"""The input files of the batch DataFrames a Parquet partials query is handing to its callback
(``DataFrame.inputFiles()`` is empty for a ``foreachBatch`` DataFrame)."""


def _noting_batch_files(on_batch: Callable[[DataFrame, int], None], checkpoint_dir: Path) -> Callable[[DataFrame, int], None]:
    """``on_batch`` with each batch's files noted for :func:`keyed_batch` while it runs: the file-source
    log entries its offsets span (a replay re-plans the same ones)."""

    def run(df: DataFrame, batch_id: int) -> None:
        files = batch_input_files(checkpoint_dir, batch_id)
        paths = [local_path(uri) for uri in files] if files is not None else None
        if paths is not None and all(p is not None for p in paths):
            _BATCH_FILES[df] = [p for p in paths if p is not None]
        try:
            on_batch(df, batch_id)
        finally:
            _BATCH_FILES.pop(df, None)

    return run


def _reading_queue_batches(
    on_batch: Callable[[DataFrame, int], None], stage: StageSpec, checkpoint_dir: Path, input_dir: Path, suffix: str
) -> Callable[[DataFrame, int], None]:
    """``on_batch`` over a shuffle queue read by the queue source (whose batches have no rows):
    Parquet partials are noted for :func:`keyed_batch`, which reads them itself; JSON records
    are handed over as a batch read of exactly the batch's files."""

    def run(df: DataFrame, batch_id: int) -> None:
        files = batch_files(checkpoint_dir, batch_id, input_dir, suffix)
        if suffix == ".parquet":
            _BATCH_FILES[df] = files
            try:
                on_batch(df, batch_id)
            finally:
                _BATCH_FILES.pop(df, None)
            return
        ddl = schema_ddl(stage.input_fields)
        session = df.sparkSession
        records = session.read.schema(ddl).json([str(f) for f in files]) if files else session.createDataFrame([], ddl)
        on_batch(records, batch_id)

    return run


@dataclass(frozen=True)
class SourceBatchResult:
    """What a source-stage batch produced, collected to the driver."""

    outputs: dict[int, list[Any]]
    """Stage output index -> its records (dicts), or for a partials output its (encoded key,
    partial aggregate) pairs. Empty when ``inputs`` is set."""
    dead_letters: list[dict[str, Any]]
    """{"record": ..., "error": ...} per bad record (repeated records repeated)."""
    input_rows: int
    inputs: list[dict[str, Any]] | None = None
    """The parsed input records, when the stage's operations must run on the driver."""


@dataclass(frozen=True)
class _OutputPlan:
    """What the executors compute for one stage output."""

    index: int
    tap: int
    key_fields: tuple[str, ...] | None
    """Key fields of a partials output (pre-aggregated per key); None: whole records."""
    aggregator: dict[str, Any] | None


def _output_plans(stage: StageSpec) -> list[_OutputPlan]:
    plans = []
    for index, output in enumerate(stage.outputs):
        tap = stage.tap_of(output)
        if isinstance(output, ShuffleSpec):
            plans.append(_OutputPlan(index, tap, output.key_fields, output.aggregator))
        else:
            plans.append(_OutputPlan(index, tap, None, None))
    return plans


def _combine_into(partial: dict[Any, Any], aggregator: Any, key_values: tuple[Any, ...], value: Any) -> None:
    """Combine ``value`` into ``partial[key]`` (keys that cannot be hashed are encoded)."""
    try:
        slot: Any = key_values
        previous = partial.get(slot, _MISSING)
    except TypeError:  # unhashable key values (lists, dicts)
        slot = encode_key(list(key_values))
        previous = partial.get(slot, _MISSING)
    partial[slot] = value if previous is _MISSING else aggregator.combine(previous, value)


def _stage_rows(
    operations: tuple[OperationSpec, ...],
    outputs: list[_OutputPlan],
    mode: str,
    value_type: str,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function of a source stage (runs in Spark's Python workers).

    ``mode`` is ``"typed"`` (one partials output: its partial aggregate in the typed ``value``
    column, for Spark to combine), ``"outputs"`` (per output: a partials output's pre-aggregated
    partial as JSON, or each record as JSON, in ``record``, tagged with ``out``) or ``"raw"``
    (the parsed input record as JSON, for stages whose operations run on the driver). Trident
    combines partial aggregates before it shuffles: per Arrow batch, one row per output and
    distinct key instead of one per record. Bad records come out as ``dead``; one extra row per
    Arrow batch carries the input count.
    """
    out_schema = pa.schema(
        [
            ("out", pa.int32()),
            ("key", pa.string()),
            ("value", ARROW_TYPES[value_type]),
            ("dead", pa.string()),
            ("inputs", pa.int64()),
            ("record", pa.string()),
        ]
    )

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        pipeline = RecordPipeline(operations if mode != "raw" else (), [o.tap for o in outputs] if mode != "raw" else None)
        aggregators = {o.index: aggregator_from_spec(o.aggregator) for o in outputs if o.aggregator is not None}
        batch_operations = [
            (op, resolve_function(op.function, scope=op.code), arrow_schema(op.out))
            for op in operations
            if op.kind in BATCH_OPERATIONS
        ]
        counted = _arrow_count(operations, outputs, mode) if batch_operations else None
        tallied = _python_count(outputs, mode)
        # counting per the field the chain's last operation emits: its values alone, no records
        values_of = pipeline.field_values(tallied.fields[0]) if tallied is not None and tallied.single else None
        by_column = pipeline.column_values(tallied.fields[0]) if values_of is not None and tallied is not None else None
        for batch in batches:
            columns: tuple[list[Any], ...] = ([], [], [], [], [])

            def add(out: int | None, key: str | None, value: Any, letter: str | None, rec: str | None) -> None:
                # called only within this iteration, so the lists of this batch are the ones bound
                for column, item in zip(columns, (out, key, value, letter, rec), strict=True):  # noqa: B023
                    column.append(item)

            rows_read = batch.num_rows
            if batch_operations:
                batch, letters = _run_batch_operations(batch, batch_operations)
                for dead_letter in letters:
                    add(None, None, None, json.dumps(dead_letter, default=str), None)
            slots: list[Any] = []  # the key of each record a tallied output counts
            records: list[dict[str, Any]] = []
            if counted is not None:  # count per key in Arrow: no Python per record
                index, key_fields = counted
                grouped = pa.Table.from_batches([batch]).group_by(list(key_fields)).aggregate([([], "count_all")])
                for group in grouped.to_pylist():
                    add(index, encode_key([group[k] for k in key_fields]), group["count_all"], None, None)
            elif by_column is not None and by_column.field in batch.schema.names:  # no record per row
                slots, dead_texts = _column_slots(batch, by_column)
                for text in dead_texts:
                    add(None, None, None, text, None)
            else:
                records = batch.to_pylist()
            partials: dict[int, dict[Any, Any]] = {o.index: {} for o in outputs if o.key_fields is not None}
            for record in records:
                corrupt = record.pop(CORRUPT_COLUMN, None)
                if corrupt is not None:
                    error = {"record": corrupt, "error": UNPARSED_ERROR}
                    add(None, None, None, json.dumps(error), None)
                    continue
                if mode == "raw":
                    add(None, None, None, None, json.dumps(record, default=str))
                    continue
                if values_of is not None:
                    values, letter = values_of(record)
                    if letter is not None:
                        add(None, None, None, json.dumps({"record": record, "error": letter.error}, default=str), None)
                    else:
                        slots += values
                    continue
                by_tap, letter = pipeline.run_taps(record)
                if letter is not None:
                    add(None, None, None, json.dumps({"record": record, "error": letter.error}, default=str), None)
                    continue
                if tallied is not None:
                    try:
                        slots += [tallied.key_of(out) for out in by_tap[tallied.tap]]
                    except Exception as e:  # noqa: BLE001 - a missing key field must not stop the task
                        error = {"record": record, "error": f"partials: {type(e).__name__}: {e}"}
                        add(None, None, None, json.dumps(error, default=str), None)
                    continue
                # A record whose outputs fail to aggregate is dead-lettered whole, from every output.
                staged: list[tuple[int, Any, Any]] = []
                try:
                    for o in outputs:
                        for out in by_tap[o.tap]:
                            if o.key_fields is None:
                                staged.append((o.index, None, out))
                            else:
                                staged.append(
                                    (o.index, tuple(value_at(out, f) for f in o.key_fields), aggregators[o.index].init(out))
                                )
                except Exception as e:  # noqa: BLE001 - a bad field value must not stop the task
                    error = {"record": record, "error": f"partials: {type(e).__name__}: {e}"}
                    add(None, None, None, json.dumps(error, default=str), None)
                    continue
                for index, key_values, item in staged:
                    if key_values is None:
                        add(index, None, None, None, json.dumps(item, default=str))
                    else:
                        _combine_into(partials[index], aggregators[index], key_values, item)
            if tallied is not None:
                for slot, n in _tally(slots, partials[tallied.index], aggregators[tallied.index], tallied).items():
                    add(tallied.index, encode_key(list(tallied.values(slot))), n, None, None)
            for index, partial in partials.items():
                for slot, value in partial.items():
                    key = slot if isinstance(slot, str) else encode_key(list(slot))
                    if mode == "typed":
                        add(index, key, value, None, None)
                    else:
                        add(index, key, None, None, json.dumps(value, default=str))
            add(None, None, None, None, None)
            inputs: list[int | None] = [None] * (len(columns[0]) - 1) + [rows_read]
            out_col, keys, values, dead, recs = columns
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array(out_col, pa.int32()),
                    pa.array(keys, pa.string()),
                    pa.array(values, ARROW_TYPES[value_type]),
                    pa.array(dead, pa.string()),
                    pa.array(inputs, pa.int64()),
                    pa.array(recs, pa.string()),
                ],
                schema=out_schema,
            )

    return run


def _column_slots(batch: pa.RecordBatch, column: ColumnValues) -> tuple[list[Any], list[str]]:
    """The tallied key values a batch's records give when the chain's one per-record operation
    reads one input column (:meth:`RecordPipeline.column_values`), and its dead letters (JSON),
    in row order: what the record loop of :func:`_stage_rows` gives, without a record per row."""
    values_of = column.values_of
    names = batch.schema.names
    unparsed = batch.column(CORRUPT_COLUMN) if CORRUPT_COLUMN in names else None
    corrupt = unparsed.to_pylist() if unparsed is not None and unparsed.null_count < len(unparsed) else None
    slots: list[Any] = []
    letters: list[str] = []
    for i, value in enumerate(batch.column(column.field).to_pylist()):
        if corrupt is not None and corrupt[i] is not None:
            letters.append(json.dumps({"record": corrupt[i], "error": UNPARSED_ERROR}))
            continue
        try:
            slots += values_of(value)
        except Exception as e:  # noqa: BLE001 - user code may raise anything; it must not stop the task
            record = batch.slice(i, 1).to_pylist()[0]
            record.pop(CORRUPT_COLUMN, None)
            letters.append(json.dumps({"record": record, "error": column.dead_letter(record, e).error}, default=str))
    return slots, letters


def _tally(slots: list[Any], partial: dict[Any, Any], aggregator: Any, tallied: _Tally) -> dict[Any, int]:
    """The count of each key in ``slots``; keys that cannot be hashed (lists, dicts) are
    combined into ``partial`` instead, as any other partial."""
    try:
        return Counter(slots)
    except TypeError:
        tally: dict[Any, int] = {}
        for slot in slots:
            try:
                tally[slot] = tally.get(slot, 0) + 1
            except TypeError:
                _combine_into(partial, aggregator, tallied.values(slot), 1)
        return tally


@dataclass(frozen=True)
class _Tally:
    """A stage's one partials output when it counts per top-level key fields: the Python path
    then counts key values in a dict (no ``init``/``combine`` call per record)."""

    index: int
    tap: int
    key_of: Callable[[Any], Any]
    """The key of an output record: the value of the one key field, or a tuple of them."""
    fields: tuple[str, ...]

    @property
    def single(self) -> bool:
        return len(self.fields) == 1

    def values(self, slot: Any) -> tuple[Any, ...]:
        return (slot,) if self.single else tuple(slot)


def _python_count(outputs: list[_OutputPlan], mode: str) -> _Tally | None:
    if mode != "typed" or len(outputs) != 1:
        return None
    output = outputs[0]
    fields = output.key_fields
    if not fields or (output.aggregator or {}).get("kind") != "Count" or any("." in f for f in fields):
        return None
    return _Tally(output.index, output.tap, operator.itemgetter(*fields), fields)


def _arrow_count(
    operations: tuple[OperationSpec, ...], outputs: list[_OutputPlan], mode: str
) -> tuple[int, tuple[str, ...]] | None:
    """(output index, key fields) when the batch operations end the stage and its one output
    counts per top-level key: then Arrow counts each batch (``Table.group_by``)."""
    if mode != "typed" or len(outputs) != 1 or any(op.kind not in HEAD_OPERATIONS for op in operations):
        return None
    output = outputs[0]
    if output.key_fields is None or (output.aggregator or {}).get("kind") != "Count" or output.tap != len(operations) - 1:
        return None
    if not output.key_fields or any(k not in operations[-1].out for k in output.key_fields):
        return None
    return output.index, output.key_fields


def _run_batch_operations(
    batch: pa.RecordBatch, operations: list[tuple[OperationSpec, Any, pa.Schema]]
) -> tuple[pa.RecordBatch, list[dict[str, Any]]]:
    """The stage's ``map_batches`` functions over one Arrow batch, in order: (the batch they
    give, dead letters for lines that did not parse and rows a function fails on)."""
    letters: list[dict[str, Any]] = []
    if CORRUPT_COLUMN in batch.schema.names:
        parsed = pc.is_null(batch.column(CORRUPT_COLUMN))
        bad = batch.filter(pc.invert(parsed)).column(CORRUPT_COLUMN).to_pylist()
        letters += [{"record": text, "error": UNPARSED_ERROR} for text in bad]
        batch = batch.filter(parsed)
        batch = batch.select([name for name in batch.schema.names if name != CORRUPT_COLUMN])
    for op, fn, schema in operations:
        outputs, dead = apply_isolating(fn, batch, schema, op.function)
        letters += dead
        table = pa.Table.from_batches(outputs, schema=schema).combine_chunks()
        batch = table.to_batches()[0] if table.num_rows else pa.RecordBatch.from_pylist([], schema=schema)
    return batch, letters


def _typed_partials(stage: StageSpec) -> ShuffleSpec | None:
    """The stage's one output when Spark can combine its partials itself (the fast path)."""
    if len(stage.outputs) != 1 or needs_driver(stage.operations):
        return None
    output = stage.outputs[0]
    if not isinstance(output, ShuffleSpec) or aggregator_from_spec(output.aggregator).spark_function is None:
        return None
    return output


def source_batch(df: DataFrame, stage: StageSpec, *, on_driver: bool | None = None) -> SourceBatchResult:
    """Run a source stage's operations (and partial aggregation) on one micro-batch.

    The stage's leading Spark SQL operations (``select_expr``, ``where``) run first, in the
    JVM. If one fails on some record (an ANSI cast, a division by zero), the batch is split
    until the failing records are found; they go to the dead letters and the others are
    processed once, as if they had been the whole batch. The input count of such a stage
    counts the rows the SQL operations produce.

    ``on_driver``: True runs the Python operations on the driver after one Spark job collects
    the (SQL-processed) batch, False in Spark's Python workers; None first tries the Arrow path
    (:func:`~stream_ops.spark.arrow_source_batches.arrow_input`: a FileTopic batch read and its
    SQL operations run in Arrow, no Spark job), then decides by the batch's input size
    (:func:`~stream_ops.spark.driver_batches.computes_on_driver`). All give the same outputs,
    partials, dead letters and input count.
    """
    if on_driver is None:
        read = arrow_input(df, stage)
        if read is not None:
            return arrow_batch(read.table, stage, max_records=max_records_per_batch(df.sparkSession), processes=read.processes)
        on_driver = computes_on_driver(df)
    sql = [op for op in stage.operations if op.kind in SQL_OPERATIONS]
    if not sql:
        return _source_batch(df, stage, on_driver=on_driver)
    try:
        return _sql_batch(df, stage, sql, on_driver=on_driver)
    except (PySparkException, Py4JJavaError) as e:
        rows = df.collect()
        failing = _failing_rows(df.sparkSession, rows, df.schema, sql)
        if not failing:
            raise  # not an expression failing on a record
        logger.warning("stage %s: %d records make a SQL operation fail: %s", stage.name, len(failing), _first_line(e))
        kept = [row for i, row in enumerate(rows) if i not in failing]
        result = _source_batch(_with_sql(df.sparkSession.createDataFrame(kept, df.schema), sql), stage)
        letters = [{"record": rows[i].asDict(recursive=True), "error": failing[i]} for i in sorted(failing)]
        return SourceBatchResult(result.outputs, result.dead_letters + letters, result.input_rows, result.inputs)


def _sql_batch(df: DataFrame, stage: StageSpec, sql: list[OperationSpec], *, on_driver: bool) -> SourceBatchResult:
    """The stage's batch with its SQL operations in the JVM, reading the input once.

    Lines that did not parse are counted on the way (an observation, no extra pass) and only
    when there are some does a second job read their text for the dead letters: the
    micro-batch's input is computed anew by every job reading it, so a union of the parsed
    and the unparsed lines would parse the whole batch twice.
    """
    if CORRUPT_COLUMN not in df.columns:
        return _after_sql(_with_sql(df, sql), stage, on_driver=on_driver)
    unparsed = Observation()
    corrupt = F.col(CORRUPT_COLUMN)
    watched = df.observe(unparsed, F.count(corrupt).alias("n"))
    data = _with_sql(watched.where(corrupt.isNull()).drop(CORRUPT_COLUMN), sql)
    result = _after_sql(data, stage, on_driver=on_driver)
    if not unparsed.get["n"]:
        return result
    texts = [row[0] for row in df.where(corrupt.isNotNull()).select(corrupt).collect()]
    letters = [{"record": text, "error": UNPARSED_ERROR} for text in texts]
    return SourceBatchResult(result.outputs, result.dead_letters + letters, result.input_rows + len(texts), result.inputs)


def _after_sql(data: DataFrame, stage: StageSpec, *, on_driver: bool) -> SourceBatchResult:
    """The batch after its SQL operations: counted by Spark alone when it can, else the
    Python operations in Spark's workers, or on the driver (a small batch: collecting the
    rows is one job, where Spark's count is a shuffle)."""
    if on_driver:
        return _source_batch(data, stage, on_driver=True)
    return _jvm_partials(data, stage) or _source_batch(data, stage)


_JVM_KEY_TYPES = ("string", "bigint", "int", "boolean", "double")
"""Key column types whose Spark ``to_json`` text reads back as the value the Python path sees
(a 32-bit float does not: Python widens it)."""


def _jvm_partials(data: DataFrame, stage: StageSpec) -> SourceBatchResult | None:
    """The batch's partial counts computed by Spark alone, when nothing needs Python: every
    operation is SQL, the one output counts per key after them, and the keys encode alike in
    the JVM. None when that does not hold (the Python path runs instead).

    One Spark job groups the rows by encoded key (rows that did not parse by their text, as
    dead letters), like plain Spark's own partial aggregation before a shuffle.
    """
    output = _count_output(stage)
    if output is None:
        return None
    types = dict(data.dtypes)
    if any(types.get(k) not in _JVM_KEY_TYPES for k in output.key_fields) or len({types[k] for k in output.key_fields}) > 1:
        return None  # (an array needs one element type)
    key = F.to_json(F.array(*[F.col(f"`{k}`") for k in output.key_fields]))
    corrupt = F.col(CORRUPT_COLUMN) if CORRUPT_COLUMN in data.columns else F.lit(None).cast("string")
    rows = (
        data.groupBy(F.when(corrupt.isNull(), key).alias("key"), corrupt.alias("dead"))
        .agg(F.count(F.lit(1)).alias("n"))
        .collect()
    )
    counts: dict[str, int] = defaultdict(int)
    dead: list[dict[str, Any]] = []
    for row in rows:
        if row["dead"] is not None:
            dead.extend([{"record": row["dead"], "error": UNPARSED_ERROR}] * int(row["n"]))
        else:
            # Jackson's JSON and encode_key's differ in escapes and float spelling: re-encode
            # (per distinct key), merging keys that are one key there (0.0 and -0.0).
            counts[encode_key(json.loads(row["key"]))] += int(row["n"])
    return SourceBatchResult({0: list(counts.items())}, dead, sum(counts.values()) + len(dead))


def _with_sql(df: DataFrame, operations: list[OperationSpec]) -> DataFrame:
    """``df`` after the SQL operations; rows that did not parse keep their corrupt column."""
    corrupt = CORRUPT_COLUMN in df.columns
    good = df.where(F.col(CORRUPT_COLUMN).isNull()).drop(CORRUPT_COLUMN) if corrupt else df
    for op in operations:
        good = good.selectExpr(*op.exprs) if op.kind == "select_expr" else good.where(op.exprs[0])
    if not corrupt:
        return good
    nulls = [F.lit(None).cast(field.dataType).alias(field.name) for field in good.schema.fields]
    bad = df.where(F.col(CORRUPT_COLUMN).isNotNull()).select(*nulls, F.col(CORRUPT_COLUMN))
    return good.withColumn(CORRUPT_COLUMN, F.lit(None).cast("string")).unionByName(bad)


def _failing_rows(spark: SparkSession, rows: list[Any], schema: Any, operations: list[OperationSpec]) -> dict[int, str]:
    """Index -> error of the rows on which the SQL operations fail, found by halving."""
    failing: dict[int, str] = {}

    def check(indices: list[int]) -> None:
        if not indices:
            return
        try:
            frame = _with_sql(spark.createDataFrame([rows[i] for i in indices], schema), operations)
            frame.write.format("noop").mode("overwrite").save()  # evaluates every expression
        except (PySparkException, Py4JJavaError) as e:
            if len(indices) == 1:
                failing[indices[0]] = f"SQL operation: {_first_line(e)}"
                return
            middle = len(indices) // 2
            check(indices[:middle])
            check(indices[middle:])

    check(list(range(len(rows))))
    return failing


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def arrow_batch(table: pa.Table, stage: StageSpec, *, max_records: int, processes: int = 0) -> SourceBatchResult:
    """A source batch read in Arrow on the driver (its SQL operations done): counted per key
    in Arrow when the stage's operations are all SQL or batch functions, else the stage's
    function over it as for a small batch on the driver, or with ``processes`` in that many
    local processes. Batch functions see batches of at most ``max_records`` rows, as in
    Spark's workers; a stage without them takes the table (or a process its slice) as one
    batch (its per-batch partials are then the batch's)."""
    if not any(op.kind in BATCH_OPERATIONS for op in stage.operations):
        max_records = max(table.num_rows, 1)
    batches = table.combine_chunks().to_batches(max_chunksize=max_records)
    return _arrow_partials(batches, stage) or _source_batch(batches, stage, processes=processes)


def _count_output(stage: StageSpec, kinds: tuple[str, ...] = SQL_OPERATIONS) -> ShuffleSpec | None:
    """The stage's one output when every operation is of ``kinds`` and the output counts per
    key after them (Spark alone, or Arrow alone, can then compute the batch)."""
    if any(op.kind not in kinds for op in stage.operations) or len(stage.outputs) != 1:
        return None
    output = stage.outputs[0]
    if not isinstance(output, ShuffleSpec) or output.aggregator.get("kind") != "Count":
        return None
    if stage.tap_of(output) != len(stage.operations) - 1 or not output.key_fields:
        return None
    return output


def _arrow_partials(batches: list[pa.RecordBatch], stage: StageSpec) -> SourceBatchResult | None:
    """The batch's partial counts per key by one ``Table.group_by`` over the output of the
    stage's batch functions (run per batch, bad rows isolated as in Spark's workers), when
    nothing runs per record; keys encoded as the Python path encodes them."""
    output = _count_output(stage, HEAD_OPERATIONS)
    if output is None or not batches:
        return None
    keys = list(output.key_fields)
    operations = [
        (op, resolve_function(op.function, scope=op.code), arrow_schema(op.out))
        for op in stage.operations
        if op.kind in BATCH_OPERATIONS
    ]
    schema = operations[-1][2] if operations else batches[0].schema
    if any(k not in schema.names or pa.types.is_nested(schema.field(k).type) for k in keys):
        return None  # the Python path dead-letters what it cannot key
    input_rows = sum(batch.num_rows for batch in batches)
    letters: list[dict[str, Any]] = []
    if operations:
        produced = []
        for batch in batches:
            out, dead = _run_batch_operations(batch, operations)
            produced.append(out)
            letters += [json.loads(json.dumps(letter, default=str)) for letter in dead]
        batches = produced
    grouped = pa.Table.from_batches(batches, schema=schema).select(keys).group_by(keys).aggregate([([], "count_all")])
    counts: dict[str, int] = defaultdict(int)
    values = zip(*(grouped.column(k).to_pylist() for k in keys), strict=True)
    for key_values, n in zip(values, grouped.column("count_all").to_pylist(), strict=True):
        counts[encode_key(list(key_values))] += n  # merges keys that encode alike (0.0 and -0.0)
    return SourceBatchResult({0: list(counts.items())}, letters, input_rows)


def _source_batch(
    df: DataFrame | list[pa.RecordBatch], stage: StageSpec, *, on_driver: bool = False, processes: int = 0
) -> SourceBatchResult:
    """The stage's Python operations and partial aggregation over ``df``: ``mapInArrow`` in
    Spark's Python workers (a typed partial combined per key by Spark, or on the driver when
    the batch's input is known to fit there, :func:`groups_on_driver`), or the same function
    on the driver over the collected batch (``on_driver``) or over the Arrow batches ``df``
    (a batch read in Arrow on the driver; with ``processes``, in that many local processes)."""
    typed = _typed_partials(stage)
    columns = "out int, key string, value {}, dead string, inputs long, record string"
    rows: list[Any]
    if typed is not None:
        aggregator = aggregator_from_spec(typed.aggregator)
        spark_fn = aggregator.spark_function
        fn = _stage_rows(stage.operations, _output_plans(stage), "typed", typed.value_type)
        if isinstance(df, list):
            rows = arrow_rows(df, fn, aggregator, processes=processes)
        elif on_driver:
            rows = driver_rows(df, fn, aggregator)
        elif groups_on_driver(df):
            rows = grouped_rows(df.mapInArrow(fn, columns.format(typed.value_type)).toArrow(), aggregator)
        else:
            rows = (
                df.mapInArrow(fn, columns.format(typed.value_type))
                .groupBy("out", "key", "dead")
                .agg(
                    getattr(F, str(spark_fn))("value").alias("value"),
                    F.count(F.lit(1)).alias("n"),
                    F.sum("inputs").alias("inputs"),
                    F.lit(None).cast("string").alias("record"),
                )
                .collect()
            )
    else:
        mode = "raw" if needs_driver(stage.operations) else "outputs"
        fn = _stage_rows(stage.operations, _output_plans(stage), mode, "string")
        if isinstance(df, list):
            rows = arrow_rows(df, fn, None, processes=processes)
        elif on_driver:
            rows = driver_rows(df, fn, None)
        else:
            rows = df.mapInArrow(fn, columns.format("string")).withColumn("n", F.lit(1)).collect()
    outputs: dict[int, list[Any]] = {index: [] for index in range(len(stage.outputs))}
    combined: dict[int, dict[str, Any]] = defaultdict(dict)
    raw: list[dict[str, Any]] = []
    dead_letters: list[dict[str, Any]] = []
    input_rows = 0
    for row in rows:
        if row["dead"] is not None:
            dead_letters.extend([json.loads(row["dead"])] * int(row["n"]))
        elif row["inputs"] is not None:
            input_rows += int(row["inputs"] or 0)
        elif row["out"] is None and row["record"] is not None:
            raw.append(json.loads(row["record"]))
        elif row["key"] is not None and typed is not None:
            outputs[row["out"]].append((row["key"], row["value"]))
        elif row["key"] is not None:
            # a partial pre-aggregated per Arrow batch: combine the batches' partials per key
            index, value = row["out"], json.loads(row["record"])
            aggregator = aggregator_from_spec(stage.outputs[index].aggregator)
            partial = combined[index]
            partial[row["key"]] = aggregator.combine(partial[row["key"]], value) if row["key"] in partial else value
        elif row["record"] is not None:
            outputs[row["out"]].append(json.loads(row["record"]))
    for index, partial in combined.items():
        outputs[index].extend(partial.items())
    if typed is None and needs_driver(stage.operations):
        return SourceBatchResult(outputs={}, dead_letters=dead_letters, input_rows=input_rows, inputs=raw)
    return SourceBatchResult(outputs=outputs, dead_letters=dead_letters, input_rows=input_rows)


def records_batch(df: DataFrame) -> list[tuple[str, str | None, dict[str, Any]]]:
    """The (stream tag, encoded key, record) rows of a records shuffle batch."""
    return [(row["stream"], row["key"], json.loads(row["record"])) for row in df.collect() if row["record"] is not None]


def keyed_batch(df: DataFrame, stage: StageSpec) -> tuple[list[tuple[str, Any]], int]:
    """Combine the shuffled partial aggregates of one micro-batch per key.

    A batch of a Parquet partials query (:func:`start_stage_query`) is read from its files with
    pyarrow and combined in Arrow (:func:`~stream_ops.operators.partials_combine.combine_partials`);
    any other DataFrame (JSON shuffle files, a Kafka shuffle) is combined by Spark.

    Returns ((encoded key, combined partial) per key, number of shuffled rows read).
    """
    spec = (
        stage.state.aggregator if stage.state is not None else stage.batch_aggregate.aggregator if stage.batch_aggregate else None
    )
    assert spec is not None, f"stage {stage.name} reads partials but has no aggregator"
    aggregator = aggregator_from_spec(spec)
    files = _BATCH_FILES.get(df)
    if files is not None:  # the batch's Parquet shuffle files: read and combined here, no Spark job
        return combine_partials(read_partials(sorted(files), stage.input_fields["value"]), aggregator)
    spark_fn = getattr(aggregator, "spark_function", None)
    if spark_fn is not None:
        rows = df.groupBy("key").agg(getattr(F, spark_fn)("value").alias("value"), F.count(F.lit(1)).alias("n")).collect()
        return [(row["key"], row["value"]) for row in rows if row["key"] is not None], sum(int(r["n"]) for r in rows)
    # A user aggregator Spark cannot combine: combine the (few, pre-aggregated) partials here.
    combined: dict[str, Any] = {}
    count = 0
    for row in df.select("key", "value").collect():
        count += 1
        key, value = row["key"], row["value"]
        if key is None:
            continue
        combined[key] = aggregator.combine(combined[key], value) if key in combined else value
    return list(combined.items()), count
