"""Sources: what a topology reads, behind one seam (:class:`SourceKind`).

Users pass a FileTopic, :class:`ParquetFiles`, :class:`CsvFiles`, :class:`JsonFiles` or
:class:`RateSource` to ``topology.source``; :func:`source_spec` turns it into the plan's
:class:`SourceSpec`, and the kind registered under ``spec.kind`` reads it at run time. Adding a
source is a module with its kind and definition object, plus a line below registering the kind.
"""

from stream_ops.sources.base import (
    CORRUPT_COLUMN,
    SCALAR_TYPES,
    SchemaArg,
    SourceDefinition,
    SourceKind,
    SourceLag,
    SourceSpec,
    register_source_kind,
    source_kind,
    source_kinds,
)
from stream_ops.sources.definitions import CsvFiles, JsonFiles, ParquetFiles, RateSource, source_spec
from stream_ops.sources.file_topic_source import FileTopicKind
from stream_ops.sources.landed_files import FORMATS, LandedFilesKind
from stream_ops.sources.rate import RateKind

register_source_kind(FileTopicKind())
for _format in FORMATS:
    register_source_kind(LandedFilesKind(_format))
register_source_kind(RateKind())

__all__ = [
    "CORRUPT_COLUMN",
    "SCALAR_TYPES",
    "CsvFiles",
    "FileTopicKind",
    "JsonFiles",
    "LandedFilesKind",
    "ParquetFiles",
    "RateKind",
    "RateSource",
    "SchemaArg",
    "SourceDefinition",
    "SourceKind",
    "SourceLag",
    "SourceSpec",
    "register_source_kind",
    "source_kind",
    "source_kinds",
    "source_spec",
]
