"""Parquet sink files: a task's batch as Parquet files that become visible only once committed.

Layout under the sink's root (``<owner>`` is ``<topology id>.<sink name>``, so files of two
submissions, or of two sinks, never share a name: a resubmitted topology's txids start again at 0)::

    <root>/[<col>=<value>/...]<owner>.t00003-x000000000012-e000001.parquet   committed, visible
    <root>/_staging/[<col>=<value>/...]<owner>.t...-e....parquet.staged       staged, invisible
    <root>/_committed/<owner>.t00003-x000000000012.json                      one marker per committed batch

A batch is written with an explicit schema from the stream's fields, hive-partitioned by
``partition_by`` (values escaped as Hive and Spark do; null or empty is
``__HIVE_DEFAULT_PARTITION__``; the partition columns are not stored in the files). Staged
files end in ``.staged`` under ``_staging/`` (Spark skips ``_`` directories, and no
``*.parquet`` glob matches them), so ``spark.read.parquet(root)`` and DuckDB's
``read_parquet('root/**/*.parquet', hive_partitioning=true)`` only ever see complete,
committed files. Publishing renames them into place after the ZooKeeper commit and writes the
batch's marker (``{"task", "txid", "epoch", "files", "owner"}``), which readers that want exactly the
committed files can use (:func:`committed_files`, :func:`read_table`). One marker per batch,
so tasks (and a stale owner finishing its last publish) never write the same marker file.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from stream_ops.arrow_types import ARROW_TYPES
from stream_ops.durable_files import fsync_dir, fsync_dirs, fsync_file, make_dirs
from stream_ops.errors import TopicError
from stream_ops.helpers.field_paths import value_or_none
from stream_ops.topics.publishing import publish_file

STAGING = "_staging"
COMMITTED = "_committed"
STAGED_SUFFIX = ".staged"
DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"

_BATCH_FILE = re.compile(r"^(?P<owner>[^/]*\.)?t(?P<task>\d+)-x(?P<txid>\d+)-e(?P<epoch>\d+)\.parquet$")
_TEMP_FILE = re.compile(r"^\.(?P<name>.+)\.[0-9a-f]{32}\.tmp$")
# Hive's FileUtils.escapePathName set (Spark uses the same): control characters and these.
_ESCAPED = set("\"#%'*/:=?\\\x7f{[]^")


def batch_file_name(task_id: int, txid: int, epoch: int, owner: str | None = None) -> str:
    """``[<owner>.]t<task>-x<txid>-e<epoch>.parquet``: what a task writes for one batch (per partition)."""
    return f"{owner + '.' if owner else ''}t{task_id:05d}-x{txid:012d}-e{epoch:06d}.parquet"


def escape_partition_value(value: Any) -> str:
    """A partition value as a directory name part (Hive's escaping; null/empty -> default)."""
    if value is None or value == "":
        return DEFAULT_PARTITION
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return "".join(f"%{ord(ch):02X}" if ch in _ESCAPED or ord(ch) < 32 else ch for ch in text)


def partition_column(field: str) -> str:
    """The directory column name of a partition field (a nested ``a.b`` becomes ``a_b``)."""
    return field.replace(".", "_")


def _arrow_type(typ: str) -> pa.DataType:
    # Nested Spark types (struct<...>, map<...>, array<...>) are stored as JSON text.
    return ARROW_TYPES.get(typ, pa.string())


class ParquetSink:
    """The Parquet files of one ``to_parquet`` sink (a :class:`~stream_ops.topics.staged_output.StagedOutput`).

    Args:
        path: The sink's root directory.
        fields: The stream's fields and their types (the files' schema, minus partition columns).
        partition_by: Fields whose values become ``col=value`` directories.
        durable: fsync files and directories (turn off only for throwaway data).
        owner: Prefix of every file name: the runtime gives ``<topology id>.<sink name>``
            (:func:`~stream_ops.topology.sink_paths.sink_owner`); None writes bare ``t-x-e``
            names (one writer only).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        fields: Mapping[str, str],
        *,
        partition_by: Sequence[str] = (),
        durable: bool = True,
        owner: str | None = None,
    ) -> None:
        self.root = Path(path)
        self.owner = owner
        self.fields = dict(fields)
        self.partition_by = tuple(partition_by)
        self.durable = durable
        data = [f for f in self.fields if f not in self.partition_by]
        self.schema = pa.schema([(f, _arrow_type(self.fields[f])) for f in data])

    @property
    def output_id(self) -> str:
        return str(self.root)

    # --- staging ---------------------------------------------------------------------------

    def stage_batch(self, task_id: int, txid: int, epoch: int, records: Sequence[Mapping[str, Any]]) -> list[Path]:
        """Write a batch's records as staged Parquet files (one per partition directory).

        The files are durable when this returns (unless not ``durable``). An empty batch
        stages nothing.
        """
        by_partition: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
        for record in records:
            directory = "/".join(
                f"{partition_column(f)}={escape_partition_value(value_or_none(record, f))}" for f in self.partition_by
            )
            by_partition[directory].append(record)
        name = batch_file_name(task_id, txid, epoch, self.owner)
        written = []
        for directory, rows in sorted(by_partition.items()):
            relative = f"{directory}/{name}" if directory else name
            target = self.root / STAGING / (relative + STAGED_SUFFIX)
            self._write(target, rows)
            written.append(target)
        return written

    def _write(self, target: Path, rows: list[Mapping[str, Any]]) -> None:
        columns = {
            field.name: [_cell(value_or_none(row, field.name), self.fields[field.name]) for row in rows] for field in self.schema
        }
        table = pa.Table.from_pydict(columns, schema=self.schema)
        self._replace_atomically(target, lambda temp: pq.write_table(table, temp))

    def _replace_atomically(self, target: Path, write: Callable[[Path], object]) -> None:
        """``write`` a hidden temp file next to ``target``, fsync it, rename it into place."""
        make_dirs(target.parent)
        temp = target.parent / f".{target.name}.{uuid.uuid4().hex}.tmp"
        try:
            write(temp)
            if self.durable:
                fsync_file(temp)
            os.replace(temp, target)
        finally:
            temp.unlink(missing_ok=True)
        if self.durable:
            fsync_dir(target.parent)

    def staged_sizes(self, task_id: int, txid: int, epoch: int) -> dict[str, int]:
        """Relative path -> size of every staged file of (task, txid, epoch)."""
        name = batch_file_name(task_id, txid, epoch, self.owner) + STAGED_SUFFIX
        staging = self.root / STAGING
        if not staging.exists():
            return {}
        return {
            str(path.relative_to(staging))[: -len(STAGED_SUFFIX)]: path.stat().st_size
            for path in staging.rglob(name)
            if path.is_file()
        }

    # --- publishing ------------------------------------------------------------------------

    def publish_batch(self, task_id: int, txid: int, epoch: int, expected: Mapping[str, int]) -> int:
        """Rename the committed batch's staged files into place, check them against the commit
        record and write the batch's marker. Idempotent; safe to run from two processes.

        Raises:
            CommittedBatchLostError: a recorded file is neither staged nor published, or has
                another size.
        """
        moved = 0
        touched: list[Path] = []
        for relative, size in sorted(expected.items()):
            what = f"parquet sink {self.root}: file {relative} of committed batch txid {txid} (task {task_id}, epoch {epoch})"
            dirs = publish_file(self.root / STAGING / (relative + STAGED_SUFFIX), self._safe(relative), size, what=what)
            moved += bool(dirs)
            touched += dirs
        if touched and self.durable:
            fsync_dirs(touched)
        if expected:
            self._write_marker(task_id, txid, epoch, sorted(expected))
        return moved

    def _write_marker(self, task_id: int, txid: int, epoch: int, files: list[str]) -> None:
        owner = f"{self.owner}." if self.owner else ""
        marker = self.root / COMMITTED / f"{owner}t{task_id:05d}-x{txid:012d}.json"
        if marker.exists():
            return
        body: dict[str, Any] = {"task": task_id, "txid": txid, "epoch": epoch, "files": files}
        if self.owner:
            body["owner"] = self.owner
        text = json.dumps(body)
        self._replace_atomically(marker, lambda temp: temp.write_text(text, encoding="utf-8"))

    def _safe(self, relative: str) -> Path:
        target = (self.root / relative).resolve()
        if not target.is_relative_to(self.root.resolve()) or relative.startswith((STAGING, COMMITTED)):
            raise TopicError(f"parquet sink {self.root}: {relative!r} is not a file of the sink")
        return self.root / relative

    # --- cleaning up -----------------------------------------------------------------------

    def discard_staged(self, task_id: int, *, below_epoch: int, keep: tuple[int, int] | None = None) -> int:
        """Delete the task's staged and temp files of epochs below ``below_epoch`` except ``keep``."""
        removed = 0
        staging = self.root / STAGING
        if not staging.exists():
            return 0
        for path in list(staging.rglob("*")):
            if not path.is_file():
                continue
            temp = _TEMP_FILE.match(path.name)
            name = temp["name"] if temp else path.name
            found = _BATCH_FILE.match(name.removesuffix(STAGED_SUFFIX))
            if found is None or (found["owner"] or "")[:-1] != (self.owner or "") or int(found["task"]) != task_id:
                continue
            if int(found["epoch"]) >= below_epoch:
                continue
            if temp is None and (int(found["txid"]), int(found["epoch"])) == keep:
                continue
            path.unlink(missing_ok=True)
            removed += 1
        return removed


def _cell(value: Any, typ: str) -> Any:
    if value is None or typ in ARROW_TYPES:
        return value
    return json.dumps(value, default=str)


def committed_markers(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every committed batch's marker of the sink at ``path``, by task then txid."""
    markers = []
    for marker in sorted((Path(path) / COMMITTED).glob("*t*-x*.json")):
        try:
            markers.append(json.loads(marker.read_text(encoding="utf-8")))
        except FileNotFoundError:
            continue
    return markers


def committed_files(path: str | os.PathLike[str]) -> list[Path]:
    """The sink's committed files (what its markers list), sorted."""
    root = Path(path)
    return sorted({root / name for marker in committed_markers(root) for name in marker.get("files", [])})


def read_table(path: str | os.PathLike[str]) -> pa.Table:
    """The sink's committed rows as one table, hive partition columns restored (types inferred)."""
    import pyarrow.dataset as ds

    root = Path(path)
    files = [str(f) for f in committed_files(root)]
    if not files:
        return pa.table({})
    dataset = ds.dataset(files, format="parquet", partitioning="hive", partition_base_dir=str(root))
    return dataset.to_table()
