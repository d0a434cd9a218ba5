"""A FileTopic of JSON-lines files as a source: one queue directory per task.

The read is the one the compiler has always made for a source stage: PERMISSIVE JSON against
the source schema, a line that does not parse kept whole in :data:`CORRUPT_COLUMN` (it becomes
a dead letter).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from stream_ops.helpers.line_counts import count_lines
from stream_ops.helpers.spark_ddl import schema_ddl
from stream_ops.sources.base import (
    CORRUPT_COLUMN,
    SourceAsset,
    SourceKind,
    SourceLag,
    SourceSpec,
    directory_key_parts,
    files_newer_than,
)
from stream_ops.topics.file_topic import FileTopic

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

KIND = "file_topic"


def file_topic_spec(topic: FileTopic, fields: Mapping[str, str]) -> SourceSpec:
    """The spec of a source reading ``topic`` with ``fields`` (already checked)."""
    return SourceSpec(kind=KIND, path=str(topic.path), queues=topic.queues, fields=dict(fields))


class FileTopicKind(SourceKind):
    """JSON lines in ``<path>/queue-NNNNN``, one queue per task."""

    name = KIND
    supports_corrupt_column = True
    asset_kinds = frozenset({"files"})
    arrow_readable = True

    def read_stream(
        self,
        spark: SparkSession,
        spec: SourceSpec,
        queue: int,
        *,
        max_files_per_trigger: int,
        max_file_age: str,
    ) -> DataFrame:
        return (
            spark.readStream.option("maxFilesPerTrigger", max_files_per_trigger)
            .option("maxFileAge", max_file_age)
            .option("mode", "PERMISSIVE")
            .option("columnNameOfCorruptRecord", CORRUPT_COLUMN)
            .schema(schema_ddl(self.columns(spec)))
            .json(str(self.queue_dir(spec, queue)))
        )

    def queue_dir(self, spec: SourceSpec, queue: int) -> Path:
        self.check_spec(spec, queue)
        return FileTopic(self.spec_path(spec), spec.known_queues()).queue_path(queue)

    def lag(self, spec: SourceSpec, queue: int, consumed_until_ms: int) -> SourceLag:
        """Files of the queue newer than ``consumed_until_ms`` and their lines (one record each)."""
        records = 0
        files = 0
        for file in files_newer_than(self.queue_dir(spec, queue), consumed_until_ms):
            try:
                records += count_lines(file)
            except FileNotFoundError:
                continue  # compacted away since it was listed
            files += 1
        return SourceLag(records=records, files=files)

    def describe(self, spec: SourceSpec) -> str:
        return f"reads JSON lines from the FileTopic `{spec.path}` ({spec.queues} queues)"

    def asset(self, spec: SourceSpec) -> SourceAsset:
        """``topic/<parent>/<directory>``: the topic's directory and the one above."""
        self.spec_path(spec)  # a SourceError without a path
        return SourceAsset(
            key_parts=("topic", *directory_key_parts(str(spec.path))),
            kinds=self.asset_kinds,
            description=(
                f"FileTopic `{spec.path}` ({spec.queues} queues): JSON-lines files the stream_ops topologies "
                "downstream read, one task per queue."
            ),
        )
