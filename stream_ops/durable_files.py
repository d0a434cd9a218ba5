"""Durable, private file writes: what must be on disk before a batch is committed in ZooKeeper.

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
from typing import IO

FILE_MODE = 0o640
"""Mode of the data files stream_ops creates (topics, dead letters, state topics, snapshots,
the dist store): the cluster's user reads and writes, its group reads, others nothing. The
process umask can only take more away."""
DIR_MODE = 0o750
"""Mode of the directories stream_ops creates."""
DEFAULT_UMASK = 0o027
"""The umask stream_ops processes run with unless configured otherwise (``ClusterConfig.umask``)."""


def make_dirs(path: Path) -> None:
    """Create ``path`` and its missing parents with :data:`DIR_MODE` (existing ones are left as they are)."""
    missing = []
    current = path
    while not current.exists():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=DIR_MODE)
        except FileExistsError:
            continue


def create_private_file(path: Path, mode: str = "w") -> IO[str]:
    """Open a new file for writing with :data:`FILE_MODE`; never follows or reuses an existing name.

    Raises:
        FileExistsError: something (a file, a planted symlink) already has the name.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), FILE_MODE)
    return os.fdopen(fd, mode, encoding="utf-8")


def apply_umask(umask: int) -> int:
    """Set the process umask (files stream_ops and Spark create inherit it); returns the old one."""
    return os.umask(umask)


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
