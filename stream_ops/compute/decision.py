"""Which path a batch is computed on, and why; the batch functions the task runner calls.

A source stage's batch takes one of four paths (:class:`ComputePath`), all giving the same
outputs, partials, dead letters and input count:

1. ``ARROW_ON_DRIVER`` (:mod:`~stream_ops.compute.arrow_on_driver`): its files (or a Kafka
   batch's offset ranges) read in Arrow and its SQL operations run as Arrow compute on the
   driver, no Spark job;
2. ``COLLECT_ON_DRIVER`` (:mod:`~stream_ops.compute.collect_on_driver`): parsed by Spark,
   collected in one job, its Python operations run on the driver;
3. ``ROW_PROCESSES`` (:mod:`~stream_ops.compute.row_processes`): read in Arrow, its per-record
   Python operations run in local processes;
4. ``SPARK`` (:mod:`~stream_ops.compute.in_spark`): ``mapInArrow`` in Spark's Python workers
   (or Spark alone for an all-SQL count).

:func:`choose_path` holds every rule that picks one; :func:`source_batch` gathers a batch's
facts, asks it, and runs the path it names. Every choice says why (:class:`PathChoice`, logged
at debug level per batch).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from stream_ops.compute.arrow_on_driver import arrow_batch
from stream_ops.compute.arrow_read import ArrowRefusal, read_in_arrow, read_offsets_in_arrow, table_batches
from stream_ops.compute.batch_inputs import noted_batch_files, noted_input, noted_offsets
from stream_ops.compute.collect_on_driver import collected_batch
from stream_ops.compute.in_spark import spark_batch, spark_batch_after_sql
from stream_ops.compute.jvm_sql import BatchAfterSql, sql_in_jvm, sql_operations, without_failing_rows
from stream_ops.compute.results import SourceBatchResult, stage_run
from stream_ops.compute.row_processes import row_processes, row_processes_batch
from stream_ops.compute.settings import SessionSettings, batch_settings
from stream_ops.compute.stage_function import typed_partials
from stream_ops.operators.aggregators import aggregator_from_spec
from stream_ops.operators.partials_combine import combine_partials
from stream_ops.operators.record_pipeline import needs_driver
from stream_ops.sources import source_kind
from stream_ops.sources.arrow_json import native_fields
from stream_ops.sources.base import SourceSpec
from stream_ops.topics.shuffle_files import read_partials, read_record_rows
from stream_ops.topology.plan import StageSpec

logger = logging.getLogger(__name__)

_PER_RECORD = ("each", "map", "filter", "peek")


class ComputePath(enum.Enum):
    """Where a source batch is computed."""

    ARROW_ON_DRIVER = "read in Arrow and computed on the driver"
    COLLECT_ON_DRIVER = "parsed by Spark and collected to the driver"
    ROW_PROCESSES = "read in Arrow, per-record operations in local processes"
    SPARK = "computed by Spark"


class Reason(enum.Enum):
    """Why a path was taken, or why the Arrow read was not tried."""

    ASKED = "the caller asked for it"
    WITHIN_ARROW_LIMIT = "its input is within spark.stream_ops.arrowBatchBytes"
    PER_RECORD_IN_PROCESSES = (
        "its per-record Python operations and input above spark.stream_ops.driverBatchBytes "
        "run in spark.stream_ops.rowProcesses local processes"
    )
    WITHIN_DRIVER_LIMIT = "its input is within spark.stream_ops.driverBatchBytes"
    ABOVE_DRIVER_LIMIT = "its input is above spark.stream_ops.driverBatchBytes: Spark's executors work in parallel"
    INPUT_UNKNOWN = "its input is not known (neither a file source's batch of local files nor offset ranges Spark logged)"
    WITHIN_DRIVER_RECORDS = "its offset ranges span at most spark.stream_ops.kafkaDriverRecords offsets"
    ABOVE_DRIVER_RECORDS = "its offset ranges span more than spark.stream_ops.kafkaDriverRecords offsets (0: none on the driver)"
    SOURCE_NOT_OFFSETS_READABLE = "its source kind does not read offset ranges on the driver"
    DRIVER_READ_REFUSED = "its offset ranges were tried on the driver and given back"
    SOURCE_NOT_ARROW_READABLE = "its source kind is not read in Arrow"
    ABOVE_ARROW_LIMIT = "its input is above spark.stream_ops.arrowBatchBytes"
    FIELDS_NOT_NATIVE = "a source field has a type the Arrow JSON reader does not read as Spark does"
    NO_ROW_PROCESSES = (
        "its per-record Python operations and input above spark.stream_ops.driverBatchBytes, and "
        "spark.stream_ops.rowProcesses is 0: Spark's Python workers run them in parallel, the driver on one thread"
    )


class PathSettings(Protocol):
    """The settings the rules read, each only when a rule needs it (:class:`~stream_ops.compute.settings.SessionSettings`)."""

    def arrow_batch_bytes(self) -> int: ...

    def driver_batch_bytes(self) -> int: ...

    def row_processes(self) -> int: ...

    def driver_records(self) -> int: ...


@dataclass(frozen=True)
class BatchFacts:
    """What :func:`choose_path` knows about one source batch."""

    stage: StageSpec
    input_bytes: int | None
    """The total size of the batch's input files, None when they are not known."""
    settings: PathSettings
    asked_on_driver: bool | None = None
    """The caller's choice: True collects the batch to the driver, False computes it in Spark."""
    arrow_refusal: ArrowRefusal | None = None
    """Why the Arrow read gave this batch back, once it was tried."""
    input_offsets: int | None = None
    """How many offsets the offset ranges Spark logged for the batch span (a Kafka batch: at
    least its records), None when they are not known; only for a batch without known files."""
    read_bytes: int | None = None
    """The Arrow size of a batch of offset ranges once read on the driver (None before)."""


