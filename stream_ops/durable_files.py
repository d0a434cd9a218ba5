"""Durable file writes: what must be on disk before a batch is committed in ZooKeeper.

ZooKeeper fsyncs its transaction log before it acknowledges a commit, so every file a commit
vouches for (staged outputs, state-topic entries) must be just as durable by then: the file's
data (``fsync`` of the file) and its name (``fsync`` of the directory that holds it, after a
create or rename). Without both, an OS crash or power loss can leave a committed txid whose
files are missing, empty or cut short.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def fsync_file(path: Path) -> None:
    """Flush a file's data and metadata to its device."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Flush a directory's entries (names created, renamed or deleted in it) to its device.

    File systems that cannot open or sync a directory (some network mounts) are skipped: on
    them a rename is durable when it returns, or not at all, and nothing here can change that.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_dirs(paths: Iterable[Path]) -> None:
    """:func:`fsync_dir` each distinct directory once."""
    for path in sorted(set(paths)):
        fsync_dir(path)
