"""FileTopic: a partitioned, append-only log of JSON-lines files on a shared path.

One directory per queue (``queue-00000``, ...). Every file is written under a hidden temporary
name and renamed into place, so a Spark file stream never sees half a file. Files a task writes
for a batch are named by (task, txid, owner epoch): a replayed batch writes the same name again
and so overwrites or is skipped, never duplicated.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stream_ops.errors import TopicError

_BATCH_FILE = re.compile(r"^t(?P<task>\d+)-x(?P<txid>\d+)-e(?P<epoch>\d+)\.jsonl$")


def batch_file_name(task_id: int, txid: int, epoch: int) -> str:
    """Name of the file a task writes for one batch; sorts by txid then epoch within a task."""
    return f"t{task_id:05d}-x{txid:012d}-e{epoch:06d}.jsonl"


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


def write_json_lines_atomically(target: Path, records: Iterable[Any]) -> int:
    """Write records as JSON lines to ``target`` via a hidden temp file and a rename.

    Returns the number of records written.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.{uuid.uuid4().hex}.tmp"
    count = 0
    try:
        with open(tmp, "w", encoding="utf-8") as out:
            for record in records:
                out.write(json.dumps(record, separators=(",", ":"), ensure_ascii=False))
                out.write("\n")
                count += 1
        os.replace(tmp, target)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise TopicError(f"could not write {target}: {e}") from e
    except TypeError as e:
        tmp.unlink(missing_ok=True)
        raise TopicError(f"record for {target} is not JSON-serialisable: {e}") from e
    return count


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

    def __post_init__(self) -> None:
        if not isinstance(self.queues, int) or isinstance(self.queues, bool) or self.queues < 1:
            raise TopicError(f"FileTopic {self.path!s}: queues must be a positive integer, got {self.queues!r}")
        object.__setattr__(self, "path", str(self.path))

    @property
    def root(self) -> Path:
        return Path(self.path)

    def queue_path(self, queue: int) -> Path:
        """Directory of one queue."""
        if not 0 <= queue < self.queues:
            raise TopicError(f"queue {queue} out of range for {self.path} with {self.queues} queues")
        return self.root / f"queue-{queue:05d}"

    def create(self) -> None:
        """Create the queue directories (idempotent)."""
        for q in range(self.queues):
            self.queue_path(q).mkdir(parents=True, exist_ok=True)

    def write_file(self, queue: int, name: str, records: Iterable[Any], *, overwrite: bool = True) -> Path:
        """Atomically write one file of JSON lines into a queue.

        With ``overwrite=False`` an existing file of that name is kept as it is (a replayed
        batch that was already published).
        """
        if name.startswith((".", "_")):
            raise TopicError(f"file name {name!r} would be ignored by Spark (starts with '.' or '_')")
        target = self.queue_path(queue) / name
        if not overwrite and target.exists():
            return target
        write_json_lines_atomically(target, records)
        return target

    def write_batch(self, queue: int, task_id: int, txid: int, epoch: int, records: Iterable[Any]) -> Path:
        """Write a task's output for one batch; a replay of the same batch keeps the first file."""
        return self.write_file(queue, batch_file_name(task_id, txid, epoch), records, overwrite=False)

    # --- staged batches: written before a commit, published (renamed into place) after it ----

    def pending_path(self, queue: int) -> Path:
        """Hidden directory of a queue's staged files (Spark never lists it)."""
        self.queue_path(queue)  # range check
        return self.root / ".pending" / f"queue-{queue:05d}"

    def stage_batch(self, queue: int, task_id: int, txid: int, epoch: int, records: Iterable[Any]) -> Path:
        """Write a batch's file where readers cannot see it yet (see :meth:`publish_batch`)."""
        target = self.pending_path(queue) / batch_file_name(task_id, txid, epoch)
        write_json_lines_atomically(target, records)
        return target

    def publish_batch(self, task_id: int, txid: int, epoch: int) -> int:
        """Move the staged files of (task, txid, epoch) into their queues; returns how many.

        Idempotent: a file already published stays as it is (a Spark stream may have read it).
        """
        name = batch_file_name(task_id, txid, epoch)
        moved = 0
        for queue in range(self.queues):
            staged = self.pending_path(queue) / name
            if not staged.exists():
                continue
            target = self.queue_path(queue) / name
            if target.exists():
                staged.unlink(missing_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staged, target)
            moved += 1
        return moved

    def discard_staged(self, task_id: int, *, keep: tuple[int, int] | None = None) -> int:
        """Delete a task's staged files except those of ``keep`` = (txid, epoch); returns how many."""
        removed = 0
        for queue in range(self.queues):
            pending = self.pending_path(queue)
            if not pending.exists():
                continue
            for path in pending.iterdir():
                found = parse_batch_file_name(path.name)
                if found is None or found.task_id != task_id or (found.txid, found.epoch) == keep:
                    continue
                path.unlink(missing_ok=True)
                removed += 1
        return removed

    def files(self, queue: int) -> list[Path]:
        """Visible files of a queue, sorted by name."""
        qdir = self.queue_path(queue)
        if not qdir.exists():
            return []
        return sorted(p for p in qdir.iterdir() if p.is_file() and not p.name.startswith((".", "_")))

    def read_queue(self, queue: int) -> Iterator[tuple[Path, int, Any]]:
        """Every record of a queue as (file, line number, record), files in name order."""
        for file in self.files(queue):
            with open(file, encoding="utf-8") as f:
                for line_no, line in enumerate(f):
                    if line.strip():
                        try:
                            yield file, line_no, json.loads(line)
                        except json.JSONDecodeError as e:
                            raise TopicError(f"{file}:{line_no + 1}: not JSON: {e}") from e
