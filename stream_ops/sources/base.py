"""The source seam: what a plan says about a source, what a kind of source does, and the registry.

A :class:`SourceSpec` is plain data in the plan; the :class:`SourceKind` registered under its
``kind`` turns it into the streaming DataFrame one task reads, names the directory that query
lists (if any), measures the input it has not read yet and describes that input to Dagster as
plain data (:class:`SourceAsset`, :class:`PartitionLagWatch`; only :mod:`stream_ops.orchestration`
imports dagster). Adding a source is one module with a kind (and, for users, a definition object
with ``to_source_spec``) plus its registration in :mod:`stream_ops.sources`; its asset, lineage
and consumer lag then follow from the kind.
"""

from __future__ import annotations

import os
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator

from stream_ops.asset_metadata import AssetMetadata
from stream_ops.errors import SourceError, TopologyDefinitionError
from stream_ops.helpers.field_paths import SCALAR_TYPES
from stream_ops.registry import Registry

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

CORRUPT_COLUMN = "_corrupt_record"
"""The string column a PERMISSIVE JSON or CSV read fills with a line that does not parse."""

_NESTED = re.compile(r"^(struct|map|array)<.*>$", re.DOTALL)

SchemaArg = Mapping[str, str] | Sequence[str]
"""A schema as users write it: field -> Spark type, or a list of string field names."""


def is_scalar_type(typ: object) -> bool:
    """Whether ``typ`` is one of :data:`SCALAR_TYPES`."""
    return isinstance(typ, str) and typ in SCALAR_TYPES


def is_nested_type(typ: object) -> bool:
    """Whether ``typ`` is nested Spark DDL (``struct<...>``, ``map<...>``, ``array<...>``)."""
    return isinstance(typ, str) and bool(_NESTED.match(typ.strip()))


def schema_fields(schema: SchemaArg, what: str, *, nested: bool = True) -> dict[str, str]:
    """Normalise a user's schema ('a', ['a', 'b'] or {'a': 'long'}) to an ordered field -> type map.

    Args:
        schema: field -> type, a list of field names (all ``string``) or one field name.
        what: the source, for messages.
        nested: whether nested Spark DDL (``struct<...>`` ...) is allowed besides the scalars.

    Raises:
        TopologyDefinitionError: no field, a name that is not an identifier or named twice, or
            a type that is not allowed.
    """
    if isinstance(schema, str):
        pairs = [(schema, "string")]
    elif isinstance(schema, Mapping):
        pairs = list(schema.items())
    elif isinstance(schema, Sequence):
        pairs = [(name, "string") for name in schema]
    else:
        raise TopologyDefinitionError(f"{what}: schema must be a field -> type mapping or a list of field names")
    if not pairs:
        raise TopologyDefinitionError(f"{what}: the schema names no field")
    fields: dict[str, str] = {}
    for name, typ in pairs:
        if not isinstance(name, str) or not name.isidentifier():
            raise TopologyDefinitionError(f"{what}: field {name!r} is not a valid identifier")
        if name == CORRUPT_COLUMN:
            raise TopologyDefinitionError(f"{what}: field {name!r} is reserved for records that do not parse")
        if name in fields:
            raise TopologyDefinitionError(f"{what}: field {name!r} named twice")
        if not (is_scalar_type(typ) or (nested and is_nested_type(typ))):
            allowed = f"one of {SCALAR_TYPES}" + (" or nested Spark DDL such as struct<id:long,name:string>" if nested else "")
            raise TopologyDefinitionError(f"{what}: field {name!r} has unsupported type {typ!r}; use {allowed}")
        fields[name] = typ
    return fields


