"""Path 2: a small source batch parsed by Spark, collected in one job, computed on the driver.

A source stage's batch normally runs its Python operations in ``mapInArrow`` (Spark's Python
workers) and has Spark group their rows per key: two stages, a shuffle, a Python worker per
task. For a batch of a few records that is most of its cost. A batch whose input files are
small (:mod:`stream_ops.compute.decision` weighs them) is instead parsed by Spark as before
(its SQL operations run in the JVM, :mod:`stream_ops.compute.jvm_sql`) and brought to the
driver in one job (``DataFrame.toArrow``); the same ``mapInArrow`` function then runs here on
its Arrow batches, and its rows are grouped as Spark's ``groupBy`` would group them.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame

from stream_ops.compute.results import SourceBatchResult, rows_on_this_thread, source_result, stage_run
from stream_ops.compute.stage_function import StageRows
from stream_ops.operators.aggregators import CombinerAggregator
from stream_ops.topology.plan import StageSpec


def collected_batch(df: DataFrame, stage: StageSpec) -> SourceBatchResult:
    """The stage's Python operations and partial aggregation over ``df`` (a batch whose SQL
    operations are done), collected to the driver in one job and computed here."""
    run = stage_run(stage)
    return source_result(driver_rows(df, run.rows, run.aggregator), stage, run)


def driver_rows(df: DataFrame, stage_rows: StageRows, aggregator: CombinerAggregator | None) -> list[dict[str, Any]]:
    """The rows the Spark path collects for a source batch, computed on the driver.

    ``df`` is collected in one job (``toArrow``) and ``stage_rows`` (the stage's ``mapInArrow``
    function) runs over its Arrow batches; its rows are grouped as Spark groups them
    (:func:`~stream_ops.compute.results.grouped_rows`).
    """
    return rows_on_this_thread(df.toArrow().to_batches(), stage_rows, aggregator)
