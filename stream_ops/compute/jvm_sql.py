"""A source stage's Spark SQL operations (``select_expr``, ``where``) run in the JVM (paths 2 and 4).

The batch is read once: lines that did not parse are counted on the way and only read again
when there are some (:func:`sql_in_jvm`). An expression that fails on some record (an ANSI
cast, a division by zero) fails the whole job; the batch is then split until the failing
records are found (:func:`without_failing_rows`): they go to the dead letters and the others
are processed once, as if they had been the whole batch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from stream_ops.compute.results import SourceBatchResult
from stream_ops.compute.stage_function import UNPARSED_ERROR
from stream_ops.operators.record_pipeline import SQL_OPERATIONS
from stream_ops.sources import CORRUPT_COLUMN
from stream_ops.topology.plan import OperationSpec, StageSpec

logger = logging.getLogger(__name__)

BatchAfterSql = Callable[[DataFrame], SourceBatchResult]
"""What computes a batch once its SQL operations are applied (a path's own computation)."""


def sql_operations(stage: StageSpec) -> list[OperationSpec]:
    """The stage's SQL operations, in order."""
    return [op for op in stage.operations if op.kind in SQL_OPERATIONS]


def sql_in_jvm(df: DataFrame, sql: list[OperationSpec], then: BatchAfterSql) -> SourceBatchResult:
    """The batch ``df`` with its SQL operations in the JVM, reading the input once, computed
    by ``then``.

    Lines that did not parse are counted on the way (an observation, no extra pass) and only
    when there are some does a second job read their text for the dead letters: the
    micro-batch's input is computed anew by every job reading it, so a union of the parsed
    and the unparsed lines would parse the whole batch twice.
    """
    if CORRUPT_COLUMN not in df.columns:
        return then(with_sql(df, sql))
    unparsed = Observation()
    corrupt = F.col(CORRUPT_COLUMN)
    watched = df.observe(unparsed, F.count(corrupt).alias("n"))
    data = with_sql(watched.where(corrupt.isNull()).drop(CORRUPT_COLUMN), sql)
    result = then(data)
    if not unparsed.get["n"]:
        return result
    texts = [row[0] for row in df.where(corrupt.isNotNull()).select(corrupt).collect()]
    letters = [{"record": text, "error": UNPARSED_ERROR} for text in texts]
    return SourceBatchResult(result.outputs, result.dead_letters + letters, result.input_rows + len(texts), result.inputs)


def without_failing_rows(
    df: DataFrame, stage: StageSpec, sql: list[OperationSpec], error: BaseException, then: BatchAfterSql
) -> SourceBatchResult | None:
    """The batch ``df``, whose SQL operations failed with ``error``, computed by ``then``
    without the records they fail on, which become dead letters; None when no single record
    makes them fail (``error`` is then not about a record). The input count counts the rows
    the SQL operations produce."""
    rows = df.collect()
    failing = _failing_rows(df.sparkSession, rows, df.schema, sql)
    if not failing:
        return None
    logger.warning("stage %s: %d records make a SQL operation fail: %s", stage.name, len(failing), _first_line(error))
    kept = [row for i, row in enumerate(rows) if i not in failing]
    result = then(with_sql(df.sparkSession.createDataFrame(kept, df.schema), sql))
    letters = [{"record": rows[i].asDict(recursive=True), "error": failing[i]} for i in sorted(failing)]
    return SourceBatchResult(result.outputs, result.dead_letters + letters, result.input_rows, result.inputs)


def with_sql(df: DataFrame, operations: list[OperationSpec]) -> DataFrame:
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
            frame = with_sql(spark.createDataFrame([rows[i] for i in indices], schema), operations)
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
