"""Private directories named for the process that owns them, and removal of those whose owner is gone.

A process removes its private directories when it exits (``atexit``), but not when it is
SIGKILLed. So each one carries its owner in its name, ``<kind>-<label>-<owner>-<random>``, the
owner being ``<pid namespace>.<pid>.<start time>``: the pid, the process's start time in clock
ticks since boot (``/proc/<pid>/stat``, field 22; a pid reused by another process has another
one) and the inode of its pid namespace (``/proc/self/ns/pid``; a pid means something only in
its namespace, and containers may share a local directory). :meth:`OwnedDirs.remove_dead` then
lets the next process of the same kind clean up: in a parent directory it removes the entries
that are real directories (never a symlink, nor what one points to), belong to this user, are
named exactly so, and whose owner lived in this pid namespace and runs no more. Their content is
removed without following symlinks (``shutil.rmtree``'s file-descriptor walk).

Without ``/proc`` (not Linux) directories are named without an owner and never removed by others.

Example:
    >>> dirs = OwnedDirs("stream-ops-code")
    >>> path = dirs.create(Path("/tmp"), "0123456789abcdef")  # doctest: +SKIP
    >>> path.name  # doctest: +SKIP
    'stream-ops-code-0123456789abcdef-4026531836.4242.183421-k3j_x9a2'
    >>> dirs.remove_dead(Path("/tmp"))  # doctest: +SKIP
    [PosixPath('/tmp/stream-ops-code-0123456789abcdef-4026531836.977.1204-p0q1r2s3')]
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

_LABEL = re.compile(r"[A-Za-z0-9]+")
_RANDOM = r"[a-z0-9_]{8}"  # what tempfile.mkdtemp appends


@dataclass(frozen=True)
class Owner:
    """A process, told apart from any other that had or will have its pid."""

    pid_namespace: int
    pid: int
    start_ticks: int

    def __str__(self) -> str:
        return f"{self.pid_namespace}.{self.pid}.{self.start_ticks}"


def _start_ticks(pid: int) -> tuple[int, str] | None:
    """``(start time in ticks since boot, state letter)`` of a process, None when there is none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
        fields = text[text.rindex(")") + 2 :].split()  # after "<pid> (<comm>) ", comm may hold anything
        return int(fields[19]), fields[0]
    except (OSError, ValueError, IndexError):
        return None


def _pid_namespace() -> int | None:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


@functools.cache
def _this_process(pid: int) -> Owner | None:
    """This process as an :class:`Owner` (cached per pid: a forked child is another owner)."""
    namespace, started = _pid_namespace(), _start_ticks(pid)
    if namespace is None or started is None:
        return None
    return Owner(namespace, pid, started[0])


def this_process() -> Owner | None:
    """The calling process as an :class:`Owner`; None without ``/proc``."""
    return _this_process(os.getpid())


def is_running(owner: Owner) -> bool:
    """Whether ``owner`` still runs; an owner of another pid namespace counts as running (it
    cannot be checked from here)."""
    if owner.pid_namespace != _pid_namespace():
        return True
    found = _start_ticks(owner.pid)
    return found is not None and found[0] == owner.start_ticks and found[1] != "Z"


class OwnedDirs:
    """The private directories of one kind (a name prefix) that processes create and clean up.

    Args:
        kind: The name prefix, e.g. ``stream-ops-code``.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._pattern = re.compile(rf"{re.escape(kind)}-[A-Za-z0-9]+-(\d+)\.(\d+)\.(\d+)-{_RANDOM}")

    def create(self, parent: Path, label: str) -> Path:
        """A fresh directory (``mkdtemp``: mode 0700, a new name, never an existing entry) under
        ``parent``, named for this process.

        Raises:
            ValueError: ``label`` is not letters and digits.
            OSError: The directory cannot be created.
        """
        if not _LABEL.fullmatch(label):
            raise ValueError(f"label {label!r} must be letters and digits")
        owner = this_process()
        prefix = f"{self.kind}-{label}-{owner}-" if owner is not None else f"{self.kind}-{label}-"
        return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))

    def owner_of(self, name: str) -> Owner | None:
        """The owner a directory name of this kind carries, None for any other name."""
        found = self._pattern.fullmatch(name)
        if found is None:
            return None
        return Owner(int(found[1]), int(found[2]), int(found[3]))

    def remove_dead(self, parent: Path) -> list[Path]:
        """Remove the directories of this kind under ``parent`` whose owner is gone (see the
        module docstring for which entries qualify). Failures are logged, never raised.

        Returns:
            The directories removed.
        """
        try:
            entries = list(os.scandir(parent))
        except OSError as e:
            logger.warning("cannot list %s to remove what dead processes left there: %s", parent, e)
            return []
        removed: list[Path] = []
        uid = os.getuid()
        for entry in entries:
            owner = self.owner_of(entry.name)
            if owner is None or is_running(owner):
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # removed meanwhile
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid:
                continue
            path = Path(entry.path)
            try:
                shutil.rmtree(path)
            except FileNotFoundError:
                continue  # another process of this kind removed it first
            except OSError as e:
                logger.warning("cannot remove %s, left by process %s which is gone: %s", path, owner.pid, e)
                continue
            removed.append(path)
        if removed:
            logger.info(
                "removed %d %s directories of processes that are gone: %s",
                len(removed),
                self.kind,
                ", ".join(p.name for p in removed),
            )
        return removed