@dataclass(frozen=True)
class PathChoice:
    """The path a batch takes, and why."""

    path: ComputePath
    reason: Reason
    not_arrow: Reason | ArrowRefusal | None = None
    """Why the batch is not computed from an Arrow read (None: it is, or the caller chose)."""
    input_bytes: int | None = None
    input_offsets: int | None = None
    processes: int = 0
    """Local processes of :attr:`ComputePath.ROW_PROCESSES`."""
    group_partials_on_driver: bool = False
    """On :attr:`ComputePath.SPARK`: typed partials are collected in Arrow and grouped on the
    driver rather than by Spark's ``groupBy``."""

    def __str__(self) -> str:
        if self.input_bytes is not None:
            size = f"{self.input_bytes} bytes"
        else:
            size = "unknown size" if self.input_offsets is None else f"{self.input_offsets} offsets"
        text = f"{self.path.value} ({size}): {self.reason.value}"
        if self.not_arrow is not None:
            text += f"; not from Arrow: {self.not_arrow.value}"
        if self.processes:
            text += f"; {self.processes} processes"
        if self.group_partials_on_driver:
            text += "; partials grouped on the driver"
        return text


def choose_path(batch: BatchFacts) -> PathChoice:
    """The path of one source batch, by these rules in order (a setting is read only when a
    rule needs it):

    * the caller's choice (``asked_on_driver``) decides alone;
    * a batch of offset ranges (``input_offsets``; its files unknown) is read on the driver and
      computed there in Arrow when its source kind is ``offsets_readable`` (a Kafka topic) and
      the ranges span at most ``kafkaDriverRecords`` offsets; any other, or one the read gave
      back (``arrow_refusal``), is computed by Spark. Once read (``read_bytes``), a stage with
      per-record Python operations runs them in ``rowProcesses`` local processes when the
      batch's Arrow size is above ``driverBatchBytes`` (with none, Spark computes it), as a
      file batch does;
    * a batch goes to an Arrow read when its input files are known, its source kind is
      ``arrow_readable`` (a FileTopic), its input is within ``arrowBatchBytes`` and every
      source field is read by the Arrow JSON reader as Spark reads it; a stage with per-record
      Python operations (``each``, ``map``, ``filter``, ``peek``; not one that queries state)
      and input above ``driverBatchBytes`` then runs them in ``rowProcesses`` local processes,
      or with none leaves the batch to Spark. The read itself may still give the batch back
      (``arrow_refusal``: a line or a value only Spark reads exactly, SQL without a translation);
    * otherwise a batch whose input is known and within ``driverBatchBytes`` is collected to
      the driver, and any other is computed by Spark, which groups the typed partials of a
      stage without SQL operations on the driver when its input is within ``arrowBatchBytes``
      (after SQL operations the frame's input is no longer the batch's files).
    """
    if batch.asked_on_driver is not None:
        path = ComputePath.COLLECT_ON_DRIVER if batch.asked_on_driver else ComputePath.SPARK
        return _in_jvm(batch, path, Reason.ASKED, None)
    if batch.input_bytes is None and batch.input_offsets is not None:
        return _offsets_rule(batch)
    if batch.arrow_refusal is not None:
        not_arrow: Reason | ArrowRefusal = batch.arrow_refusal
    else:
        arrow = _arrow_rule(batch)
        if isinstance(arrow, PathChoice):
            return arrow
        not_arrow = arrow
    size, settings = batch.input_bytes, batch.settings
    if size is not None and size <= settings.driver_batch_bytes():
        return _in_jvm(batch, ComputePath.COLLECT_ON_DRIVER, Reason.WITHIN_DRIVER_LIMIT, not_arrow)
    reason = Reason.INPUT_UNKNOWN if size is None else Reason.ABOVE_DRIVER_LIMIT
    return _in_jvm(batch, ComputePath.SPARK, reason, not_arrow)


