"""Read what Spark's streaming checkpoint says about a batch (source offsets, files read)."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from stream_ops.coordination.records import BatchInput

logger = logging.getLogger(__name__)

_LOG_DIRS = ("offsets", "commits")
"""The checkpoint's write-ahead logs, written as a hidden temp file renamed into place."""


def remove_crashed_writes(checkpoint_dir: Path) -> list[Path]:
    """Delete the temp files a killed query left in its offset and commit logs; returns them.

    Spark writes each log entry as a hidden ``.N.<uuid>.tmp`` file and renames it; a process
    killed in between leaves the temp file behind, and Spark 4 then refuses to start the query
    on that checkpoint (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY`` "should be empty on
    batch 0") when no entry was completed. Only the task's owner runs a query on its
    checkpoint, so a temp file there is always a dead writer's.
    """
    removed: list[Path] = []
    for name in _LOG_DIRS:
        directory = Path(checkpoint_dir) / name
        if not directory.is_dir():
            continue
        for path in directory.iterdir():
            if path.name.startswith(".") and path.name.endswith(".tmp") and path.is_file():
                path.unlink(missing_ok=True)
                removed.append(path)
    if removed:
        logger.warning(
            "checkpoint %s: removed %d temp files of a killed query: %s", checkpoint_dir, len(removed), [p.name for p in removed]
        )
    return removed


def batch_offsets(checkpoint_dir: Path, batch_id: int) -> list[Any]:
    """The source offsets Spark planned for ``batch_id`` (its ``offsets/<id>`` entry)."""
    path = checkpoint_dir / "offsets" / str(batch_id)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    # line 0 is the log version, line 1 the batch metadata, then one offset per source
    offsets: list[Any] = []
    for line in lines[2:]:
        try:
            offsets.append(json.loads(line))
        except json.JSONDecodeError:
            offsets.append(line)
    return offsets


def batch_input_files(checkpoint_dir: Path, batch_id: int) -> list[str] | None:
    """The files Spark's file source planned for ``batch_id``, or None if its log has no entry.

    The file source logs each batch's files under ``sources/0/<batch>``; every
    ``compactInterval`` batches (10 by default) that log is ``<batch>.compact`` instead and
    holds the entries of all batches so far, each with its ``batchId``. Spark's Kafka source
    keeps its starting offsets in ``sources/0/0`` (a JSON object without a ``path``): for it
    this returns None, so batch 0's fingerprint is its offset range too.

    A batch's entry is read by several steps of that batch (the source stage's size check, the
    keyed stage's file list, the commit's input fingerprint): it is parsed once, cached by the
    file's identity (an entry is written once, by a rename, and never changed).
    """
    log_dir = checkpoint_dir / "sources" / "0"
    for name in (str(batch_id), f"{batch_id}.compact"):
        path = log_dir / name
        try:
            stat = path.stat()
        except OSError:
            continue
        try:
            files = _logged_files(str(path), batch_id, stat.st_mtime_ns, stat.st_size)
        except OSError:
            continue
        return list(files) if files is not None else None
    return None


@functools.lru_cache(maxsize=64)
def _logged_files(path: str, batch_id: int, mtime_ns: int, size: int) -> tuple[str, ...] | None:
    """The sorted files of ``batch_id`` in the source-log file ``path`` (None: not a file
    source's log); ``mtime_ns`` and ``size`` only key the cache."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    files = []
    for line in lines[1:]:  # line 0 is the log version
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(entry, dict) and "path" not in entry:
            return None  # not a file source's log: Kafka's initial offsets (its ``sources/0/0``)
        if isinstance(entry, dict) and entry.get("batchId", batch_id) == batch_id:
            files.append(str(entry["path"]))
    return tuple(sorted(files))


def batch_input(checkpoint_dir: Path, batch_id: int) -> BatchInput | None:
    """The fingerprint of the input Spark planned for ``batch_id`` (None when Spark logged none).

    For a file source: its files. For any other source (Kafka, rate): the batch's offset range,
    from the end offsets Spark logged for ``batch_id - 1`` (none for batch 0: the starting
    offsets of the query) and for ``batch_id``; a replay that re-plans the batch with other
    offsets has another digest.
    """
    files = batch_input_files(checkpoint_dir, batch_id)
    if files is not None:
        digest = hashlib.sha256("\n".join(files).encode("utf-8")).hexdigest()
        return BatchInput(txid=batch_id, files=len(files), digest=digest)
    end = batch_offsets(checkpoint_dir, batch_id)
    if not end:
        return None
    start = batch_offsets(checkpoint_dir, batch_id - 1) if batch_id > 0 else []
    text = json.dumps([start, end], sort_keys=True, separators=(",", ":"))
    return BatchInput(txid=batch_id, files=0, digest=hashlib.sha256(text.encode("utf-8")).hexdigest(), offsets=True)


def latest_file_timestamp(checkpoint_dir: Path) -> int:
    """Newest modification time (ms) among files the file source has consumed, 0 if none.

    Spark's file source logs the files of each batch under ``sources/0/<batch>``; the newest
    log file (compact or not) holds the latest entries.
    """
    log_dir = checkpoint_dir / "sources" / "0"
    try:
        logs = [p for p in log_dir.iterdir() if not p.name.startswith(".") and not p.name.endswith(".tmp")]
    except OSError:
        return 0
    if not logs:
        return 0
    newest = max(logs, key=lambda p: int(p.name.split(".")[0]) if p.name.split(".")[0].isdigit() else -1)
    latest = 0
    try:
        for line in newest.read_text(encoding="utf-8").splitlines()[1:]:
            try:
                latest = max(latest, int(json.loads(line).get("timestamp", 0)))
            except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
                continue
    except OSError:
        return 0
    return latest


def count_newer_files(queue_dir: Path, since_ms: int) -> int:
    """Visible files in a queue modified after ``since_ms`` (the backlog of a file stream)."""
    try:
        return sum(
            1
            for entry in queue_dir.iterdir()
            if not entry.name.startswith((".", "_")) and entry.stat().st_mtime_ns // 1_000_000 > since_ms
        )
    except OSError:
        return 0