class SourceSpec(BaseModel):
    """A source as the plan holds it (plain JSON).

    Attributes:
        kind: a registered source kind (:func:`source_kind`).
        path: where the source's files are, None for sources without files.
        queues: how many queues, so how many tasks, the source stage has. None in a topology's
            definition: learned when its plan is built (:meth:`SourceKind.resolve_spec`, a Kafka
            topic's partitions); a plan's spec always has it.
        fields: field -> Spark type, in column order.
        options: kind-specific settings (JSON values only).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str
    path: str | None = None
    queues: int | None = Field(1, ge=1)
    fields: dict[str, str]
    options: dict[str, JsonValue] = {}

    def known_queues(self) -> int:
        """:attr:`queues`, which every plan's spec has.

        Raises:
            SourceError: a definition's spec whose count is learned when the plan is built.
        """
        if self.queues is None:
            raise SourceError(f"this {self.kind} spec is a topology definition's, without its number of queues: build the plan")
        return self.queues

    @field_validator("kind")
    @classmethod
    def _registered(cls, kind: str) -> str:
        source_kind(kind)
        return kind

    @field_validator("fields")
    @classmethod
    def _known_types(cls, fields: dict[str, str]) -> dict[str, str]:
        return schema_fields(fields, "source spec")


@dataclass(frozen=True)
class SourceLag:
    """Input of one task its query has not read yet.

    Attributes:
        records: how many records, where that is cheap to know; None when it is not.
        files: how many files, for file sources; None for sources without files.
    """

    records: int | None
    files: int | None


@dataclass(frozen=True)
class OffsetRange:
    """The records one batch reads of one partition: offsets ``start`` up to ``end`` (excluded),
    as Spark planned them (the end offsets it logged for the previous batch and for this one).

    Attributes:
        topic: the topic.
        partition: the partition.
        start: the first offset of the batch (the previous batch's end).
        end: the offset after the batch's last (this batch's end).
    """

    topic: str
    partition: int
    start: int
    end: int

    @property
    def offsets(self) -> int:
        """How many offsets the range spans: at most that many records (transaction markers and
        aborted records take offsets too)."""
        return self.end - self.start


@dataclass(frozen=True)
class SourceStream:
    """A source task's streaming DataFrame as its query reads it: ``raw``, which Spark plans
    every micro-batch, and ``shape``, the projection that turns a batch of it into the source's
    columns (:meth:`SourceKind.read_stream`'s DataFrame), applied only to a batch Spark computes.

    Spark analyses, optimises and physically plans each micro-batch's whole plan, and describes
    it for the batch's SQL execution, before the query's sink runs, even when the sink never
    executes it (a batch read on the driver). A bare relation keeps that per-batch work small.

    Attributes:
        raw: the streaming DataFrame the query reads.
        shape: ``raw`` (or a batch of it) -> the source's columns; None: ``raw`` has them.
    """

    raw: DataFrame
    shape: Callable[[DataFrame], DataFrame] | None = None


@dataclass(frozen=True)
class SourceAsset:
    """How a source describes the input it reads to Dagster: the external asset every topology
    reading that input shares (the translator adds its key prefix and group).

    Attributes:
        key_parts: the asset key after the translator's prefix; it names the input (a topic, a
            directory), never the topology.
        kinds: the asset's kinds (icons in the UI).
        description: what the input is and who reads it.
        metadata: kind-specific entries, after ``stream_ops/source_kind``, ``stream_ops/queues``
            and ``stream_ops/path``.
    """

    key_parts: tuple[str, ...]
    kinds: frozenset[str]
    description: str
    metadata: Mapping[str, AssetMetadata] = field(default_factory=dict)


@dataclass(frozen=True)
class PartitionLagWatch:
    """What the ``consumer_lag`` check reads for a source whose task ``p`` reads partition ``p``
    of a Kafka-protocol topic: the partitions' end offsets on the brokers, less the end offsets
    each task committed (:mod:`stream_ops.orchestration.consumer_lag`).

    Attributes:
        bootstrap: the brokers.
        topic: the topic.
        client_config: librdkafka settings for reading offsets, ``env:NAME`` values unresolved.
        from_earliest: whether a task starts at ``earliest`` (so a partition without a commit
            lags by all its retained records).
    """

    bootstrap: str
    topic: str
    client_config: tuple[tuple[str, str], ...] = ()
    from_earliest: bool = True


def directory_key_parts(path: str) -> list[str]:
    """The last two parts of a directory's path (the directory and its parent): recognisable,
    and two inputs named alike in different places (``input/sentences``,
    ``wordcount-db/sentences``) keep apart.

    Example:
        >>> directory_key_parts("/data/in/sentences/")
        ['in', 'sentences']
    """
    return [p for p in os.path.normpath(path).split(os.sep) if p][-2:] or [path]


class SourceKind(ABC):
    """One kind of source: how a task reads it, how far behind it is and how Dagster shows it.

    Attributes:
        name: the ``kind`` in :class:`SourceSpec`.
        supports_corrupt_column: whether :meth:`read_stream` adds :data:`CORRUPT_COLUMN`
            (lines that do not parse land there instead of failing the task).
        asset_kinds: the kinds of its Dagster asset.
        arrow_readable: whether a batch's input is JSON-lines files that Spark's PERMISSIVE
            JSON reader reads against the source's fields, so the Arrow fast path
            (:mod:`stream_ops.compute.arrow_read`) may parse them on the driver.
        offsets_readable: whether :meth:`read_offsets` reads a batch's offset ranges (as Spark
            logged them) on the driver, giving exactly the rows :meth:`read_stream` gives for
            them, so a small batch may be computed on the driver without a Spark job.
    """

    name: str
    supports_corrupt_column: bool = False
    asset_kinds: frozenset[str] = frozenset()
    arrow_readable: bool = False
    offsets_readable: bool = False

    def with_batch_offsets_bound(self, spec: SourceSpec, offsets: int) -> SourceSpec:
        """``spec`` whose batches each span at most ``offsets`` offsets of a queue, unless the
        spec bounds them already; a kind that does not read by offsets gives ``spec``."""
        return spec

    @abstractmethod
    def read_stream(
        self,
        spark: SparkSession,
        spec: SourceSpec,
        queue: int,
        *,
        max_files_per_trigger: int,
        max_file_age: str,
    ) -> DataFrame:
        """The streaming DataFrame task ``queue`` of the source stage reads.

        Its columns are :meth:`columns`. ``max_files_per_trigger`` and ``max_file_age`` are
        Spark's ``maxFilesPerTrigger`` and ``maxFileAge`` (ignored by sources without files).
        """

    def open_stream(
        self,
        spark: SparkSession,
        spec: SourceSpec,
        queue: int,
        *,
        max_files_per_trigger: int,
        max_file_age: str,
    ) -> SourceStream:
        """What task ``queue``'s query reads: :meth:`read_stream`'s DataFrame, or a bare relation
        and the projection to it (:class:`SourceStream`). The default: :meth:`read_stream`'s
        DataFrame, no projection."""
        return SourceStream(
            self.read_stream(spark, spec, queue, max_files_per_trigger=max_files_per_trigger, max_file_age=max_file_age)
        )

    @abstractmethod
    def queue_dir(self, spec: SourceSpec, queue: int) -> Path | None:
        """The directory task ``queue``'s query lists, None for sources without files."""

    @abstractmethod
    def lag(self, spec: SourceSpec, queue: int, consumed_until_ms: int) -> SourceLag:
        """The input of task ``queue`` not read yet.

        ``consumed_until_ms`` is the newest modification time among the files the query has
        consumed (:func:`stream_ops.spark.checkpoint.latest_file_timestamp`).
        """

    @abstractmethod
    def describe(self, spec: SourceSpec) -> str:
        """A few words on what the source reads, for logs and the UI."""

    def resolve_spec(self, spec: SourceSpec, what: str) -> SourceSpec:
        """``spec`` with what is learned when the plan is built (its ``queues`` when None); called
        once per build, in the process that builds it (a submit). The default learns nothing.

        Args:
            spec: the spec of a topology's definition.
            what: the source, for messages.

        Raises:
            SourceError: the spec's queue count cannot be learned (the message says why and what to do).
        """
        if spec.queues is None:
            raise SourceError(f"{what}: a {self.name} source must give its number of queues")
        return spec

    def identity(self, spec: SourceSpec) -> dict[str, Any]:
        """What identifies the input ``spec`` reads, the same for every topology reading it.

        The default: the kind and the path.
        """
        return {"kind": spec.kind, "path": spec.path}

    def asset(self, spec: SourceSpec) -> SourceAsset | None:
        """The Dagster asset of the input ``spec`` reads, None when it has none (generated rows).

        The default: a source with a path is the directory ``files/<parent>/<directory>``
        (:func:`directory_key_parts`), one without a path has no asset.
        """
        if spec.path is None:
            return None
        return SourceAsset(
            key_parts=("files", *directory_key_parts(spec.path)),
            kinds=self.asset_kinds,
            description=f"Directory `{spec.path}` of the {self.name} source read by the stream_ops topologies downstream.",
        )

    def lag_watch(self, spec: SourceSpec) -> PartitionLagWatch | None:
        """What the ``consumer_lag`` check reads for ``spec``; None (the default): no check, the
        stream asset's lag (:meth:`lag`) is all there is."""
        return None

    def read_offsets(self, spec: SourceSpec, ranges: Sequence[OffsetRange]) -> pa.Table | None:
        """The rows of the batch over ``ranges`` (the offset ranges Spark planned for it, in
        the task's checkpoint), read on the driver: exactly the rows :meth:`read_stream` gives for that batch,
        with the columns of ``spec.fields`` (in order, typed as the Arrow path types them; no
        :data:`CORRUPT_COLUMN`), or None when they cannot be read or built here exactly as Spark
        reads them (the batch is then left to Spark). Only kinds that are ``offsets_readable``
        read offsets.

        Raises:
            SourceError: this kind does not read offset ranges on the driver.
        """
        raise SourceError(f"a {self.name} source does not read offset ranges on the driver")

    def columns(self, spec: SourceSpec) -> dict[str, str]:
        """Column -> Spark type of :meth:`read_stream`'s DataFrame."""
        if self.supports_corrupt_column:
            return {**spec.fields, CORRUPT_COLUMN: "string"}
        return dict(spec.fields)

    def check_spec(self, spec: SourceSpec, queue: int | None = None) -> None:
        """Raise :class:`SourceError` unless ``spec`` is of this kind and has ``queue``."""
        if spec.kind != self.name:
            raise SourceError(f"source kind {self.name!r} was given a spec of kind {spec.kind!r}")
        if queue is not None and not 0 <= queue < spec.known_queues():
            raise SourceError(f"queue {queue} out of range for a {self.name} source with {spec.queues} queues")

    def spec_path(self, spec: SourceSpec) -> Path:
        """``spec.path`` of a file source (:class:`SourceError` when it has none)."""
        if spec.path is None:
            raise SourceError(f"a {self.name} source needs a path")
        return Path(spec.path)