def _offsets_rule(batch: BatchFacts) -> PathChoice:
    """The path of a batch known by its offset ranges: read and computed on the driver, or Spark."""
    source = batch.stage.source
    if batch.arrow_refusal is not None:
        return _in_jvm(batch, ComputePath.SPARK, Reason.DRIVER_READ_REFUSED, batch.arrow_refusal)
    if source is None or not source_kind(source.kind).offsets_readable:
        reason = Reason.SOURCE_NOT_OFFSETS_READABLE
        return _in_jvm(batch, ComputePath.SPARK, reason, reason)
    settings = batch.settings
    bound = settings.driver_records()
    if bound == 0 or batch.input_offsets is None or batch.input_offsets > bound:
        return _in_jvm(batch, ComputePath.SPARK, Reason.ABOVE_DRIVER_RECORDS, Reason.ABOVE_DRIVER_RECORDS)
    offsets = batch.input_offsets
    size = batch.read_bytes
    if size is not None and _runs_per_record(batch.stage) and size > settings.driver_batch_bytes():
        processes = settings.row_processes()
        if not processes:
            return _in_jvm(batch, ComputePath.SPARK, Reason.NO_ROW_PROCESSES, Reason.NO_ROW_PROCESSES)
        reason = Reason.PER_RECORD_IN_PROCESSES
        return PathChoice(ComputePath.ROW_PROCESSES, reason, input_offsets=offsets, processes=processes)
    return PathChoice(ComputePath.ARROW_ON_DRIVER, Reason.WITHIN_DRIVER_RECORDS, input_offsets=offsets)


def _arrow_rule(batch: BatchFacts) -> PathChoice | Reason:
    """The Arrow path the batch takes, or why it takes none."""
    stage, size, settings = batch.stage, batch.input_bytes, batch.settings
    source = stage.source
    if size is None:
        return Reason.INPUT_UNKNOWN
    if source is None or not source_kind(source.kind).arrow_readable:
        return Reason.SOURCE_NOT_ARROW_READABLE
    if size > settings.arrow_batch_bytes():
        return Reason.ABOVE_ARROW_LIMIT
    if not native_fields(source.fields):
        return Reason.FIELDS_NOT_NATIVE
    if _runs_per_record(stage) and size > settings.driver_batch_bytes():
        processes = settings.row_processes()
        if not processes:
            return Reason.NO_ROW_PROCESSES
        return PathChoice(ComputePath.ROW_PROCESSES, Reason.PER_RECORD_IN_PROCESSES, input_bytes=size, processes=processes)
    return PathChoice(ComputePath.ARROW_ON_DRIVER, Reason.WITHIN_ARROW_LIMIT, input_bytes=size)


