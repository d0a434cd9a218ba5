"""Spark's ``rate`` source, for load tests: ``rows_per_second`` generated rows, one task.

Each row is (``timestamp``: its event time in epoch milliseconds, ``value``: 0, 1, 2, ...).
Spark derives a batch's rows from its offsets alone, so a replayed batch has the same rows.
There are no files: :meth:`RateKind.queue_dir` is None and the lag is not measured.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from stream_ops.errors import TopologyDefinitionError
from stream_ops.sources.base import SourceKind, SourceLag, SourceSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

KIND = "rate"
RATE_FIELDS = {"timestamp": "long", "value": "long"}
"""The fields of every rate source."""


def _positive_int(value: object, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise TopologyDefinitionError(f"rate source: {name} must be a positive integer, got {value!r}")
    return value


def rate_spec(rows_per_second: int = 100, num_partitions: int = 1) -> SourceSpec:
    """The spec of a rate source.

    Raises:
        TopologyDefinitionError: a count that is not a positive integer.
    """
    options = {
        "rows_per_second": _positive_int(rows_per_second, "rows_per_second"),
        "num_partitions": _positive_int(num_partitions, "num_partitions"),
    }
    return SourceSpec(kind=KIND, path=None, queues=1, fields=dict(RATE_FIELDS), options=options)


class RateKind(SourceKind):
    """Generated rows (Spark's ``rate`` format)."""

    name = KIND
    supports_corrupt_column = False

    def read_stream(
        self,
        spark: SparkSession,
        spec: SourceSpec,
        queue: int,
        *,
        max_files_per_trigger: int,
        max_file_age: str,
    ) -> DataFrame:
        """The rate stream; ``max_files_per_trigger`` and ``max_file_age`` do not apply."""
        self.check_spec(spec, queue)
        return (
            spark.readStream.format("rate")
            .option("rowsPerSecond", int(str(spec.options.get("rows_per_second", 100))))
            .option("numPartitions", int(str(spec.options.get("num_partitions", 1))))
            .load()
            .selectExpr("unix_millis(timestamp) AS timestamp", "value")
        )

    def queue_dir(self, spec: SourceSpec, queue: int) -> Path | None:
        self.check_spec(spec, queue)
        return None

    def lag(self, spec: SourceSpec, queue: int, consumed_until_ms: int) -> SourceLag:
        """Unknown: the source makes rows as time passes, there is no backlog to count."""
        self.check_spec(spec, queue)
        return SourceLag(records=None, files=None)

    def describe(self, spec: SourceSpec) -> str:
        rows = spec.options.get("rows_per_second", 100)
        partitions = spec.options.get("num_partitions", 1)
        return f"generates {rows} rows per second (Spark's rate source, {partitions} partitions)"
