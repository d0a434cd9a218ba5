"""The input files of the batch a task's callback is computing, noted while it runs.

A ``foreachBatch`` DataFrame does not say which files it reads (``DataFrame.inputFiles()`` is
empty), but the query's checkpoint does: the file-source log entries its offsets span
(:func:`~stream_ops.spark.checkpoint.batch_input_files`), or for the shuffle-queue source the
batch's files (:func:`~stream_ops.spark.shuffle_queue.batch_files`). The query's callback is
wrapped to note them against the batch's DataFrame while it runs: a source batch's files and
total size (what the path decision weighs, and what the Arrow path reads), a keyed batch's
Parquet shuffle files (what :func:`~stream_ops.compute.decision.keyed_batch` combines itself).
A source batch read by partition offsets (Kafka) has its offset ranges noted instead
(:func:`~stream_ops.spark.checkpoint.batch_offset_ranges`: what the driver path reads).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from pyspark.sql import DataFrame

from stream_ops.sources.base import OffsetRange
from stream_ops.spark.checkpoint import batch_input_files, batch_offset_ranges


@dataclass(frozen=True)
class NotedInput:
    """The input files of a source batch, from the file-source log entries its offsets span."""

    files: tuple[Path, ...]
    bytes: int


@dataclass(frozen=True)
class NotedOffsets:
    """The offset ranges of a source batch read by partition offsets, as Spark logged them."""

    ranges: tuple[OffsetRange, ...]

    @property
    def offsets(self) -> int:
        """How many offsets the ranges span (at least the batch's records)."""
        return sum(r.offsets for r in self.ranges)


_INPUTS: weakref.WeakKeyDictionary[DataFrame, NotedInput] = weakref.WeakKeyDictionary()
"""The input files of the batch DataFrames a file-source query is handing to its callback."""

_OFFSETS: weakref.WeakKeyDictionary[DataFrame, NotedOffsets] = weakref.WeakKeyDictionary()
"""The offset ranges of the batch DataFrames an offset-reading source's query is handing to its callback."""

_BATCH_FILES: weakref.WeakKeyDictionary[DataFrame, list[Path]] = weakref.WeakKeyDictionary()
"""The input files of the batch DataFrames a Parquet partials query is handing to its callback."""


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
    """``on_batch`` with each source batch's input files noted while it runs, for
    :func:`noted_input`, or its offset ranges, for :func:`noted_offsets`, when Spark logged
    offsets rather than files."""

    def run(df: DataFrame, batch_id: int) -> None:
        noted = batch_input(checkpoint_dir, batch_id)
        if noted is not None:
            _INPUTS[df] = noted
        else:
            ranges = batch_offset_ranges(checkpoint_dir, batch_id)
            if ranges is not None:
                _OFFSETS[df] = NotedOffsets(tuple(ranges))
        try:
            on_batch(df, batch_id)
        finally:
            _INPUTS.pop(df, None)
            _OFFSETS.pop(df, None)

    return run


def noted_input(df: DataFrame) -> NotedInput | None:
    """The input files noted for the source batch ``df`` while its callback runs."""
    return _INPUTS.get(df)


def noted_offsets(df: DataFrame) -> NotedOffsets | None:
    """The offset ranges noted for the source batch ``df`` while its callback runs."""
    return _OFFSETS.get(df)


@contextlib.contextmanager
def batch_files_noted(df: DataFrame, files: list[Path]) -> Iterator[None]:
    """``files`` noted as the shuffle files of the batch ``df`` (a keyed batch's Parquet
    partials, a records batch's JSON lines) while the block runs."""
    _BATCH_FILES[df] = files
    try:
        yield
    finally:
        _BATCH_FILES.pop(df, None)


def noting_batch_files(on_batch: Callable[[DataFrame, int], None], checkpoint_dir: Path) -> Callable[[DataFrame, int], None]:
    """``on_batch`` with each keyed batch's files noted while it runs (:func:`noted_batch_files`):
    the file-source log entries its offsets span (a replay re-plans the same ones)."""

    def run(df: DataFrame, batch_id: int) -> None:
        files = batch_input_files(checkpoint_dir, batch_id)
        paths = [local_path(uri) for uri in files] if files is not None else None
        if paths is None or not all(p is not None for p in paths):
            on_batch(df, batch_id)
            return
        with batch_files_noted(df, [p for p in paths if p is not None]):
            on_batch(df, batch_id)

    return run


def noted_batch_files(df: DataFrame) -> list[Path] | None:
    """The shuffle files noted for the batch ``df`` while its callback runs."""
    return _BATCH_FILES.get(df)
