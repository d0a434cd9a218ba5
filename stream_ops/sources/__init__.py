"""Sources: what a topology reads, behind one seam (:class:`SourceKind`).

Users pass a FileTopic, :class:`ParquetFiles`, :class:`CsvFiles`, :class:`JsonFiles`,
:class:`RateSource` or :class:`KafkaTopic` to ``topology.source``; :func:`source_spec` turns it into the plan's
:class:`SourceSpec`, and the kind registered under ``spec.kind`` reads it at run time. Adding a
source is a module with its kind and definition object, plus a line below registering the kind.
"""

from stream_ops.sources.base import (
    CORRUPT_COLUMN,
    SCALAR_TYPES,
    OffsetRange,
    PartitionLagWatch,
    SchemaArg,
    SourceAsset,
    SourceDefinition,
    SourceKind,
    SourceLag,
    SourceSpec,
    register_source_kind,
    source_kind,
    source_kinds,
)
from stream_ops.sources.definitions import CsvFiles, JsonFiles, KafkaTopic, ParquetFiles, RateSource, source_spec
from stream_ops.sources.file_topic_source import FileTopicKind
from stream_ops.sources.kafka_source import METADATA_FIELDS as KAFKA_METADATA_FIELDS
from stream_ops.sources.kafka_source import KafkaKind
from stream_ops.sources.landed_files import FORMATS, LandedFilesKind
from stream_ops.sources.rate import RateKind

register_source_kind(FileTopicKind())
for _format in FORMATS:
    register_source_kind(LandedFilesKind(_format))
register_source_kind(RateKind())
register_source_kind(KafkaKind())

__all__ = [
    "CORRUPT_COLUMN",
    "SCALAR_TYPES",
    "CsvFiles",
    "FileTopicKind",
    "JsonFiles",
    "KAFKA_METADATA_FIELDS",
    "KafkaKind",
    "KafkaTopic",
    "LandedFilesKind",
    "OffsetRange",
    "ParquetFiles",
    "PartitionLagWatch",
    "RateKind",
    "RateSource",
    "SchemaArg",
    "SourceAsset",
    "SourceDefinition",
    "SourceKind",
    "SourceLag",
    "SourceSpec",
    "register_source_kind",
    "source_kind",
    "source_kinds",
    "source_spec",
]
