"""FileTopic: a partitioned, append-only log of JSON-lines (or binary) files on a shared path.

One directory per queue (``queue-00000``, ...). Every file is written under a hidden temporary
name and renamed into place, so a Spark file stream never sees half a file. Files a task writes
for a batch are named by (task, txid, owner epoch): a replayed batch writes the same name again
and so overwrites or is skipped, never duplicated.

A task's batch outputs are *staged* under ``.pending/`` and fsynced (file and directory) before
the batch commits in ZooKeeper, then *published* (renamed into their queues, directories
fsynced) after it. Publishing checks the files against what the commit recorded and fails
loudly when a committed file is missing or cut short. Deleting staged files is limited to
epochs below the caller's own, so a stale owner never removes a newer owner's work. A queue's
one reader deletes the files its committed batches consumed, after recording them as consumed
(``_consumed-v<version>.json``, a :class:`~stream_ops.durable_files.ForwardMarker`: a stale
reader finishing late never moves it back), so a committed file that is gone because it was
read is not taken for lost.

A *chained* topic (a shuffle) lets its reader prove that a committed batch file it does not
find was never written, rather than lost: an upstream task writes a file into a queue only
for a batch with rows for it, so its files in one queue skip txids. Each file names the txid
of the task's previous file in the same queue (:data:`PREVIOUS_TXID_KEY`: a field of the first
JSON line, which readers with a schema ignore, or Parquet key-value metadata), and the reader
checks every skipped txid against it (:func:`stream_ops.spark.shuffle_queue.batch_files`).
The writer knows its previous files from its own commits: each commit records, beside the
staged sizes, per queue without a file the txid of the last one (``head:<queue>``,
:class:`QueueChains`), and a new owner learns them from the committed record it publishes.
No file, fsync or ZooKeeper round trip is added per batch.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import os
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from stream_ops.durable_files import FILE_MODE, ForwardMarker, fsync_dir, fsync_dirs, make_dirs
from stream_ops.errors import TopicError
from stream_ops.helpers.compact_json import compact_json_lines
from stream_ops.topics.publishing import publish_file

logger = logging.getLogger(__name__)

_BATCH_FILE = re.compile(r"^t(?P<task>\d+)-x(?P<txid>\d+)-e(?P<epoch>\d+)(?P<suffix>\.jsonl|\.arrow|\.parquet)$")
BATCH_FILE_SUFFIXES = (".jsonl", ".arrow", ".parquet")
"""The formats a batch file can be in: JSON lines, Arrow IPC (stream format) or Parquet."""
_TEMP_FILE = re.compile(r"^\.(?P<name>.+)\.[0-9a-f]{32}\.tmp$")
CONSUMED_MARKER = "_consumed"
"""The stem of a queue's record of the batches its reader consumed
(``_consumed-v<version>.json``, :meth:`FileTopic.retire_consumed`)."""
PREVIOUS_TXID_KEY = "stream_ops.previous_txid"
"""Where a chained topic's file names the txid of its task's previous file in the same queue
(-1: none): a field of its first JSON line, or a key of a Parquet file's metadata."""
HEAD_KEY_PREFIX = "head:"
"""Commit-record keys ``head:<queue>`` of a chained topic: for a queue the batch wrote no file
to, the txid of the task's last file there (-1: none yet)."""


def batch_file_name(task_id: int, txid: int, epoch: int, suffix: str = ".jsonl") -> str:
    """Name of the file a task writes for one batch; sorts by txid then epoch within a task.

    ``suffix`` names the file's format (one of :data:`BATCH_FILE_SUFFIXES`).
    """
    if suffix not in BATCH_FILE_SUFFIXES:
        raise TopicError(f"batch file suffix must be one of {BATCH_FILE_SUFFIXES}, got {suffix!r}")
    return f"t{task_id:05d}-x{txid:012d}-e{epoch:06d}{suffix}"


@dataclass(frozen=True)
class BatchFileId:
    """The (task, txid, epoch) a batch file was written under."""

    task_id: int
    txid: int
    epoch: int


