"""Compile a stage into a Spark streaming query.

A task is one ``readStream`` of its input (its source, or its shuffle queue) with a callback per
micro-batch (:mod:`stream_ops.spark.callback_sink`: ``foreachBatch``'s DataFrame, planned only
when used). A source whose kind reads a bare relation
(:meth:`~stream_ops.sources.base.SourceKind.open_stream`) has its projection applied to a batch
only when Spark plans it. The callback (the runtime's commit protocol) has each batch computed
by :mod:`stream_ops.compute`; this module wraps it so that the batch's input files are noted for
that computation while it runs (:mod:`stream_ops.compute.batch_inputs`): a source batch's files
and size, a keyed batch's Parquet shuffle files; and a source stage's batches their query's
settings (:func:`~stream_ops.compute.settings.noting_query_settings`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from stream_ops.compute.batch_inputs import batch_files_noted, noting_batch_files, noting_input_bytes
from stream_ops.compute.decision import driver_bounded, start_row_processes
from stream_ops.compute.settings import noting_query_settings
from stream_ops.helpers.spark_ddl import schema_ddl
from stream_ops.kafka.shuffle_reader import KafkaShuffleInput, read_shuffle_stream
from stream_ops.sources import source_kind
from stream_ops.spark.callback_sink import BatchShape, start_with_callback
from stream_ops.spark.input_wake import shuffle_wake_setting, wake_on_input
from stream_ops.spark.shuffle_queue import batch_files, read_queue_stream, round_wait_ms, shuffle_suffix, uses_queue_source
from stream_ops.topology.plan import StageSpec


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
    :func:`~stream_ops.compute.decision.keyed_batch`, which reads them itself; JSON-lines shuffles are read as JSON. A source stage's batches have their input
    size noted (file sources), so that :func:`~stream_ops.compute.decision.source_batch` can weigh and read them.
    A stage reading shuffle files with ``wake_producers`` upstream tasks starts its next batch
    as soon as each of them published a newer file (:mod:`stream_ops.spark.input_wake`), and
    with the queue source a batch waits for the rest of such a round, at most
    :func:`~stream_ops.spark.shuffle_queue.round_wait_ms`.
    """
    reads_shuffle_files = not stage.reads_source and kafka_input is None and input_dir is not None
    wakes = reads_shuffle_files and wake_producers > 0 and shuffle_wake_setting(spark)
    shape: BatchShape | None = None
    if stage.reads_source:
        assert stage.source is not None
        stream = source_kind(stage.source.kind).open_stream(
            spark,
            driver_bounded(spark, stage.source),
            queue,
            max_files_per_trigger=max_files_per_trigger,
            max_file_age=max_file_age,
        )
        df, shape = stream.raw, stream.shape
        on_batch = noting_query_settings(noting_input_bytes(on_batch, checkpoint_dir))
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
            on_batch = noting_batch_files(on_batch, checkpoint_dir)
        else:
            df = files.json(str(input_dir))
    writer = (
        df.writeStream.queryName(query_name)
        .option("checkpointLocation", str(checkpoint_dir))
        .trigger(processingTime=f"{trigger_seconds} seconds")
    )
    query = start_with_callback(spark, writer, on_batch, shape=shape)
    if wakes:
        assert input_dir is not None
        wake_on_input(spark, query, input_dir, wake_producers)
    return query


def _reading_queue_batches(
    on_batch: Callable[[DataFrame, int], None], stage: StageSpec, checkpoint_dir: Path, input_dir: Path, suffix: str
) -> Callable[[DataFrame, int], None]:
    """``on_batch`` over a shuffle queue read by the queue source (whose batches have no rows):
    Parquet partials are noted for :func:`~stream_ops.compute.decision.keyed_batch`, which reads them itself; JSON records
    are handed over as a batch read of exactly the batch's files (read by Spark only if used), noted for
    :func:`~stream_ops.compute.decision.records_batch`, which reads them on the driver."""

    def run(df: DataFrame, batch_id: int) -> None:
        files = batch_files(checkpoint_dir, batch_id, input_dir, suffix)
        if suffix == ".parquet":
            with batch_files_noted(df, files):
                on_batch(df, batch_id)
            return
        ddl = schema_ddl(stage.input_fields)
        session = df.sparkSession
        records = session.read.schema(ddl).json([str(f) for f in files]) if files else session.createDataFrame([], ddl)
        with batch_files_noted(records, files):
            on_batch(records, batch_id)

    return run
