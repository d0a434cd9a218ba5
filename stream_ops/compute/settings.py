"""The Spark settings that bound where a source batch is computed, and their readers.

Each is read from the session when a rule needs it (:class:`SessionSettings`), never before:
a setting that is not a whole number raises :class:`~stream_ops.errors.ConfigError` only where
the decision uses it.

A source stage's query notes one :class:`QuerySettings` against each of its batches while its
callback runs (:func:`noting_query_settings`): every batch of a query runs in the same session
(Spark clones the query's session once, when the query starts), so a value read for one batch
is every batch's, and is read once per query rather than once per batch (each read is a py4j
round trip, and a batch's PySpark session costs 5-7 more).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import TypeVar

from pyspark.sql import DataFrame, SparkSession

from stream_ops.compute.sql_arrow import COLLATION_CONF
from stream_ops.spark.settings import DEFAULT_DRIVER_BATCH_BYTES, DRIVER_BATCH_BYTES_CONF, whole_number_setting

ARROW_BATCH_BYTES_CONF = "spark.stream_ops.arrowBatchBytes"
"""Spark setting: the largest total input size (bytes) of a source batch read in Arrow on the
driver; 0 turns the Arrow path off."""
DEFAULT_ARROW_BATCH_BYTES = 128 << 20
"""Its value when the session does not set it. A batch takes about 5x its input size of driver
memory at its peak (the file bytes, the parsed table, split columns and groups: 24 MB of word
count input peaked at 88 MB of Arrow memory besides its 24 MB of bytes)."""

ROW_PROCESSES_CONF = "spark.stream_ops.rowProcesses"
"""Spark setting: how many local processes run the per-record Python operations of a source
batch read in Arrow that is above :data:`DRIVER_BATCH_BYTES_CONF`; 0 leaves such batches to
Spark. Unset: the cores of a local master (``local[N]``), else 0 (a cluster's executors have
more cores than the driver's machine)."""

DRIVER_RECORDS_CONF = "spark.stream_ops.kafkaDriverRecords"
"""Spark setting: the most offsets a source batch read by partition offsets (a Kafka topic's
batch: the offset range Spark planned for it) may span to be read and computed on the driver
rather than by a Spark job; 0 turns that path off. A source whose definition sets no
``max_offsets_per_trigger`` has its batches bounded by it too (Spark's ``maxOffsetsPerTrigger``),
so that each stays on the driver."""
DEFAULT_DRIVER_RECORDS = 50_000
"""Its value when the session does not set it: a Spark job costs a Kafka batch ~0.3-0.4 s
whatever its size on ``local[2]``, and the driver reads and counts a small batch in a fraction
of that (docs/benchmarks.md, Kafka row)."""

MAX_RECORDS_CONF = "spark.sql.execution.arrow.maxRecordsPerBatch"
"""Spark's bound on the rows of one Arrow batch given to ``mapInArrow``; the Arrow path gives
the stage's batch functions batches of the same size."""


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


def arrow_batch_bytes(spark: SparkSession) -> int:
    """The session's :data:`ARROW_BATCH_BYTES_CONF` (:func:`bytes_setting`)."""
    return bytes_setting(spark, ARROW_BATCH_BYTES_CONF, DEFAULT_ARROW_BATCH_BYTES)


def driver_records(spark: SparkSession) -> int:
    """The session's :data:`DRIVER_RECORDS_CONF`.

    Raises:
        ConfigError: the setting is not a whole number of records.
    """
    value = whole_number_setting(spark, DRIVER_RECORDS_CONF, meaning="a number of records (0 turns it off)")
    return DEFAULT_DRIVER_RECORDS if value is None else value


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


def max_records_per_batch(spark: SparkSession) -> int:
    """Spark's ``maxRecordsPerBatch`` (rows per Arrow batch; 0 or less: no bound)."""
    value = int(spark.conf.get(MAX_RECORDS_CONF, "10000") or 10000)
    return value if value > 0 else 1 << 62


def sql_meaning(spark: SparkSession) -> tuple[str | None, str | None]:
    """The session's settings that change what a SQL expression means (ANSI mode, the default
    collation), as set (None: Spark's default)."""
    return spark.conf.get("spark.sql.ansi.enabled", None), spark.conf.get(COLLATION_CONF, None)


_T = TypeVar("_T")


class SessionSettings:
    """A session's path settings, each read when asked (the decision's ``PathSettings``)."""

    def __init__(self, spark: SparkSession) -> None:
        self._spark = spark

    def session(self) -> SparkSession:
        """The session the settings are read from."""
        return self._spark

    def arrow_batch_bytes(self) -> int:
        return arrow_batch_bytes(self.session())

    def driver_batch_bytes(self) -> int:
        return driver_batch_bytes(self.session())

    def row_processes(self) -> int:
        return row_processes_setting(self.session())

    def driver_records(self) -> int:
        return driver_records(self.session())

    def max_records(self) -> int:
        """:func:`max_records_per_batch`."""
        return max_records_per_batch(self.session())

    def sql_meaning(self) -> tuple[str | None, str | None]:
        """:func:`sql_meaning`."""
        return sql_meaning(self.session())


class QuerySettings(SessionSettings):
    """The settings of one streaming query's batches: each read once, from the session of the
    batch that first needs it (the query's session, which every batch shares), then remembered.

    A setting that cannot be read (:class:`~stream_ops.errors.ConfigError`) is not remembered:
    every batch that needs it raises.
    """

    def __init__(self) -> None:
        self._batch: DataFrame | None = None
        self._values: dict[str, object] = {}
        self._lock = threading.Lock()

    def session(self) -> SparkSession:
        """The session of the batch being computed (its batches' shared session)."""
        batch = self._batch
        assert batch is not None, "the query's settings are read while one of its batches is computed"
        return batch.sparkSession

    def _remembered(self, name: str, read: Callable[[], _T]) -> _T:
        with self._lock:
            if name not in self._values:
                self._values[name] = read()
            return self._values[name]  # type: ignore[return-value]

    def arrow_batch_bytes(self) -> int:
        return self._remembered("arrow_batch_bytes", super().arrow_batch_bytes)

    def driver_batch_bytes(self) -> int:
        return self._remembered("driver_batch_bytes", super().driver_batch_bytes)

    def row_processes(self) -> int:
        return self._remembered("row_processes", super().row_processes)

    def driver_records(self) -> int:
        return self._remembered("driver_records", super().driver_records)

    def max_records(self) -> int:
        return self._remembered("max_records", super().max_records)

    def sql_meaning(self) -> tuple[str | None, str | None]:
        return self._remembered("sql_meaning", super().sql_meaning)


_NOTED: weakref.WeakKeyDictionary[DataFrame, QuerySettings] = weakref.WeakKeyDictionary()
"""The settings of the query each batch DataFrame being computed belongs to."""


def noting_query_settings(on_batch: Callable[[DataFrame, int], None]) -> Callable[[DataFrame, int], None]:
    """``on_batch`` (one query's callback) with one :class:`QuerySettings` noted against each
    batch while it runs, for :func:`batch_settings`."""
    settings = QuerySettings()

    def run(df: DataFrame, batch_id: int) -> None:
        settings._batch = df
        _NOTED[df] = settings
        try:
            on_batch(df, batch_id)
        finally:
            _NOTED.pop(df, None)
            settings._batch = None

    return run


def batch_settings(df: DataFrame) -> SessionSettings:
    """The settings of the batch ``df``: its query's (:func:`noting_query_settings`) while its
    callback runs, else its session's."""
    noted = _NOTED.get(df)
    return noted if noted is not None else SessionSettings(df.sparkSession)