def parse_batch_file_name(name: str) -> BatchFileId | None:
    """The (task, txid, epoch) of a batch file name, or None for other files."""
    match = _BATCH_FILE.match(name)
    if match is None:
        return None
    return BatchFileId(int(match["task"]), int(match["txid"]), int(match["epoch"]))


def queue_sizes(expected: Mapping[str, int] | Mapping[int, int]) -> dict[int, int]:
    """Queue -> size of the files a commit recorded for a topic (its ``head:`` entries left out)."""
    return {int(key): size for key, size in expected.items() if not str(key).startswith(HEAD_KEY_PREFIX)}


@dataclass(frozen=True)
class _Heads:
    txid: int
    """The committed txid the heads are as of."""
    queues: dict[int, int]
    """Queue -> the txid of the task's last file there up to ``txid`` (-1: none); a queue
    missing is not known (a record without its ``head:`` entries)."""


class QueueChains:
    """What an upstream task knows of its own files in each queue of a chained topic: the
    txid of its last file there, learned from its commits (see the module docstring).

    Kept per task in memory by the task's topic object, from one batch's publish to the next
    batch's staging; a new owner learns it from the committed batch it publishes first (a
    task's start publishes it). An object that has not published the task's previous batch
    does not know, and its file names no previous txid: a reader refuses such a file after a
    gap (:func:`stream_ops.spark.shuffle_queue.batch_files`).
    """

    def __init__(self, queues: int) -> None:
        self.queues = queues
        self._known: dict[int, _Heads] = {}

    def previous(self, task_id: int, txid: int, queue: int) -> int | None:
        """The txid of ``task_id``'s last file in ``queue`` before ``txid`` (-1: none), or None
        when not known."""
        if txid == 0:
            return -1
        known = self._known.get(task_id)
        if known is None or known.txid != txid - 1:
            return None
        return known.queues.get(queue)

    def commit_keys(self, task_id: int, txid: int, written: Iterable[int]) -> dict[str, int]:
        """The ``head:<queue>`` entries the commit of ``txid`` records beside its sizes: for each
        queue without a file in ``written``, the txid of the task's last file there, if known."""
        wrote = set(written)
        keys: dict[str, int] = {}
        for queue in range(self.queues):
            previous = None if queue in wrote else self.previous(task_id, txid, queue)
            if previous is not None:
                keys[f"{HEAD_KEY_PREFIX}{queue}"] = previous
        return keys

    def committed(self, task_id: int, txid: int, expected: Mapping[str, int] | Mapping[int, int]) -> None:
        """Learn from the commit record of ``txid`` (its sizes and ``head:`` entries), as it is
        published; an older batch published again changes nothing."""
        known = self._known.get(task_id)
        if known is not None and known.txid > txid:
            return
        queues = dict.fromkeys(queue_sizes(expected), txid)
        for key, value in expected.items():
            if str(key).startswith(HEAD_KEY_PREFIX):
                queues[int(str(key)[len(HEAD_KEY_PREFIX) :])] = int(value)
        self._known[task_id] = _Heads(txid, queues)


def with_previous_txid(records: Iterable[Any], previous: int | None) -> Iterable[Any]:
    """``records`` with :data:`PREVIOUS_TXID_KEY` added to the first one (a dict), when
    ``previous`` is known."""
    if previous is None:
        return records
    rows = iter(records)
    for first in rows:
        if isinstance(first, dict):
            first = {**first, PREVIOUS_TXID_KEY: previous}
        return itertools.chain([first], rows)
    return ()


def write_json_lines_atomically(target: Path, records: Iterable[Any], *, durable: bool = True) -> int:
    """Write records as JSON lines to ``target`` via a hidden temp file and a rename.

    With ``durable`` the file is fsynced before the rename and its directory after it, so
    once this returns the file survives an OS crash with all its lines.

    Returns the number of records written.
    """
    return write_lines_atomically(target, encode_json_lines(records, target), durable=durable)


