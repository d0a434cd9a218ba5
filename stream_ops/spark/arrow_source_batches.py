"""Source batches read and computed in Arrow on the driver: no Spark job for the batch.

A FileTopic batch's files are known before its callback runs (the file-source log entries its
offsets span, :func:`~stream_ops.spark.checkpoint.batch_input_files`). Rather than have Spark parse them (Jackson,
row by row, in the JVM) and hand the rows to Python, the driver reads them with pyarrow's
multi-threaded JSON reader (:mod:`stream_ops.sources.arrow_json`) and runs the stage's Spark
SQL operations as Arrow compute (:mod:`stream_ops.spark.sql_arrow`); the stage's Python
operations and partial aggregation then run on that table as they do for a small batch on the
driver. A large batch of a stage with per-record Python operations stays in Spark: its Python
workers run them on every core, where the driver runs them on one thread; on a local-mode
worker its Python runs in a pool of local processes instead (:data:`ROW_PROCESSES_CONF`,
:mod:`stream_ops.spark.row_processes`).

Either part may answer "not sure": a line Spark would mark corrupt or coerce, an expression
or a value outside the translated subset. The batch then runs in Spark exactly as before, so
this path never decides what a record means; it only skips the JVM where the answer is known to
be Spark's own. Batches above :data:`ARROW_BATCH_BYTES_CONF` of input also stay in Spark, whose
executors bound their memory.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from stream_ops.operators.record_pipeline import SQL_OPERATIONS, needs_driver
from stream_ops.sources import source_kind
from stream_ops.sources.arrow_json import native_fields, read_json_lines
from stream_ops.spark.driver_batches import bytes_setting, driver_batch_bytes, noted_input
from stream_ops.spark.row_processes import row_processes
from stream_ops.spark.settings import whole_number_setting
from stream_ops.spark.sql_arrow import COLLATION_CONF, ArrowSql, compile_arrow_sql
from stream_ops.topology.plan import OperationSpec, StageSpec

logger = logging.getLogger(__name__)

ARROW_BATCH_BYTES_CONF = "spark.stream_ops.arrowBatchBytes"
"""Spark setting: the largest total input size (bytes) of a source batch read in Arrow on the
driver; 0 turns the Arrow path off."""
DEFAULT_ARROW_BATCH_BYTES = 128 << 20
"""Its value when the session does not set it. A batch takes about 5x its input size of driver
memory at its peak (the file bytes, the parsed table, split columns and groups: 24 MB of word
count input peaked at 88 MB of Arrow memory besides its 24 MB of bytes)."""

ROW_PROCESSES_CONF = "spark.stream_ops.rowProcesses"
"""Spark setting: how many local processes run the per-record Python operations of a source
batch read in Arrow that is above :data:`~stream_ops.spark.driver_batches.DRIVER_BATCH_BYTES_CONF`;
0 leaves such batches to Spark. Unset: the cores of a local master (``local[N]``), else 0 (a
cluster's executors have more cores than the driver's machine)."""

MAX_RECORDS_CONF = "spark.sql.execution.arrow.maxRecordsPerBatch"
"""Spark's bound on the rows of one Arrow batch given to ``mapInArrow``; the Arrow path gives
the stage's batch functions batches of the same size."""

_COMPILED: dict[tuple[object, ...], ArrowSql | None] = {}
_COMPILED_LOCK = threading.Lock()


def arrow_batch_bytes(spark: SparkSession) -> int:
    """The session's :data:`ARROW_BATCH_BYTES_CONF` (:func:`~stream_ops.spark.driver_batches.bytes_setting`)."""
    return bytes_setting(spark, ARROW_BATCH_BYTES_CONF, DEFAULT_ARROW_BATCH_BYTES)


def max_records_per_batch(spark: SparkSession) -> int:
    """Spark's ``maxRecordsPerBatch`` (rows per Arrow batch; 0 or less: no bound)."""
    value = int(spark.conf.get(MAX_RECORDS_CONF, "10000") or 10000)
    return value if value > 0 else 1 << 62


@dataclass(frozen=True)
class ArrowInput:
    """A source batch read in Arrow (its SQL operations done), and where its per-record
    operations run."""

    table: pa.Table
    processes: int
    """Local processes for its per-record operations; 0: the driver's thread (none, or a
    batch within the driver-batch limit)."""


