"""Partial-aggregate shuffle files in Parquet: what a stage sends a keyed stage per batch.

A source task's partial aggregates for one queue of a keyed stage are one Parquet file of
two columns, ``key`` (the encoded key, text) and ``value`` (the partial, typed as the keyed
stage reads it), named and staged like every batch file of a
:class:`~stream_ops.topics.file_topic.FileTopic`: ``t<task>-x<txid>-e<epoch>.parquet`` under
the topic's ``.pending/`` directory until the batch commits, then published into its queue with
the size the commit recorded. A replay writes the same name again. Partials files are chained
(see :mod:`stream_ops.topics.file_topic`): each names, in its key-value metadata, the txid of
its task's previous file in the queue (:func:`previous_txid`), so the keyed stage tells a txid
that had no partials for its queue from a lost file.

The keyed stage reads these files with pyarrow on the driver (no Spark job); Spark can still
stream them (``readStream.schema(...).parquet(dir)``). A stage reading partials always reads
them in Parquet (``StageSpec.shuffle_format``; a plan saying otherwise is refused).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from stream_ops.arrow_types import ARROW_TYPES
from stream_ops.durable_files import fsync_dirs
from stream_ops.errors import CommittedBatchLostError, TopicError
from stream_ops.helpers.line_counts import count_lines
from stream_ops.topics.file_topic import (
    PREVIOUS_TXID_KEY,
    FileTopic,
    QueueChains,
    batch_file_name,
    queue_sizes,
    write_bytes_atomically,
)
from stream_ops.topics.publishing import publish_file


def partials_schema(value_type: str) -> pa.Schema:
    """The schema of a partials file whose values have Spark type ``value_type``."""
    return pa.schema([("key", pa.string()), ("value", ARROW_TYPES[value_type])])


def partials_table(keys: Sequence[str], values: Sequence[Any], value_type: str) -> pa.Table:
    """(key, partial) pairs as a table of :func:`partials_schema`.

    A value the type cannot hold (a user combiner's float declared ``long``, an integer beyond
    its range, a number declared ``boolean``) is stored as null, as Spark reads such a value
    from JSON; the keyed stage then dead-letters the key's partial.
    """
    schema = partials_schema(value_type)
    fits = _FITS[value_type]
    column = values if all(fits(v) or v is None for v in values) else [v if fits(v) else None for v in values]
    return pa.Table.from_arrays([pa.array(keys, pa.string()), pa.array(column, schema.field("value").type)], schema=schema)


def _integer(bits: int) -> Callable[[Any], bool]:
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and low <= v <= high


_FITS: dict[str, Callable[[Any], bool]] = {
    "long": _integer(64),
    "int": _integer(32),
    "double": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
}
"""Whether a partial can be stored as each value type (pyarrow would truncate 1.5 to 1)."""


def write_table_atomically(target: Path, table: pa.Table, *, durable: bool = True) -> None:
    """Write ``table`` as a Parquet file at ``target`` via a hidden temp file and a rename
    (:func:`~stream_ops.topics.file_topic.write_bytes_atomically`)."""
    buffer = pa.BufferOutputStream()
    # Uncompressed: a batch's partials are small, and compressing them costs more than it saves.
    pq.write_table(table, buffer, compression="none")
    write_bytes_atomically(target, buffer.getvalue(), durable=durable)


def read_partials(paths: Sequence[Path], value_type: str) -> pa.Table:
    """The (key, value) rows of partials files, in the order of ``paths``.

    Raises:
        TopicError: a file cannot be read or is not a partials file.
    """
    schema = partials_schema(value_type)
    tables = []
    for path in paths:
        try:
            table = pq.read_table(path)
        except (OSError, pa.ArrowInvalid) as e:
            raise TopicError(f"could not read the shuffle file {path}: {e}") from e
        if table.schema.names != ["key", "value"]:
            raise TopicError(f"{path} is not a partials shuffle file: its columns are {table.schema.names}")
        tables.append(table.cast(schema))
    return pa.concat_tables(tables) if tables else schema.empty_table()


def read_record_rows(paths: Sequence[Path]) -> list[tuple[str, str | None, Any]]:
    """The (stream tag, encoded key, record) rows of JSON-lines records shuffle files, in the
    order of ``paths`` and their lines: what Spark's JSON reader with the records fields
    (``stream``, ``key``, ``record`` as strings) collects, each ``record`` text parsed. Lines
    without a record (a chained file's link to its predecessor) are skipped, as the records
    stage skips Spark's rows without one.

    Raises:
        TopicError: a file cannot be read, or holds a line that is not a JSON object.
    """
    rows = []
    for path in paths:
        try:
            data = path.read_bytes()
        except OSError as e:
            raise TopicError(f"could not read the shuffle file {path}: {e}") from e
        for number, line in enumerate(data.split(b"\n")):
            if not line.strip():
                continue
            try:
                fields = json.loads(line)
                text = fields.get("record") if isinstance(fields, dict) else None
                if text is None:
                    continue
                rows.append((fields.get("stream"), fields.get("key"), json.loads(text)))
            except (ValueError, TypeError) as e:
                raise TopicError(f"{path}:{number + 1}: not a records shuffle line: {e}") from e
    return rows


def shuffle_file_rows(path: Path) -> int:
    """Rows of one shuffle file, Parquet (from its footer) or JSON lines (its lines)."""
    if path.suffix == ".parquet":
        try:
            return int(pq.ParquetFile(path).metadata.num_rows)
        except (OSError, pa.ArrowInvalid) as e:
            raise TopicError(f"could not read the shuffle file {path}: {e}") from e
    return count_lines(path)


def previous_txid(path: Path) -> int | None:
    """The txid of the file its task wrote into the same queue before ``path`` (-1: none), as
    the file of a chained topic says (Parquet metadata, or the first JSON line's
    :data:`~stream_ops.topics.file_topic.PREVIOUS_TXID_KEY`); None when it does not say (not a
    file of a chained topic).

    Raises:
        CommittedBatchLostError: the file is gone.
        TopicError: the file cannot be read.
    """
    try:
        if path.suffix == ".parquet":
            found = (pq.read_metadata(path).metadata or {}).get(PREVIOUS_TXID_KEY.encode())
        else:
            with open(path, "rb") as f:
                first = json.loads(f.readline() or b"{}")
            found = first.get(PREVIOUS_TXID_KEY) if isinstance(first, dict) else None
        return None if found is None else int(found)
    except FileNotFoundError:
        raise CommittedBatchLostError(
            f"the shuffle file {path} is gone while its batch reads it; restore it from a backup, or accept the loss by "
            "re-running the topology"
        ) from None
    except (OSError, ValueError, pa.ArrowInvalid) as e:
        raise TopicError(f"could not read the shuffle file {path}: {e}") from e


class PartialsShuffle:
    """The Parquet partials files into one keyed stage (a :class:`~stream_ops.topics.staged_output.StagedOutput`).

    Example:
        >>> shuffle = PartialsShuffle(FileTopic("/topics/shuffle-001-words", queues=2), "long")
        >>> shuffle.staged_path(1, task_id=0, txid=7, epoch=1).name
        't00000-x000000000007-e000001.parquet'
    """

    suffix = ".parquet"

    def __init__(self, topic: FileTopic, value_type: str) -> None:
        if value_type not in ARROW_TYPES:
            raise TopicError(
                f"{topic.path}: partials of type {value_type!r} cannot be shuffled; use one of {sorted(ARROW_TYPES)}"
            )
        self.topic = topic
        self.value_type = value_type
        self._chains = QueueChains(topic.queues)

    @property
    def output_id(self) -> str:
        """The topic's identity in commit records (its root path, as for JSON shuffles)."""
        return self.topic.output_id

    def staged_path(self, queue: int, *, task_id: int, txid: int, epoch: int) -> Path:
        """Where (task, txid, epoch)'s file for ``queue`` is staged."""
        return self.topic.pending_path(queue) / batch_file_name(task_id, txid, epoch, self.suffix)

    def stage_batch(self, queue: int, task_id: int, txid: int, epoch: int, keys: Sequence[str], values: Sequence[Any]) -> Path:
        """Stage one queue's partials of a batch, naming the task's previous file in the queue
        when it is known (durable when this returns if the topic is)."""
        target = self.staged_path(queue, task_id=task_id, txid=txid, epoch=epoch)
        table = partials_table(keys, values, self.value_type)
        previous = self._chains.previous(task_id, txid, queue)
        if previous is not None:
            table = table.replace_schema_metadata({PREVIOUS_TXID_KEY: str(previous)})
        write_table_atomically(target, table, durable=self.topic.durable)
        return target

    def staged_sizes(self, task_id: int, txid: int, epoch: int) -> dict[str, int]:
        """Queue number (as text) -> size of each staged file of (task, txid, epoch), and the
        ``head:<queue>`` entries of the queues without one: what a commit records."""
        sizes: dict[str, int] = {}
        for queue in range(self.topic.queues):
            try:
                sizes[str(queue)] = self.staged_path(queue, task_id=task_id, txid=txid, epoch=epoch).stat().st_size
            except FileNotFoundError:
                continue
        sizes.update(self._chains.commit_keys(task_id, txid, map(int, sizes)))
        return sizes

    def publish_batch(self, task_id: int, txid: int, epoch: int, expected: Mapping[str, int] | Mapping[int, int]) -> int:
        """Move a committed batch's staged files into their queues, checked against the sizes
        the commit recorded (as :meth:`FileTopic.publish_batch` does), and learn the task's last
        file per queue from the record; returns the files moved.

        Raises:
            CommittedBatchLostError: a recorded file is neither staged nor published, or has
                another size.
        """
        name = batch_file_name(task_id, txid, epoch, self.suffix)
        moved = 0
        touched: list[Path] = []
        for queue, size in sorted(queue_sizes(expected).items()):
            what = f"{self.topic.path}: the partials of committed batch txid {txid} (task {task_id}, epoch {epoch}) for queue {queue}"
            dirs = publish_file(
                self.topic.pending_path(queue) / name,
                self.topic.queue_path(queue) / name,
                size,
                what=what,
                consumed=functools.partial(self.topic.is_consumed, queue, task_id, txid),
            )
            moved += bool(dirs)
            touched += dirs
        if touched and self.topic.durable:
            fsync_dirs(touched)
        self._chains.committed(task_id, txid, expected)
        return moved

    def discard_staged(self, task_id: int, *, below_epoch: int, keep: tuple[int, int] | None = None) -> int:
        """Delete the task's staged and temp files of epochs below ``below_epoch`` except ``keep``."""
        return self.topic.discard_staged(task_id, below_epoch=below_epoch, keep=keep)

    def read_queue(self, queue: int) -> pa.Table:
        """Every published (key, value) row of a queue, files in name order."""
        return read_partials([p for p in self.topic.files(queue) if p.suffix == self.suffix], self.value_type)
