"""Small source batches computed on the driver: one Spark job to parse, no Python worker.

A source stage's batch normally runs its Python operations in ``mapInArrow`` (Spark's Python
workers) and has Spark group their rows per key: two stages, a shuffle, a Python worker per
task. For a batch of a few records that is most of its cost. A batch whose input files are
small (their total size, from the file-source log entries its offsets span, at most
:data:`DRIVER_BATCH_BYTES_CONF`) is instead parsed by Spark as before and brought to the driver
in one job (``DataFrame.toArrow``); the same ``mapInArrow`` function then runs here on its
Arrow batches, and its rows are grouped as Spark's ``groupBy`` would group them
(:func:`driver_rows`). Large batches keep the Spark path, parallel on the executors.
"""

from __future__ import annotations

import logging
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession

from stream_ops.operators.aggregators import CombinerAggregator
from stream_ops.operators.partials_combine import combine_partials
from stream_ops.spark.checkpoint import batch_input_files
from stream_ops.spark.row_processes import row_processes
from stream_ops.spark.settings import whole_number_setting

logger = logging.getLogger(__name__)

DRIVER_BATCH_BYTES_CONF = "spark.stream_ops.driverBatchBytes"
"""Spark setting: the largest total input size (bytes) of a source batch computed on the
driver; 0 turns the driver path off."""
DEFAULT_DRIVER_BATCH_BYTES = 1 << 20
"""Its value when the session does not set it (see ``spark/session.py`` for the measurement)."""

StageRows = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]
"""A source stage's ``mapInArrow`` function (``compiler._stage_rows``)."""


@dataclass(frozen=True)
class NotedInput:
    """The input files of a source batch, from the file-source log entries its offsets span."""

    files: tuple[Path, ...]
    bytes: int


_INPUTS: weakref.WeakKeyDictionary[DataFrame, NotedInput] = weakref.WeakKeyDictionary()
"""The input files of the batch DataFrames a file-source query is handing to its callback."""


def local_path(uri: str) -> Path | None:
    """The local path of a file URI Spark logged (None for another file system)."""
    parsed = urlparse(uri)
    if parsed.scheme not in ("", "file"):
        return None
    return Path(unquote(parsed.path))


def batch_input(checkpoint_dir: Path, batch_id: int) -> NotedInput | None:
    """The files the file source planned for ``batch_id`` and their total size (None when
    Spark logged no files for it, or one is not a local file that exists)."""
    files = batch_input_files(checkpoint_dir, batch_id)
    if files is None:
        return None
    paths: list[Path] = []
    total = 0
    for uri in files:
        path = local_path(uri)
        if path is None:
            return None
        try:
            total += path.stat().st_size
        except OSError:
            return None
        paths.append(path)
    return NotedInput(tuple(paths), total)


def noting_input_bytes(on_batch: Callable[[DataFrame, int], None], checkpoint_dir: Path) -> Callable[[DataFrame, int], None]:
    """``on_batch`` with each batch's input files noted while it runs, for
    :func:`computes_on_driver` and :func:`noted_input`."""

    def run(df: DataFrame, batch_id: int) -> None:
        noted = batch_input(checkpoint_dir, batch_id)
        if noted is not None:
            _INPUTS[df] = noted
        try:
            on_batch(df, batch_id)
        finally:
            _INPUTS.pop(df, None)

    return run


def noted_input(df: DataFrame) -> NotedInput | None:
    """The input files noted for the source batch ``df`` while its callback runs."""
    return _INPUTS.get(df)


def bytes_setting(spark: SparkSession, name: str, default: int) -> int:
    """The session's setting ``name``, a number of bytes (``default`` when it is not set).

    Raises:
        ConfigError: the setting is not a whole number of bytes (at least 0).
    """
    value = whole_number_setting(spark, name, meaning="a number of bytes (0 turns it off)")
    return default if value is None else value


def driver_batch_bytes(spark: SparkSession) -> int:
    """The session's :data:`DRIVER_BATCH_BYTES_CONF` (:func:`bytes_setting`)."""
    return bytes_setting(spark, DRIVER_BATCH_BYTES_CONF, DEFAULT_DRIVER_BATCH_BYTES)


def computes_on_driver(df: DataFrame) -> bool:
    """Whether the source batch ``df`` is small enough for the driver path: its input files
    are known (a file source's query noted them) and total at most the session's limit."""
    noted = _INPUTS.get(df)
    return noted is not None and noted.bytes <= driver_batch_bytes(df.sparkSession)


def driver_rows(df: DataFrame, stage_rows: StageRows, aggregator: CombinerAggregator | None) -> list[dict[str, Any]]:
    """The rows the Spark path collects for a source batch, computed on the driver.

    ``df`` is collected in one job (``toArrow``) and ``stage_rows`` (the stage's ``mapInArrow``
    function) runs over its Arrow batches. With ``aggregator`` (typed partials), its rows are
    grouped by (``out``, ``key``, ``dead``) as Spark's ``groupBy().agg()`` groups them: the
    values by the aggregator's Spark function with Spark's semantics
    (:func:`~stream_ops.operators.partials_combine.combine_partials`), ``n`` counting the rows,
    ``inputs`` summed; without, every row is one row with ``n`` = 1.
    """
    return arrow_rows(df.toArrow().to_batches(), stage_rows, aggregator)


def arrow_rows(
    batches: Iterable[pa.RecordBatch], stage_rows: StageRows, aggregator: CombinerAggregator | None, *, processes: int = 0
) -> list[dict[str, Any]]:
    """:func:`driver_rows` over a batch already in Arrow on the driver: ``stage_rows`` runs on
    this thread, or with ``processes`` in that many local processes
    (:mod:`~stream_ops.spark.row_processes`)."""
    if processes:
        batches = list(batches)
        max_records = max((batch.num_rows for batch in batches), default=0) or 1
        produced = row_processes(processes).run(stage_rows, batches, max_records=max_records)
    else:
        produced = list(stage_rows(iter(batches)))
    return grouped_rows(pa.Table.from_batches(produced), aggregator) if produced else []


def grouped_rows(table: pa.Table, aggregator: CombinerAggregator | None) -> list[dict[str, Any]]:
    """The rows ``stage_rows`` produced (``table``), grouped as :func:`driver_rows` groups them."""
    if aggregator is None:
        return [{**row, "n": 1} for row in table.to_pylist()]
    empty = dict.fromkeys(table.column_names)
    dead = pc.is_valid(table.column("dead"))
    letters = Counter(table.filter(dead).column("dead").to_pylist())
    rows = [{**empty, "dead": text, "n": n} for text, n in letters.items()]
    counts = table.filter(pc.is_valid(table.column("inputs"))).column("inputs").to_pylist()
    if counts:
        rows.append({**empty, "inputs": sum(counts), "n": len(counts)})
    keyed = table.filter(pc.and_(pc.is_valid(table.column("key")), pc.invert(dead)))
    for out in pc.unique(keyed.column("out")).to_pylist():
        group = keyed.filter(pc.equal(keyed.column("out"), out)).select(["key", "value"])
        partials, _ = combine_partials(group, aggregator)
        rows.extend({**empty, "out": out, "key": key, "value": value} for key, value in partials)
    return rows