@runtime_checkable
class SourceDefinition(Protocol):
    """What users pass to ``topology.source(...)`` besides a FileTopic."""

    def to_source_spec(self, schema: SchemaArg | None) -> SourceSpec:
        """The plan's spec of this source; ``schema`` is the ``schema=`` of ``topology.source``."""
        ...


# --- backlog of file sources -------------------------------------------------------------


def files_newer_than(directory: Path, since_ms: int) -> list[Path]:
    """Visible files directly in ``directory`` modified after ``since_ms``, in name order.

    What a Spark file stream has not read yet when ``since_ms`` is the newest modification time
    it consumed (as :func:`stream_ops.spark.checkpoint.count_newer_files`, files only). Spark
    skips names starting with '.' or '_'; a file landed with an older modification time than
    ``since_ms`` is not counted.
    """
    try:
        entries = list(directory.iterdir())
    except OSError:
        return []
    newer = []
    for entry in entries:
        if entry.name.startswith((".", "_")):
            continue
        try:
            stat = entry.stat()
        except OSError:
            continue  # removed since it was listed
        if entry.is_file() and stat.st_mtime_ns // 1_000_000 > since_ms:
            newer.append(entry)
    return sorted(newer)


# --- the registry --------------------------------------------------------------------------

_KINDS: Registry[SourceKind] = Registry("source kind")


def register_source_kind(kind: SourceKind) -> SourceKind:
    """Add ``kind`` to the registry under ``kind.name`` (a name can be registered once)."""
    return _KINDS.register(kind.name, kind)


def source_kind(name: str) -> SourceKind:
    """The registered kind called ``name`` (raises TopologyDefinitionError for an unknown one)."""
    return _KINDS.get(name)


def source_kinds() -> tuple[SourceKind, ...]:
    """Every registered kind, in registration order."""
    return _KINDS.entries()