def encode_json_lines(records: Iterable[Any], target: Path | str) -> list[str]:
    """Each record as the compact JSON line a batch file holds (:func:`compact_json_lines`).

    Raises:
        TopicError: a record is not JSON-serialisable (``target`` names the file in the message).
    """
    try:
        return compact_json_lines(records)
    except (TypeError, ValueError) as e:
        raise TopicError(f"record for {target} is not JSON-serialisable: {e}") from e


@contextmanager
def _replaced_atomically(target: Path, *, durable: bool) -> Iterator[BinaryIO]:
    """A new hidden temp file next to ``target`` (a :class:`FileTopic` temp name, so owners clean
    up a crashed write), renamed onto ``target`` once the block ends; with ``durable`` the file
    is fsynced before the rename and its directory after it. An error removes the temp file."""
    make_dirs(target.parent)
    tmp = target.parent / f".{target.name}.{uuid.uuid4().hex}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), FILE_MODE)
        with os.fdopen(fd, "wb") as out:
            yield out
            if durable:
                out.flush()
                os.fsync(out.fileno())
        os.replace(tmp, target)
        if durable:
            fsync_dir(target.parent)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise TopicError(f"could not write {target}: {e}") from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_lines_atomically(target: Path, lines: Iterable[str], *, durable: bool = True) -> int:
    """:func:`write_json_lines_atomically` for lines already encoded (each one JSON text)."""
    count = 0
    try:
        with _replaced_atomically(target, durable=durable) as out:
            # In chunks of lines, each written in one call: a file of small lines costs a
            # few writes, not two per line.
            chunk: list[str] = []
            for line in lines:
                chunk.append(line)
                if len(chunk) == _LINES_PER_WRITE:
                    out.write(("\n".join(chunk) + "\n").encode("utf-8"))
                    count += len(chunk)
                    chunk.clear()
            if chunk:
                out.write(("\n".join(chunk) + "\n").encode("utf-8"))
                count += len(chunk)
    except TypeError as e:
        raise TopicError(f"record for {target} is not JSON-serialisable: {e}") from e
    return count


_LINES_PER_WRITE = 4096
"""How many lines :func:`write_lines_atomically` joins into one write."""


def write_bytes_atomically(target: Path, data: bytes | memoryview, *, durable: bool = True) -> int:
    """Write ``data`` to ``target`` via a hidden temp file and a rename (see
    :func:`write_json_lines_atomically` for ``durable``); returns the bytes written."""
    with _replaced_atomically(target, durable=durable) as out:
        out.write(data)
    return len(memoryview(data))


