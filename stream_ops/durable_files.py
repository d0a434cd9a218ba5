"""Durable, private file writes: what must be on disk before a batch is committed in ZooKeeper.

ZooKeeper fsyncs its transaction log before it acknowledges a commit, so every file a commit
vouches for (staged outputs, state-topic entries) must be just as durable by then: the file's
data (``fsync`` of the file) and its name (``fsync`` of the directory that holds it, after a
create or rename). Without both, an OS crash or power loss can leave a committed txid whose
files are missing, empty or cut short.

Markers that several processes may write (what a queue's reader consumed, what a sink
delivered) are :class:`ForwardMarker` records: one new file per write, created only if no
other writer took its version first, so a late writer never moves a value back.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from stream_ops.errors import TopicError

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


def create_exclusively(target: Path, data: bytes, *, durable: bool = True) -> bool:
    """Create ``target`` holding ``data`` unless something already has that name: a
    compare-and-set on a file name. Returns False, writing nothing, when the name is taken.

    The data goes to a hidden temp file (fsynced with ``durable``) that is then hard-linked to
    ``target``: the name appears complete or not at all, and ``link``, unlike ``rename``,
    never replaces an existing name (the classic exclusive create of NFS lock files).

    Raises:
        OSError: the file could not be written, or the file system has no hard links
            (``EPERM``, ``EOPNOTSUPP``: some FUSE and SMB mounts).
    """
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), FILE_MODE)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            if durable:
                out.flush()
                os.fsync(out.fileno())
        try:
            os.link(tmp, target)
        except FileExistsError:
            return False
    finally:
        tmp.unlink(missing_ok=True)
    if durable:
        fsync_dir(target.parent)
    return True


MARKER_ATTEMPTS = 100
"""How often :meth:`ForwardMarker.advance` tries again after another writer took the version
it wanted (each try re-reads the marker), before it gives up."""


STALE_MARKER_TEMP_S = 60.0
"""How long a marker's temp file stays untouched before a writer deletes it as left by a write
that crashed (a live write links it within milliseconds)."""


@dataclass(frozen=True)
class MarkerState:
    """What a :class:`ForwardMarker` holds."""

    txids: dict[str, int]
    """Per key, the highest txid any writer recorded."""
    epoch: int
    """The highest owner epoch that wrote the marker (-1: none, or only writers without one)."""
    version: int
    """The number of the newest version file (-1: none yet); the next write creates the one after."""


@dataclass(frozen=True)
class ForwardMarker:
    """A small durable record of txids (per key, the highest recorded) that never moves back,
    whoever writes it and however late.

    A read-modify-write of one file by rename lets a stale writer (a previous owner still
    running, or its I/O thread finishing after the new owner's) replace a newer value with
    the older one it read. Here every write creates a new version file
    ``<stem>-v<version>.json``, exclusively (:func:`create_exclusively`): a writer reads the
    newest version, merges its txids in (per key the maximum) and creates the next version, or,
    when another writer created it first, reads again. Each version is therefore built on the
    one before it, so the newest holds every recorded txid and a value can only grow (a writer
    that was slow enough to create a number faster writers had passed and collected sees its
    version is not the newest and merges again; a reader that meets such a version reads
    again). A writer
    that gives its owner ``epoch`` is refused (:meth:`advance` returns None, writing nothing)
    once a higher epoch has written. Older versions are deleted after each write; readers
    that meet a deleted one read again.

    Example:
        >>> marker = ForwardMarker(Path(tempfile.mkdtemp()), "_consumed", durable=False)
        >>> marker.advance({"3": 7}, epoch=2).txids
        {'3': 7}
        >>> marker.advance({"3": 5}, epoch=2).txids, marker.advance({"3": 9}, epoch=1)
        ({'3': 7}, None)
    """

    directory: Path
    stem: str
    durable: bool = True

    def read(self) -> MarkerState:
        """The marker's newest complete version (empty when nothing was recorded).

        Raises:
            TopicError: the marker's directory cannot be listed, a version cannot be read, or
                versions kept being deleted under the reader.
        """
        for _ in range(MARKER_ATTEMPTS):
            versions = self._versions()
            newest = versions[0] if versions else -1
            for version in versions:
                try:
                    text = self._path(version).read_bytes()
                except FileNotFoundError:
                    break  # deleted by a writer that made a newer one: list again
                except OSError as e:
                    raise TopicError(f"{self._path(version)}: unreadable marker: {e}") from e
                parsed = _parse_marker(text)
                if parsed is None:
                    continue  # not a complete marker (a write cut short by an OS crash): the one before counts
                # A version is deleted once one two above it exists, and a writer that read an
                # older one may then create it again: what was read is the version as first
                # written (on the line of newest versions) only while none two above it exists.
                if max(self._versions(), default=-1) <= version + 1:
                    return MarkerState(parsed[0], parsed[1], newest)
                break  # writers moved on: list again
            else:
                return MarkerState({}, -1, newest)
        raise TopicError(f"{self.directory}: the marker {self.stem} kept changing while it was read; try again")

    def advance(self, txids: Mapping[str, int], *, epoch: int | None = None) -> MarkerState | None:
        """Record ``txids`` (per key the maximum of what is recorded and what is given).

        Args:
            txids: per key, a txid to record.
            epoch: the writer's owner epoch; None for a writer that has none to give (it
                still never moves a value back).

        Returns:
            The marker as written (or as found, when it already held as much), or None when a
            higher owner epoch has written it: the caller is a stale owner and must act on
            nothing it meant to record.

        Raises:
            TopicError: the version could not be written (e.g. a file system without hard
                links), or other writers kept taking the next version.
        """
        for _ in range(MARKER_ATTEMPTS):
            current = self.read()
            if epoch is not None and epoch < current.epoch:
                return None
            merged = dict(current.txids)
            for key, txid in txids.items():
                merged[key] = max(txid, merged.get(key, txid))
            written_epoch = current.epoch if epoch is None else max(current.epoch, epoch)
            if merged == current.txids and written_epoch == current.epoch:
                return current
            version = current.version + 1
            text = json.dumps({"epoch": written_epoch, "txids": merged}, separators=(",", ":"), sort_keys=True)
            try:
                created = create_exclusively(self._path(version), text.encode("utf-8"), durable=self.durable)
            except OSError as e:
                raise TopicError(
                    f"could not write {self._path(version)}: {e}. stream_ops' markers need a file system with hard "
                    "links on the shared path (NFS, ext4, xfs have them)"
                ) from e
            if created:
                # Not done yet: a slow writer can create a version number that faster writers
                # already passed and collected (they delete all but the newest two), and that
                # version is never read. The next pass re-reads the newest and returns once it
                # holds these txids (the usual case), or merges them in again.
                self._collect(version)
        raise TopicError(f"{self.directory}: other writers kept taking the next version of {self.stem}; try again")

    def _path(self, version: int) -> Path:
        return self.directory / f"{self.stem}-v{version:012d}.json"

    def _versions(self) -> list[int]:
        """The version numbers present, newest first."""
        pattern = re.compile(rf"^{re.escape(self.stem)}-v(\d+)\.json$")
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        except OSError as e:
            raise TopicError(f"{self.directory}: cannot list the marker {self.stem}: {e}") from e
        return sorted((int(m[1]) for m in map(pattern.match, names) if m is not None), reverse=True)

    def _collect(self, written: int) -> None:
        """Delete the versions below the one before ``written`` (kept for readers that listed
        just before it appeared) and temp files of writes that crashed (untouched for
        :data:`STALE_MARKER_TEMP_S`)."""
        version = re.compile(rf"^{re.escape(self.stem)}-v(\d+)\.json$")
        temp = re.compile(rf"^\.{re.escape(self.stem)}-v\d+\.json\.[0-9a-f]{{32}}\.tmp$")
        now = time.time()
        for name in os.listdir(self.directory):
            path = self.directory / name
            found = version.match(name)
            if found is not None and int(found[1]) < written - 1:
                path.unlink(missing_ok=True)
            elif temp.match(name) is not None:
                try:
                    if now - path.stat().st_mtime > STALE_MARKER_TEMP_S:
                        path.unlink()
                except FileNotFoundError:
                    continue


def _parse_marker(text: bytes) -> tuple[dict[str, int], int] | None:
    """(txids, epoch) of a version file, or None for one that is not complete."""
    try:
        parsed = json.loads(text)
        txids = {str(key): int(value) for key, value in parsed["txids"].items()}
        return txids, int(parsed["epoch"])
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
