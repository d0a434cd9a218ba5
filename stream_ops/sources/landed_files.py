"""Directories of Parquet, CSV or JSON-lines files landed by other systems: one task reads all.

Spark's file source lists the directory (``recursiveFileLookup`` off: files directly in it;
names starting with '.' or '_' are skipped, so writers should land files under such a name
and rename them into place). Files are picked up in modification-time order; Spark's
``maxFileAge`` applies, so a file landed later with a modification time older than the newest
file seen by more than that (``cp -p``, ``rsync -t``) is never read.

The schema is given, or inferred once at definition time from the first non-empty file (by
name) with pyarrow: the plan then holds it, and files that land later are read against it.

Malformed input:
    * CSV and JSON lines are read PERMISSIVE: a line that does not parse against the schema is
      kept whole in :data:`CORRUPT_COLUMN` (it becomes a dead letter).
    * Parquet has no such column: a file Spark cannot read (cut short, not Parquet, a column of
      another type) fails the task, and keeps failing it until the file is removed or fixed.
      Spark's ``ignoreCorruptFiles`` would skip such a file instead; it is deliberately not
      set, since a skipped file is input lost without a trace.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from stream_ops.durable_files import make_dirs
from stream_ops.errors import TopologyDefinitionError
from stream_ops.helpers.line_counts import count_lines
from stream_ops.helpers.spark_ddl import schema_ddl
from stream_ops.sources.base import (
    CORRUPT_COLUMN,
    SchemaArg,
    SourceAsset,
    SourceKind,
    SourceLag,
    SourceSpec,
    directory_key_parts,
    files_newer_than,
    is_nested_type,
    schema_fields,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

logger = logging.getLogger(__name__)

FORMATS = ("parquet", "csv", "json")
"""Formats of landed files: Parquet, CSV, JSON lines."""

_WIDENINGS = {("int", "long"), ("float", "double")}
"""(type in the file, type in the schema) pairs Spark's Parquet reader widens."""


def kind_name(fmt: str) -> str:
    """The source kind of landed ``fmt`` files (``parquet_files``, ``csv_files``, ``json_files``)."""
    return f"{fmt}_files"


# --- definition time: spec, inference, checks ------------------------------------------------


def landed_files_spec(
    path: str | os.PathLike[str],
    fmt: str,
    schema: SchemaArg | None = None,
    *,
    header: bool = True,
    delimiter: str = ",",
) -> SourceSpec:
    """The spec of a source reading ``fmt`` files landed in ``path``.

    Args:
        path: the directory (it may not exist yet when ``schema`` is given).
        fmt: ``parquet``, ``csv`` or ``json`` (JSON lines).
        schema: field -> Spark type, or None to infer it from the files there now (see
            :func:`infer_fields`). CSV allows scalar types only.
        header: CSV only: whether each file starts with a header line.
        delimiter: CSV only: the one-character field separator.

    Raises:
        TopologyDefinitionError: an unknown format, bad CSV options, a schema that cannot be
            inferred or that disagrees with the files (see :func:`check_fields`).
    """
    what = f"{fmt} files at {os.fspath(path)!r}"
    if fmt not in FORMATS:
        raise TopologyDefinitionError(f"{what}: unknown format {fmt!r}; use one of {FORMATS}")
    if not os.fspath(path):
        raise TopologyDefinitionError(f"{what}: path is empty")
    options: dict[str, Any] = {}
    if fmt == "csv":
        if not isinstance(header, bool):
            raise TopologyDefinitionError(f"{what}: header must be True or False, got {header!r}")
        if not isinstance(delimiter, str) or len(delimiter) != 1 or delimiter in '\r\n"':
            raise TopologyDefinitionError(f"{what}: delimiter must be one character other than a quote or newline")
        options = {"header": header, "delimiter": delimiter}
    directory = Path(path)
    if schema is None:
        fields = infer_fields(directory, fmt, header=header, delimiter=delimiter)
    else:
        fields = schema_fields(schema, what, nested=fmt != "csv")
        check_fields(directory, fmt, fields, header=header, delimiter=delimiter)
    if fmt == "csv" and header:
        # Spark then checks every file's header against the field names (by position) and fails
        # the task on a file whose columns moved; fields renamed on purpose are read by position.
        names = _header(directory, header=header, delimiter=delimiter)
        options["check_header"] = names is None or [n.lower() for n in names] == [n.lower() for n in fields]
    return SourceSpec(kind=kind_name(fmt), path=os.fspath(path), queues=1, fields=fields, options=options)


def first_file(directory: Path) -> Path | None:
    """The first non-empty visible file directly in ``directory`` by name, None if there is none."""
    try:
        entries = sorted(directory.iterdir())
    except OSError:
        return None
    for entry in entries:
        if entry.name.startswith((".", "_")):
            continue
        try:
            if entry.is_file() and entry.stat().st_size > 0:
                return entry
        except OSError:
            continue
    return None