@dataclass(frozen=True)
class FileTopic:
    """A topic of ``queues`` queues under ``path``.

    Example:
        >>> topic = FileTopic("/data/sentences", queues=2)
        >>> topic.queue_path(1).name
        'queue-00001'
    """

    path: str | os.PathLike[str]
    queues: int = 1
    durable: bool = True
    """fsync batch files and their directories (turn off only for throwaway data or to measure the cost)."""
    chained: bool = False
    """A shuffle: each JSON-lines file names its task's previous file in the queue, and commits
    record the last file per queue (see the module docstring). Never for a topic users read."""
    owner: str | None = None
    """Prefix of the batch files this writer stages and publishes (``<owner>.t-x-e.jsonl``): a
    topology's ``to_topic`` sink gives ``<topology id>.<sink name>``, so a resubmission, whose
    txids start again at 0, or another topology never writes a name already published. None for
    the topics stream_ops owns (shuffles, state, dead letters), named by (task, txid, epoch)."""
    _chains: QueueChains = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.queues, int) or isinstance(self.queues, bool) or self.queues < 1:
            raise TopicError(f"FileTopic {self.path!s}: queues must be a positive integer, got {self.queues!r}")
        object.__setattr__(self, "path", str(self.path))
        object.__setattr__(self, "_chains", QueueChains(self.queues))

    @property
    def root(self) -> Path:
        return Path(self.path)

    @property
    def _prefix(self) -> str:
        return f"{self.owner}." if self.owner else ""

    def _batch_name(self, task_id: int, txid: int, epoch: int) -> str:
        """The name of this writer's file of one batch: :func:`batch_file_name`, after its :attr:`owner`."""
        return self._prefix + batch_file_name(task_id, txid, epoch)

    @property
    def output_id(self) -> str:
        """The topic's identity in commit records (:class:`~stream_ops.topics.staged_output.StagedOutput`)."""
        return str(self.path)

    def queue_path(self, queue: int) -> Path:
        """Directory of one queue."""
        if not 0 <= queue < self.queues:
            raise TopicError(f"queue {queue} out of range for {self.path} with {self.queues} queues")
        return self.root / f"queue-{queue:05d}"

    def create(self) -> None:
        """Create the queue directories (idempotent)."""
        for q in range(self.queues):
            make_dirs(self.queue_path(q))

    def _visible_target(self, queue: int, name: str) -> Path:
        """Where a file ``name`` of ``queue`` goes; refused when Spark would not list it."""
        if name.startswith((".", "_")):
            raise TopicError(f"file name {name!r} would be ignored by Spark (starts with '.' or '_')")
        return self.queue_path(queue) / name

    def write_file(self, queue: int, name: str, records: Iterable[Any], *, overwrite: bool = True) -> Path:
        """Atomically write one file of JSON lines into a queue.

        With ``overwrite=False`` an existing file of that name is kept as it is (a replayed
        batch that was already published).
        """
        target = self._visible_target(queue, name)
        if not overwrite and target.exists():
            return target
        write_json_lines_atomically(target, records, durable=self.durable)
        return target

    def write_lines(self, queue: int, name: str, lines: Iterable[str], *, overwrite: bool = True) -> Path:
        """:meth:`write_file` for lines already encoded as JSON text (one record each)."""
        target = self._visible_target(queue, name)
        if not overwrite and target.exists():
            return target
        write_lines_atomically(target, lines, durable=self.durable)
        return target

    def write_bytes(self, queue: int, name: str, data: bytes | memoryview, *, overwrite: bool = True) -> Path:
        """:meth:`write_file` for a file already encoded as bytes (e.g. an Arrow IPC file)."""
        target = self._visible_target(queue, name)
        if not overwrite and target.exists():
            return target
        write_bytes_atomically(target, data, durable=self.durable)
        return target

    # --- staged batches: written before a commit, published (renamed into place) after it ----

    def pending_path(self, queue: int) -> Path:
        """Hidden directory of a queue's staged files (Spark never lists it)."""
        self.queue_path(queue)  # range check
        return self.root / ".pending" / f"queue-{queue:05d}"

    def stage_batch(self, queue: int, task_id: int, txid: int, epoch: int, records: Iterable[Any]) -> Path:
        """Write a batch's file where readers cannot see it yet (see :meth:`publish_batch`); in a
        chained topic its first record names the task's previous file in the queue.

        The file is durable when this returns (unless the topic is not ``durable``).
        """
        target = self.pending_path(queue) / self._batch_name(task_id, txid, epoch)
        if self.chained:
            records = with_previous_txid(records, self._chains.previous(task_id, txid, queue))
        write_json_lines_atomically(target, records, durable=self.durable)
        return target

    def stage_lines(self, queue: int, task_id: int, txid: int, epoch: int, lines: Iterable[str]) -> Path:
        """:meth:`stage_batch` for records already encoded as JSON lines (:func:`encode_json_lines`);
        not for a chained topic, whose first line the staging changes."""
        if self.chained:
            raise TopicError(f"{self.path}: a chained topic stages records (its first line names the previous file)")
        target = self.pending_path(queue) / self._batch_name(task_id, txid, epoch)
        write_lines_atomically(target, lines, durable=self.durable)
        return target

    def staged_sizes(self, task_id: int, txid: int, epoch: int) -> dict[str, int]:
        """Queue number (as text) -> size in bytes of each staged file of (task, txid, epoch):
        what a commit records; a chained topic adds its ``head:<queue>`` entries."""
        name = self._batch_name(task_id, txid, epoch)
        sizes: dict[str, int] = {}
        for queue in range(self.queues):
            try:
                sizes[str(queue)] = (self.pending_path(queue) / name).stat().st_size
            except FileNotFoundError:
                continue
        if self.chained:
            sizes.update(self._chains.commit_keys(task_id, txid, map(int, sizes)))
        return sizes

    def publish_batch(self, task_id: int, txid: int, epoch: int, expected: Mapping[str, int] | Mapping[int, int]) -> int:
        """Move the staged files of a committed (task, txid, epoch) into their queues.

        ``expected`` is what the commit recorded (:meth:`staged_sizes`): every queue named must
        end with a published file of exactly that size, moved now or by an earlier (or a
        concurrent) publish of the same batch; a chained topic learns its task's last file per
        queue from it. A moved file gets the current time as its modification time, so a file
        stream whose ``maxFileAge`` is measured from the newest file still reads a batch
        published late. Idempotent; safe to run from two processes.

        Returns:
            How many files this call moved.

        Raises:
            CommittedBatchLostError: a file the commit recorded is neither staged nor published,
                or has another size: the batch's output was lost (e.g. an OS crash on a mount
                that ignored fsync) and must not be silently skipped.
        """
        name = self._batch_name(task_id, txid, epoch)
        moved = 0
        touched: list[Path] = []
        for queue, size in sorted(queue_sizes(expected).items()):
            what = f"{self.path}: the output of committed batch txid {txid} (task {task_id}, epoch {epoch}) for queue {queue}"
            dirs = publish_file(
                self.pending_path(queue) / name,
                self.queue_path(queue) / name,
                size,
                what=what,
                consumed=functools.partial(self.is_consumed, queue, task_id, txid),
            )
            moved += bool(dirs)
            touched += dirs
        if touched and self.durable:
            fsync_dirs(touched)
        if self.chained:
            self._chains.committed(task_id, txid, expected)
        return moved

    def discard_staged(self, task_id: int, *, below_epoch: int, keep: tuple[int, int] | None = None) -> int:
        """Delete a task's staged files and left-over temp files of epochs below ``below_epoch``.

        Only an owner's own predecessors are touched: files of ``below_epoch`` or higher
        belong to the caller or to a newer owner (the caller may be a stale owner that does
        not know yet), and ``keep`` = (txid, epoch), the committed batch, is kept for its
        publish. Returns how many files were removed.
        """
        removed = 0
        for queue in range(self.queues):
            for directory in (self.pending_path(queue), self.queue_path(queue)):
                staged = directory != self.queue_path(queue)
                removed += _discard(directory, task_id, below_epoch, keep, staged=staged, prefix=self._prefix)
        return removed

    # --- consumed batches: deleted by the queue's one reader once no replay needs them ------

    def consumed_marker(self, queue: int) -> ForwardMarker:
        """The record of what ``queue``'s reader consumed and may have deleted (``_`` files: no
        reader lists them)."""
        return ForwardMarker(self.queue_path(queue), CONSUMED_MARKER, durable=self.durable)

    def consumed_txids(self, queue: int) -> dict[int, int]:
        """Per upstream task, the highest txid whose files in ``queue`` its reader consumed in a
        committed batch: files at or below it may be gone, and are not lost."""
        return {int(task): txid for task, txid in self.consumed_marker(queue).read().txids.items()}

    def retire_consumed(self, queue: int, txids: Mapping[int, int], *, epoch: int | None = None) -> int:
        """Record ``txids`` (per upstream task, the highest txid consumed) as consumed, durably,
        then delete the queue's batch files at or below what is recorded; returns the files
        deleted.

        The record comes first, so a committed batch whose file is gone is known as consumed
        (:meth:`publish_batch` then has nothing to publish) rather than lost. Only the queue's
        reader calls this, with what its committed batches read. The record never moves back,
        even when a previous owner of the reader writes late; given the reader's owner
        ``epoch``, a previous owner's call records and deletes nothing once a newer owner has
        recorded.
        """
        recorded = self.consumed_marker(queue).advance({str(task): txid for task, txid in txids.items()}, epoch=epoch)
        if recorded is None:
            logger.info(
                "%s: a newer owner of the reader records what it consumed; this one (epoch %s) leaves the queue alone",
                self.queue_path(queue),
                epoch,
            )
            return 0
        removed = 0
        for path in _entries(self.queue_path(queue)):
            found = parse_batch_file_name(path.name)
            if found is not None and found.txid <= recorded.txids.get(str(found.task_id), -1):
                path.unlink(missing_ok=True)
                removed += 1
        return removed

    def is_consumed(self, queue: int, task_id: int, txid: int) -> bool:
        """Whether (task, txid)'s file in ``queue`` was consumed by the queue's reader (and so
        may be gone)."""
        return txid <= self.consumed_txids(queue).get(task_id, -1)

    def files(self, queue: int) -> list[Path]:
        """Visible files of a queue, sorted by name."""
        qdir = self.queue_path(queue)
        try:
            with os.scandir(qdir) as entries:  # each entry's type from the listing: no stat per file
                names = sorted(e.name for e in entries if not e.name.startswith((".", "_")) and e.is_file())
        except FileNotFoundError:
            return []
        return [qdir / name for name in names]

    def discard_stale_temp_files(self, queue: int, prefix: str, *, older_than_s: float, now: float) -> int:
        """Delete temp files of ``queue`` whose target name starts with ``prefix`` and that were
        last modified more than ``older_than_s`` before ``now`` (a writer that crashed midway)."""
        removed = 0
        for path in _entries(self.queue_path(queue)):
            temp = _TEMP_FILE.match(path.name)
            if temp is None or not temp["name"].startswith(prefix):
                continue
            try:
                if now - path.stat().st_mtime > older_than_s:
                    path.unlink()
                    removed += 1
            except FileNotFoundError:
                continue
        return removed

    def read_queue(self, queue: int) -> Iterator[tuple[Path, int, Any]]:
        """Every record of a queue as (file, line number, record), files in name order (a
        chained topic's :data:`PREVIOUS_TXID_KEY` left out)."""
        for file in self.files(queue):
            with open(file, encoding="utf-8") as f:
                for line_no, line in enumerate(f):
                    if line.strip():
                        try:
                            record = json.loads(line)
                        except json.JSONDecodeError as e:
                            raise TopicError(f"{file}:{line_no + 1}: not JSON: {e}") from e
                        if self.chained and line_no == 0 and isinstance(record, dict):
                            record.pop(PREVIOUS_TXID_KEY, None)
                        yield file, line_no, record


def _discard(
    directory: Path, task_id: int, below_epoch: int, keep: tuple[int, int] | None, *, staged: bool, prefix: str = ""
) -> int:
    """Remove from ``directory`` the temp files (and, when ``staged``, the batch files) of
    ``task_id`` with an epoch below ``below_epoch``, except ``keep``; only files named with
    ``prefix`` (a writer's own)."""
    removed = 0
    for path in _entries(directory):
        temp = _TEMP_FILE.match(path.name)
        name = temp["name"] if temp else path.name
        found = parse_batch_file_name(name.removeprefix(prefix)) if name.startswith(prefix) else None
        if found is None or found.task_id != task_id or found.epoch >= below_epoch:
            continue
        if temp is None and (not staged or (found.txid, found.epoch) == keep):
            continue
        path.unlink(missing_ok=True)
        removed += 1
    return removed


def _entries(directory: Path) -> list[Path]:
    """The entries of ``directory`` (none when it does not exist yet)."""
    try:
        return list(directory.iterdir())
    except FileNotFoundError:
        return []