def _in_jvm(batch: BatchFacts, path: ComputePath, reason: Reason, not_arrow: Reason | ArrowRefusal | None) -> PathChoice:
    """A path that parses the batch in Spark, with how its partials are grouped."""
    size, stage = batch.input_bytes, batch.stage
    grouped = (
        path is ComputePath.SPARK
        and not sql_operations(stage)
        and typed_partials(stage) is not None
        and size is not None
        and size <= batch.settings.arrow_batch_bytes()
    )
    return PathChoice(path, reason, not_arrow, size, batch.input_offsets, group_partials_on_driver=grouped)


def _runs_per_record(stage: StageSpec) -> bool:
    """Whether the stage runs Python per record in Spark's workers (a stage that queries state
    runs its operations on the driver either way)."""
    return not needs_driver(stage.operations) and any(op.kind in _PER_RECORD for op in stage.operations)


@dataclass(frozen=True)
class BatchPath:
    """The path of one source batch, with the batch read in Arrow when its path starts there."""

    choice: PathChoice
    table: pa.Table | None
    """The batch read in Arrow, its SQL operations done (paths 1 and 3), else None."""


def batch_path(df: DataFrame, stage: StageSpec, *, on_driver: bool | None = None) -> BatchPath:
    """The path of the source batch ``df`` and why (:func:`choose_path` over its noted input
    or offset ranges and its session's settings), reading it in Arrow when the rules send it
    there; a batch the read gives back is decided again, knowing why."""
    noted = noted_input(df)
    offsets = noted_offsets(df) if noted is None else None
    settings = batch_settings(df)
    facts = BatchFacts(
        stage,
        noted.bytes if noted is not None else None,
        settings,
        asked_on_driver=on_driver,
        input_offsets=offsets.offsets if offsets is not None else None,
    )
    choice = choose_path(facts)
    if choice.path not in (ComputePath.ARROW_ON_DRIVER, ComputePath.ROW_PROCESSES):
        return BatchPath(choice, None)
    if noted is not None:
        read = read_in_arrow(noted.files, stage, settings)
    else:
        assert offsets is not None
        read = read_offsets_in_arrow(offsets.ranges, stage, settings)
    if isinstance(read, ArrowRefusal):
        return BatchPath(choose_path(dataclasses.replace(facts, arrow_refusal=read)), None)
    if noted is None:  # its size is known now: the rules may send its per-record operations elsewhere
        choice = choose_path(dataclasses.replace(facts, read_bytes=read.nbytes))
        if choice.path not in (ComputePath.ARROW_ON_DRIVER, ComputePath.ROW_PROCESSES):
            return BatchPath(choice, None)
    return BatchPath(choice, read)


def source_batch(
    df: DataFrame,
    stage: StageSpec,
    *,
    on_driver: bool | None = None,
    sent_before: Mapping[int, float | None] | None = None,
) -> SourceBatchResult:
    """Run a source stage's operations (and partial aggregation) on one micro-batch, on the
    path :func:`choose_path` picks.

    ``on_driver``: True runs the Python operations on the driver after one Spark job collects
    the (SQL-processed) batch, False in Spark's Python workers; None lets the rules choose,
    trying an Arrow read first. All paths give the same outputs, partials, dead letters and
    input count. A SQL operation that fails on some records in the JVM sends them to the dead
    letters and computes the others in Spark (:func:`~stream_ops.compute.jvm_sql.without_failing_rows`).
    ``sent_before`` (per event-time window stage, the largest event time the task sent it in
    its earlier batches; None: not known) lets path 1 send records that cannot be late there as
    partials per (window, key) (:func:`~stream_ops.compute.arrow_on_driver.arrow_batch`).
    """
    path = batch_path(df, stage, on_driver=on_driver)
    choice = path.choice
    logger.debug("stage %s: a batch %s", stage.name, choice)
    if path.table is None:
        return _parsed_by_spark(df, stage, choice)
    batches = table_batches(path.table, stage, max_records=batch_settings(df).max_records())
    if choice.path is ComputePath.ROW_PROCESSES:
        return row_processes_batch(batches, stage, stage_run(stage), processes=choice.processes)
    return arrow_batch(batches, stage, sent_before=sent_before)