def _arrow_schema(file: Path, fmt: str, *, header: bool, delimiter: str) -> pa.Schema:
    """The schema pyarrow reads (Parquet) or infers from the first block (CSV, JSON) of ``file``."""
    if fmt == "parquet":
        return pq.read_schema(file)
    if fmt == "csv":
        with pa_csv.open_csv(
            file,
            read_options=pa_csv.ReadOptions(autogenerate_column_names=not header),
            parse_options=pa_csv.ParseOptions(delimiter=delimiter),
            convert_options=pa_csv.ConvertOptions(null_values=[""], strings_can_be_null=True),  # Spark's nullValue
        ) as reader:
            schema = reader.schema
        if not header:  # Spark's names for the columns of a file without a header
            schema = pa.schema([field.with_name(f"_c{i}") for i, field in enumerate(schema)])
        return schema
    with pa_json.open_json(file) as json_reader:
        return json_reader.schema


def _spark_type(arrow_type: pa.DataType, fmt: str) -> str | None:
    """Our Spark type name of a pyarrow type, None when a source cannot carry it."""
    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    scalars = (
        (pa.types.is_int64, "long"),
        (pa.types.is_int32, "int"),
        (pa.types.is_float64, "double"),
        (pa.types.is_float32, "float"),
        (pa.types.is_boolean, "boolean"),
        (pa.types.is_string, "string"),
        (pa.types.is_large_string, "string"),
    )
    for is_type, name in scalars:
        if is_type(arrow_type):
            return name
    # In CSV and JSON these are text pyarrow recognised (or a column empty in the first block):
    # Spark reads the text as it is. Parquet stores them as numbers Spark cannot read as text.
    textual = (pa.types.is_timestamp, pa.types.is_date, pa.types.is_time, pa.types.is_null)
    if fmt != "parquet" and any(is_type(arrow_type) for is_type in textual):
        return "string"
    return None


def infer_fields(directory: Path, fmt: str, *, header: bool = True, delimiter: str = ",") -> dict[str, str]:
    """Field -> Spark type of the first non-empty file in ``directory`` (see :func:`first_file`).

    Parquet: the file's schema. CSV and JSON lines: what pyarrow infers from the file's first
    block (about 1 MiB); a later value of another type (``1.5`` in a ``long`` column) makes its
    line a dead letter. Types map as int64 -> long, int32 -> int, float64 -> double, float32 ->
    float, bool -> boolean, string -> string. In CSV and JSON, timestamps, dates and times are
    read as ``string`` (their text as it is in the file), and so is a column with no value in
    the first block. Anything else (Parquet timestamps and dates, decimals, nested values)
    cannot be inferred: pass ``schema=`` (for Parquet, leaving such a column out is fine, it is
    read by name; for JSON, nested Spark DDL such as ``struct<id:long>`` is accepted).

    Raises:
        TopologyDefinitionError: no file to infer from, an unreadable file, a field whose name
            is not an identifier or whose type has no mapping.
    """
    what = f"{fmt} files at {str(directory)!r}"
    file = first_file(directory)
    if file is None:
        state = "does not exist" if not directory.exists() else "has no non-empty file"
        raise TopologyDefinitionError(f"{what}: cannot infer the schema, the directory {state}; pass schema=")
    try:
        arrow_schema = _arrow_schema(file, fmt, header=header, delimiter=delimiter)
    except (OSError, pa.ArrowException) as e:
        raise TopologyDefinitionError(f"{what}: cannot infer the schema from {file.name}: {e}; pass schema=") from e
    fields: dict[str, str] = {}
    for field in arrow_schema:
        spark_type = _spark_type(field.type, fmt)
        if spark_type is None:
            raise TopologyDefinitionError(
                f"{what}: field {field.name!r} of {file.name} has type {field.type}, which a source cannot carry; "
                "pass schema= without it or with a supported type"
            )
        fields[field.name] = spark_type
    fields = schema_fields(fields, f"{what} (schema inferred from {file.name}; pass schema= to rename)")
    logger.info("%s: schema inferred from %s: %s", what, file.name, schema_ddl(fields))
    return fields


def _header(directory: Path, *, header: bool, delimiter: str) -> list[str] | None:
    """Column names in the header of the first CSV file, None without files or a header."""
    file = first_file(directory)
    if file is None or not header:
        return None
    try:
        return _arrow_schema(file, "csv", header=True, delimiter=delimiter).names
    except (OSError, pa.ArrowException) as e:
        raise TopologyDefinitionError(f"csv files at {str(directory)!r}: cannot read the header of {file.name}: {e}") from e


