"""Read what Spark's streaming checkpoint says about a batch (source offsets, files read)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


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