def _parsed_by_spark(df: DataFrame, stage: StageSpec, choice: PathChoice) -> SourceBatchResult:
    """The batch ``df`` (parsed by Spark) with its SQL operations in the JVM, then on ``choice``'s path."""
    grouped = choice.group_partials_on_driver

    def in_spark(data: DataFrame) -> SourceBatchResult:
        return spark_batch(data, stage, group_partials_on_driver=grouped)

    def after_sql(data: DataFrame) -> SourceBatchResult:
        return spark_batch_after_sql(data, stage, group_partials_on_driver=grouped)

    on_driver = choice.path is ComputePath.COLLECT_ON_DRIVER
    sql = sql_operations(stage)
    if not sql:
        return collected_batch(df, stage) if on_driver else in_spark(df)
    then: BatchAfterSql = (lambda data: collected_batch(data, stage)) if on_driver else after_sql
    try:
        return sql_in_jvm(df, sql, then)
    except (PySparkException, Py4JJavaError) as e:
        result = without_failing_rows(df, stage, sql, e, in_spark)
        if result is None:
            raise  # not an expression failing on a record
        return result


def start_row_processes(spark: SparkSession, stage: StageSpec) -> None:
    """Start the local processes a source stage's large Arrow-read batches will run their
    per-record operations in, if :func:`choose_path`'s Arrow rule can send one there: they boot
    (~1 s) while its query starts rather than in its first large batch."""
    source = stage.source
    if source is None or not _runs_per_record(stage):
        return
    settings = SessionSettings(spark)
    if source_kind(source.kind).offsets_readable:
        if settings.driver_records() and settings.row_processes():
            row_processes(settings.row_processes())
        return
    if not source_kind(source.kind).arrow_readable or not native_fields(source.fields):
        return
    if not settings.arrow_batch_bytes():  # no Arrow read at all (read first, as the batch rule reads it)
        return
    # The smallest batch that may go to the processes: just above the driver-batch limit.
    just_above = BatchFacts(stage, settings.driver_batch_bytes() + 1, settings)
    choice = _arrow_rule(just_above)
    if isinstance(choice, PathChoice) and choice.path is ComputePath.ROW_PROCESSES:
        row_processes(choice.processes)


def driver_bounded(spark: SparkSession, source: SourceSpec) -> SourceSpec:
    """``source`` as a source stage's query reads it: a source read by offsets whose
    definition does not bound its batches gets batches of at most ``kafkaDriverRecords``
    offsets, so that every batch stays within :func:`choose_path`'s offsets rule and is
    computed on the driver (a backlog is read in several driver batches rather than one Spark
    job: reading and counting 100,000 records cost 0.3 s on the driver, and the Kafka word
    count's backlog of 200,000 sentences took 6.4 s to its last count in Spark's batches, about
    2 s in driver batches). 0 leaves the batches unbounded."""
    kind = source_kind(source.kind)
    if not kind.offsets_readable:
        return source
    bound = SessionSettings(spark).driver_records()
    return kind.with_batch_offsets_bound(source, bound) if bound else source


def records_batch(df: DataFrame) -> list[tuple[str, str | None, dict[str, Any]]]:
    """The (stream tag, encoded key, record) rows of a records shuffle batch: read from its
    JSON-lines files on the driver when they are noted (:mod:`stream_ops.compute.batch_inputs`),
    else collected from Spark (a Kafka shuffle, Spark's file source)."""
    files = noted_batch_files(df)
    if files is not None:
        return read_record_rows(files)
    return [(row["stream"], row["key"], json.loads(row["record"])) for row in df.collect() if row["record"] is not None]


def keyed_batch(df: DataFrame, stage: StageSpec) -> tuple[list[tuple[str, Any]], int]:
    """Combine the shuffled partial aggregates of one micro-batch per key.

    A batch of a Parquet partials query (its files noted, :mod:`stream_ops.compute.batch_inputs`)
    is read from its files with pyarrow and combined in Arrow
    (:func:`~stream_ops.operators.partials_combine.combine_partials`); any other DataFrame (JSON
    shuffle files, a Kafka shuffle) is combined by Spark.

    Returns ((encoded key, combined partial) per key, number of shuffled rows read).
    """
    spec = (
        stage.state.aggregator if stage.state is not None else stage.batch_aggregate.aggregator if stage.batch_aggregate else None
    )
    assert spec is not None, f"stage {stage.name} reads partials but has no aggregator"
    aggregator = aggregator_from_spec(spec)
    files = noted_batch_files(df)
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