def arrow_input(df: DataFrame, stage: StageSpec) -> ArrowInput | None:
    """The source batch ``df`` of ``stage`` read in Arrow, after the stage's SQL operations, or
    None when Spark computes it (not a batch with noted files of an ``arrow_readable`` source
    kind, :attr:`~stream_ops.sources.SourceKind.arrow_readable`: a FileTopic's; too large, larger than
    the driver-batch limit with per-record Python operations and no local processes for them,
    a field type, expression or line the Arrow path does not reproduce exactly)."""
    noted = noted_input(df)
    source = stage.source
    if noted is None or source is None or not source_kind(source.kind).arrow_readable:
        return None
    spark = df.sparkSession
    if noted.bytes > arrow_batch_bytes(spark) or not native_fields(source.fields):
        return None
    processes = 0
    if _runs_per_record(stage) and noted.bytes > driver_batch_bytes(spark):
        processes = row_processes_setting(spark)
        if not processes:
            return None  # Spark's Python workers run them in parallel; the driver has one thread
    sql = [op for op in stage.operations if op.kind in SQL_OPERATIONS]
    compiled = _compiled(spark, source.fields, sql) if sql else None
    if sql and compiled is None:
        return None
    table = read_json_lines(noted.files, source.fields)
    if table is None:
        logger.debug("stage %s: a batch's files need Spark's JSON reader", stage.name)
        return None
    if compiled is not None:
        table = compiled.apply(table)
        if table is None:
            logger.debug("stage %s: a batch's values need Spark's SQL operations", stage.name)
            return None
    return ArrowInput(table, processes)


def row_processes_setting(spark: SparkSession) -> int:
    """The session's :data:`ROW_PROCESSES_CONF`.

    Raises:
        ConfigError: the setting is not a whole number of processes.
    """
    processes = whole_number_setting(spark, ROW_PROCESSES_CONF, meaning="a number of processes (0 leaves them to Spark)")
    if processes is None:
        master = spark.conf.get("spark.master", "") or ""
        return spark.sparkContext.defaultParallelism if master.startswith("local") else 0
    return processes


def start_row_processes(spark: SparkSession, stage: StageSpec) -> None:
    """Start the local processes a source stage's large Arrow-read batches will run their
    per-record operations in, if it has any: they boot (~1 s) while its query starts rather
    than in its first large batch."""
    source = stage.source
    if (
        source is None
        or not source_kind(source.kind).arrow_readable
        or not _runs_per_record(stage)
        or not native_fields(source.fields)
    ):
        return
    if arrow_batch_bytes(spark) and driver_batch_bytes(spark) < arrow_batch_bytes(spark):
        processes = row_processes_setting(spark)
        if processes:
            row_processes(processes)


def groups_on_driver(df: DataFrame) -> bool:
    """Whether the partials Spark's workers compute for the source batch ``df`` are grouped per
    key on the driver (collected in Arrow, no shuffle stage): its input is known and within
    :data:`ARROW_BATCH_BYTES_CONF`, the most of a batch the driver may hold. Spark's ``groupBy``
    cost ~0.2 s of a 0.6 s batch of 100k sentences; ungrouped partials are at most one row per
    key and Arrow batch."""
    noted = noted_input(df)
    return noted is not None and noted.bytes <= arrow_batch_bytes(df.sparkSession)


_PER_RECORD = ("each", "map", "filter", "peek")


def _runs_per_record(stage: StageSpec) -> bool:
    """Whether the stage runs Python per record in Spark's workers (a stage that queries state
    runs its operations on the driver either way)."""
    return not needs_driver(stage.operations) and any(op.kind in _PER_RECORD for op in stage.operations)


def _compiled(spark: SparkSession, fields: dict[str, str], sql: Sequence[OperationSpec]) -> ArrowSql | None:
    """The SQL operations compiled to Arrow once per process for their fields, expressions and
    the settings that change what they mean (not per session: a ``foreachBatch`` callback gets
    a new SparkSession object each batch, and compiling, a Spark analysis, took 30-75 ms)."""
    key = (
        tuple(fields.items()),
        tuple((op.kind, op.exprs) for op in sql),
        spark.conf.get("spark.sql.ansi.enabled", None),
        spark.conf.get(COLLATION_CONF, None),
    )
    with _COMPILED_LOCK:
        if key not in _COMPILED:
            try:
                _COMPILED[key] = compile_arrow_sql(spark, fields, sql)
            except Exception as e:  # noqa: BLE001 - Spark runs what Arrow cannot; it reports real errors
                logger.warning("SQL operations %s run in Spark: compiling them to Arrow failed: %s", [op.exprs for op in sql], e)
                _COMPILED[key] = None
            else:
                if _COMPILED[key] is None:
                    logger.info("SQL operations %s run in Spark: no exact Arrow translation", [op.exprs for op in sql])
        return _COMPILED[key]
