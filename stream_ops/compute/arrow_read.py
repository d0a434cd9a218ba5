"""A source batch read in Arrow on the driver, its SQL operations run as Arrow compute.

A FileTopic batch's files are known before its callback runs (the file-source log entries its
offsets span, :mod:`stream_ops.compute.batch_inputs`). Rather than have Spark parse them (Jackson,
row by row, in the JVM) and hand the rows to Python, the driver reads them with pyarrow's
multi-threaded JSON reader (:mod:`stream_ops.sources.arrow_json`) and runs the stage's Spark
SQL operations as Arrow compute (:mod:`stream_ops.compute.sql_arrow`). Paths 1 and 3 of
:mod:`stream_ops.compute.decision` start here.

Either part may answer "not sure": a line Spark would mark corrupt or coerce, an expression
or a value outside the translated subset (:class:`ArrowRefusal`). The batch then runs in Spark
exactly as before, so this path never decides what a record means; it only skips the JVM where
the answer is known to be Spark's own.

A batch read by partition offsets (a Kafka topic's) is read the same way from the offset
ranges Spark logged for it, by its source kind (:func:`read_offsets_in_arrow`).
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from stream_ops.arrow_types import ARROW_TYPES
from stream_ops.compute.settings import SessionSettings
from stream_ops.compute.sql_arrow import ArrowSql, compile_arrow_sql
from stream_ops.operators.record_pipeline import BATCH_OPERATIONS, SQL_OPERATIONS
from stream_ops.sources import OffsetRange, source_kind
from stream_ops.sources.arrow_json import read_json_lines
from stream_ops.topology.plan import OperationSpec, StageSpec

logger = logging.getLogger(__name__)

_COMPILED: dict[tuple[object, ...], ArrowSql | None] = {}
_COMPILED_LOCK = threading.Lock()


class ArrowRefusal(enum.Enum):
    """Why the Arrow read gave a batch back to Spark."""

    SQL_NOT_TRANSLATED = "its SQL operations have no exact Arrow translation"
    LINES_NEED_SPARK = "its files hold a line only Spark's JSON reader reads as Spark does"
    VALUES_NEED_SPARK = "its values need Spark's SQL operations"
    RECORDS_NEED_SPARK = (
        "its offset ranges were not read on the driver exactly as Spark reads them (a key or value only Spark "
        "reads exactly, records no longer on the brokers, brokers not answering in time)"
    )


def read_in_arrow(files: Sequence[Path], stage: StageSpec, settings: SessionSettings) -> pa.Table | ArrowRefusal:
    """The source batch of ``files`` read in Arrow, after the stage's SQL operations (compiled
    under the batch's ``settings``), or why Spark must compute it instead."""
    source = stage.source
    assert source is not None, f"stage {stage.name} reads no source"
    sql = [op for op in stage.operations if op.kind in SQL_OPERATIONS]
    compiled = _compiled(settings, source.fields, sql) if sql else None
    if sql and compiled is None:
        return ArrowRefusal.SQL_NOT_TRANSLATED
    table = read_json_lines(files, source.fields)
    if table is None:
        logger.debug("stage %s: a batch's files need Spark's JSON reader", stage.name)
        return ArrowRefusal.LINES_NEED_SPARK
    if compiled is not None:
        table = compiled.apply(table)
        if table is None:
            logger.debug("stage %s: a batch's values need Spark's SQL operations", stage.name)
            return ArrowRefusal.VALUES_NEED_SPARK
    return table


def read_offsets_in_arrow(ranges: Sequence[OffsetRange], stage: StageSpec, settings: SessionSettings) -> pa.Table | ArrowRefusal:
    """The source batch of the offset ``ranges`` Spark planned for it read on the
    driver by its source kind (:meth:`~stream_ops.sources.base.SourceKind.read_offsets`), after
    the stage's SQL operations, or why Spark must compute it instead. The SQL is compiled over
    the source's scalar fields: an expression using another (Kafka's headers) fails to compile
    and leaves the batch to Spark."""
    source = stage.source
    assert source is not None, f"stage {stage.name} reads no source"
    sql = [op for op in stage.operations if op.kind in SQL_OPERATIONS]
    scalar = {name: typ for name, typ in source.fields.items() if typ in ARROW_TYPES}
    compiled = _compiled(settings, scalar, sql) if sql else None
    if sql and compiled is None:
        return ArrowRefusal.SQL_NOT_TRANSLATED
    table = source_kind(source.kind).read_offsets(source, ranges)
    if table is None:
        logger.debug("stage %s: a batch's offset ranges %s are left to Spark", stage.name, list(ranges))
        return ArrowRefusal.RECORDS_NEED_SPARK
    if compiled is not None:
        table = compiled.apply(table.select(list(scalar)))
        if table is None:
            logger.debug("stage %s: a batch's values need Spark's SQL operations", stage.name)
            return ArrowRefusal.VALUES_NEED_SPARK
    return table


def table_batches(table: pa.Table, stage: StageSpec, *, max_records: int) -> list[pa.RecordBatch]:
    """A batch read in Arrow as the Arrow batches the stage's function sees: at most
    ``max_records`` rows each when the stage has batch functions, as in Spark's workers; else
    the whole table as one batch (its per-batch partials are then the batch's)."""
    if not any(op.kind in BATCH_OPERATIONS for op in stage.operations):
        max_records = max(table.num_rows, 1)
    return table.combine_chunks().to_batches(max_chunksize=max_records)


def _compiled(settings: SessionSettings, fields: dict[str, str], sql: Sequence[OperationSpec]) -> ArrowSql | None:
    """The SQL operations compiled to Arrow once per process for their fields, expressions and
    the settings that change what they mean (not per session: a ``foreachBatch`` callback gets
    a new SparkSession object each batch, and compiling, a Spark analysis, took 30-75 ms)."""
    key = (tuple(fields.items()), tuple((op.kind, op.exprs) for op in sql), *settings.sql_meaning())
    with _COMPILED_LOCK:
        if key not in _COMPILED:
            try:
                _COMPILED[key] = compile_arrow_sql(settings.session(), fields, sql)
            except Exception as e:  # noqa: BLE001 - Spark runs what Arrow cannot; it reports real errors
                logger.warning("SQL operations %s run in Spark: compiling them to Arrow failed: %s", [op.exprs for op in sql], e)
                _COMPILED[key] = None
            else:
                if _COMPILED[key] is None:
                    logger.info("SQL operations %s run in Spark: no exact Arrow translation", [op.exprs for op in sql])
        return _COMPILED[key]
