"""Read what Spark's streaming checkpoint says about a batch (source offsets, files read)."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from stream_ops.coordination.records import BatchInput
from stream_ops.sources.base import OffsetRange

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


def batch_offset_ranges(checkpoint_dir: Path, batch_id: int) -> list[OffsetRange] | None:
    """The offset ranges Spark planned for ``batch_id`` of a query reading one source by
    partition offsets (Kafka): per partition, from the end offset logged for ``batch_id - 1``
    (for batch 0: the query's starting offsets, :func:`starting_offsets`) up to the one logged
    for ``batch_id`` (the range the task's commit fingerprints, :func:`batch_input`), so a
    replay of the batch gets the same ranges.

    None when they are not known exactly: an entry missing, not one source's
    ``{"<topic>": {"<partition>": offset}}``, partitions that differ between the two entries
    or an end below its start.
    """
    if batch_id < 0:
        return None
    start = _partition_offsets(checkpoint_dir, batch_id - 1) if batch_id > 0 else starting_offsets(checkpoint_dir)
    end = _partition_offsets(checkpoint_dir, batch_id)
    if start is None or end is None or set(start) != set(end):
        return None
    ranges = [
        OffsetRange(topic, partition, start[(topic, partition)], until) for (topic, partition), until in sorted(end.items())
    ]
    if any(r.end < r.start for r in ranges):
        logger.warning("checkpoint %s: batch %d ends below its start: %s", checkpoint_dir, batch_id, ranges)
        return None
    return ranges


def starting_offsets(checkpoint_dir: Path) -> dict[tuple[str, int], int] | None:
    """(topic, partition) -> offset where the query's batch 0 starts, as Spark's Kafka source
    keeps it (``sources/0/0``, written once before batch 0 is planned and read again by a
    restarted query: a NUL byte, ``v1``, then ``{"<topic>": {"<partition>": offset}}``);
    None when there is no such entry (another source, a file source's log)."""
    try:
        text = (checkpoint_dir / "sources" / "0" / "0").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    lines = text.lstrip("\0").splitlines()
    if len(lines) != 2 or not lines[0].startswith("v"):
        return None
    try:
        offsets = json.loads(lines[1])
    except json.JSONDecodeError:
        return None
    return _offsets_by_partition(offsets)


def _partition_offsets(checkpoint_dir: Path, batch_id: int) -> dict[tuple[str, int], int] | None:
    """(topic, partition) -> offset of the one source Spark logged for ``batch_id``, or None."""
    offsets = batch_offsets(checkpoint_dir, batch_id)
    if len(offsets) != 1:
        return None
    return _offsets_by_partition(offsets[0])


def _offsets_by_partition(offsets: Any) -> dict[tuple[str, int], int] | None:
    """A Kafka source offset ``{"<topic>": {"<partition>": offset}}`` by (topic, partition), or None."""
    if not isinstance(offsets, dict) or not offsets:
        return None
    found: dict[tuple[str, int], int] = {}
    for topic, partitions in offsets.items():
        if not isinstance(partitions, dict) or not partitions:
            return None
        for partition, offset in partitions.items():
            if not (isinstance(partition, str) and partition.isdigit()) or not isinstance(offset, int) or offset < 0:
                return None
            found[(str(topic), int(partition))] = offset
    return found


def batch_input_files(checkpoint_dir: Path, batch_id: int) -> list[str] | None:
    """The files Spark's file source planned for ``batch_id``, or None if its log has no entry.

    The file source logs the files it finds under ``sources/0/<n>`` (entry n); every
    ``compactInterval`` entries (10 by default) that log is ``<n>.compact`` instead and holds
    all entries so far, each with its ``batchId`` (the entry number). A micro-batch reads the
    entries after the previous batch's source offset up to its own (``offsets/<batch>``:
    ``{"logOffset": n}``), as Spark's ``getBatch`` does. That is usually the one entry of the
    batch's own id, but not always: a query stopped after logging an entry and before logging
    the batch's offset leaves an entry behind, and after a restart Spark plans the batch over
    that entry and a new one, and every later batch one entry ahead of its id. Spark's Kafka
    source keeps its starting offsets in ``sources/0/0`` (a JSON object without a ``path``):
    for it this returns None, so batch 0's fingerprint is its offset range too.

    A batch's entries are read by several steps of that batch (the source stage's size check
    and Arrow read, the keyed stage's file list, the commit's input fingerprint): each entry
    file is parsed once, cached by its identity (written once, by a rename, never changed).
    """
    log_dir = checkpoint_dir / "sources" / "0"
    span = _log_span(checkpoint_dir, batch_id)
    entries = range(span[0] + 1, span[1] + 1) if span is not None else range(batch_id, batch_id + 1)
    files: list[str] = []
    for entry in entries:
        found = _entry_files(log_dir, entry)
        if found is None:
            return None
        files.extend(found)
    return sorted(files)


def _log_offset(checkpoint_dir: Path, batch_id: int) -> int | None:
    """The file source's log offset Spark recorded for ``batch_id`` (None: none recorded, or
    not a file source)."""
    offsets = batch_offsets(checkpoint_dir, batch_id)
    if len(offsets) != 1 or not isinstance(offsets[0], dict):
        return None
    value = offsets[0].get("logOffset")
    return value if isinstance(value, int) else None


def _log_span(checkpoint_dir: Path, batch_id: int) -> tuple[int, int] | None:
    """(previous batch's log offset, this batch's): the file-source entries after the first
    up to the second are the batch's; None when Spark recorded no file-source offset for it."""
    end = _log_offset(checkpoint_dir, batch_id)
    if end is None:
        return None
    if batch_id == 0:
        return -1, end
    start = _log_offset(checkpoint_dir, batch_id - 1)
    if start is None:
        logger.warning(
            "checkpoint %s: no offset for batch %d; batch %d read as log entry %d", checkpoint_dir, batch_id - 1, batch_id, end
        )
        return end - 1, end
    return start, end


def _files_in(path: Path, entry: int) -> tuple[str, ...] | None:
    """The files of ``entry`` in the log file ``path``; None when the file is not there, holds
    no such entry (an entry is never empty: Spark logs the files it found) or is not a file
    source's log."""
    try:
        stat = path.stat()
        files = _logged_files(str(path), entry, stat.st_mtime_ns, stat.st_size)
    except OSError:
        return None
    return files or None


def _entry_files(log_dir: Path, entry: int) -> tuple[str, ...] | None:
    """The files of the file-source log entry ``entry``: from its own file, or from the compact
    file that holds it (the first at or after it), or None when the log has no such entry."""
    for path in (log_dir / str(entry), log_dir / f"{entry}.compact"):
        found = _files_in(path, entry)
        if found is not None:
            return found
    # Compacted away: the log is listed only then (one compact file per ``compactInterval`` entries).
    try:
        compacts = sorted(
            int(path.name.removesuffix(".compact"))
            for path in log_dir.iterdir()
            if path.name.endswith(".compact") and path.name.removesuffix(".compact").isdigit()
        )
    except OSError:
        return None
    for batch in compacts:
        if batch > entry:
            found = _files_in(log_dir / f"{batch}.compact", entry)
            if found is not None:
                return found
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