def check_fields(directory: Path, fmt: str, fields: Mapping[str, str], *, header: bool = True, delimiter: str = ",") -> None:
    """Check a given schema against the first file in ``directory`` (nothing to check without one).

    Parquet (read by name, case-insensitively as Spark does): every field must be a column of
    the file, of the same type or one Spark widens (int -> long, float -> double). CSV (read by
    position): as many fields as the file has columns. JSON lines: nothing (each line is
    checked as it is read; a line that does not fit is a dead letter).

    Raises:
        TopologyDefinitionError: the schema disagrees with the file.
    """
    file = first_file(directory)
    if file is None or fmt == "json":
        return
    what = f"{fmt} files at {str(directory)!r}: schema= disagrees with {file.name}"
    try:
        arrow_schema = _arrow_schema(file, fmt, header=header, delimiter=delimiter)
    except (OSError, pa.ArrowException) as e:
        raise TopologyDefinitionError(f"{fmt} files at {str(directory)!r}: cannot read {file.name}: {e}") from e
    if fmt == "csv":
        if len(arrow_schema) != len(fields):
            raise TopologyDefinitionError(
                f"{what}: it names {len(fields)} fields, the file has {len(arrow_schema)} columns "
                f"({', '.join(arrow_schema.names)}); CSV columns are read by position, so name every one"
            )
        return
    columns = {field.name.lower(): field for field in arrow_schema}
    for name, typ in fields.items():
        column = columns.get(name.lower())
        if column is None:
            raise TopologyDefinitionError(f"{what}: the file has no column {name!r}; its columns: {arrow_schema.names}")
        if is_nested_type(typ):
            continue  # checked by Spark when it reads
        found = _spark_type(column.type, fmt)
        if found != typ and (found, typ) not in _WIDENINGS:
            raise TopologyDefinitionError(f"{what}: field {name!r} is {typ!r} in schema=, the file has {column.type}")


# --- run time ----------------------------------------------------------------------------------


class LandedFilesKind(SourceKind):
    """Landed files of one format in ``spec.path``; one queue (one task) reads them all."""

    def __init__(self, fmt: str) -> None:
        if fmt not in FORMATS:
            raise TopologyDefinitionError(f"unknown landed-files format {fmt!r}; use one of {FORMATS}")
        self.format = fmt
        self.name = kind_name(fmt)
        self.supports_corrupt_column = fmt in ("csv", "json")
        self.asset_kinds = frozenset({fmt})

    def read_stream(
        self,
        spark: SparkSession,
        spec: SourceSpec,
        queue: int,
        *,
        max_files_per_trigger: int,
        max_file_age: str,
    ) -> DataFrame:
        """The files of ``spec.path``; the directory is created when missing (Spark requires it)."""
        directory = self.queue_dir(spec, queue)
        if not directory.exists():
            logger.info("%s: creating the missing directory %s to wait for files", self.name, directory)
            make_dirs(directory)
        reader = (
            spark.readStream.option("maxFilesPerTrigger", max_files_per_trigger)
            .option("maxFileAge", max_file_age)
            .option("recursiveFileLookup", False)
        )
        if self.supports_corrupt_column:
            reader = reader.option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", CORRUPT_COLUMN)
        if self.format == "csv":
            header = bool(spec.options.get("header", True))
            reader = (
                reader.option("header", header)
                .option("sep", str(spec.options.get("delimiter", ",")))
                .option("enforceSchema", not (header and spec.options.get("check_header", True)))
            )
        return reader.schema(schema_ddl(self.columns(spec))).format(self.format).load(str(directory))

    def queue_dir(self, spec: SourceSpec, queue: int) -> Path:
        self.check_spec(spec, queue)
        return self.spec_path(spec)

    def lag(self, spec: SourceSpec, queue: int, consumed_until_ms: int) -> SourceLag:
        """Files newer than ``consumed_until_ms`` and their records: Parquet from each footer;
        CSV and JSON lines by counting lines (less a CSV header; blank lines count as records).

        ``records`` is None when a Parquet footer cannot be read (a file being written, or not
        Parquet: Spark will fail on it).
        """
        records: int | None = 0
        files = 0
        header = 1 if self.format == "csv" and spec.options.get("header", True) else 0
        for file in files_newer_than(self.queue_dir(spec, queue), consumed_until_ms):
            try:
                if self.format == "parquet":
                    count: int | None = pq.read_metadata(file).num_rows
                else:
                    count = max(count_lines(file) - header, 0)
            except FileNotFoundError:
                continue  # removed since it was listed
            except (OSError, pa.ArrowException) as e:
                logger.debug("%s: cannot count the records of %s: %s", self.name, file, e)
                count = None
            files += 1
            records = None if records is None or count is None else records + count
        return SourceLag(records=records, files=files)

    def asset(self, spec: SourceSpec) -> SourceAsset:
        """``files/<parent>/<directory>``: the directory the files land in and the one above."""
        self.spec_path(spec)  # a SourceError without a path
        return SourceAsset(
            key_parts=("files", *directory_key_parts(str(spec.path))),
            kinds=self.asset_kinds,
            description=f"Directory `{spec.path}` of landed {self.format} files read by the stream_ops topologies downstream.",
        )

    def describe(self, spec: SourceSpec) -> str:
        what = {"parquet": "Parquet", "csv": "CSV", "json": "JSON-lines"}[self.format]
        return f"reads {what} files landed in `{spec.path}`"
