"""Compacted snapshots of a state-topic queue (RocketMQ Streams' compacted state topic).

A snapshot is the state of one queue at a committed txid S — for every key the value that
replay (DESIGN invariant 5) gives at S — in one Parquet file of the queue's snapshot
directory::

    snapshot-x000000000041.parquet      key   string  JSON text of the key list, canonical
                                                      (``stream_ops.hashing.encode_key``)
                                        value string  JSON text of the wrapped value
                                                      (``values.encode_stored``)
                                        rows sorted by key; file metadata under
                                        ``stream_ops.snapshot``: txid, epoch, keys, ...

Both columns hold exactly the bytes a :class:`~stream_ops.state.rocksdb_backing.RocksDBBackingMap`
stores, and only plain types, so Spark (``spark.read.parquet``), DuckDB and pandas read a
snapshot as a table, and a sorted key column lets them skip row groups on a key lookup.

Compaction is incremental: the new snapshot is the previous one (S0) overlaid with the net
changes of the batch files with S0 < txid <= S (:func:`~stream_ops.state.state_topic.replay_arrow_changes`,
whose columns already are the stored bytes), done with Arrow column operations, so each
compaction reads only what is new.
:func:`compact_queue` then deletes the batch files with txid <= S: they are covered.
Before deleting it records ``_compacted.json`` in the queue directory (hidden from FileTopic
and Spark) naming the txid and the snapshot directory, so a replay can never mistake a
truncated queue for a whole one (see :func:`open_restore_source`).

Files appear atomically (hidden temp name, fsync, rename); older snapshots are removed only
after the new one is in place, and covered batch files only after that.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from operator import itemgetter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from stream_ops.durable_files import FILE_MODE, fsync_dir, fsync_file, make_dirs
from stream_ops.errors import ReplayError, StateError
from stream_ops.state.keys import Key, as_key
from stream_ops.state.rocksdb_backing import write_sorted_sst
from stream_ops.state.state_batch_arrow import LOAD_CHUNK_ROWS, read_ahead
from stream_ops.state.state_topic import (
    ArrowChanges,
    EncodedChanges,
    ReplayedChanges,
    StateTopicQueue,
    key_text,
    paused_cyclic_gc,
    replay_arrow_changes,
    replay_changes,
    stored_value_text,
)
from stream_ops.state.values import from_json_obj

logger = logging.getLogger(__name__)

SNAPSHOT_FORMAT = 1
"""Version of the snapshot layout, recorded in every file's metadata."""

COMPACTED_MARKER = "_compacted.json"
"""File in a state-topic queue directory recording up to which txid its batch files were deleted."""

_NAME = re.compile(r"^snapshot-x(?P<txid>\d{12,})\.parquet$")
_META_KEY = b"stream_ops.snapshot"
_ROW_GROUP_ROWS = 65_536
_READ_BATCH_ROWS = 16_384
_RESTORE_ATTEMPTS = 3
_SCHEMA = pa.schema([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.string(), nullable=False)])


def snapshot_file_name(txid: int) -> str:
    """The file name of the snapshot at ``txid``; names sort by txid."""
    return f"snapshot-x{txid:012d}.parquet"


@dataclass(frozen=True)
class SnapshotInfo:
    """A snapshot file.

    Attributes:
        path: the Parquet file.
        txid: the committed txid whose state it holds.
        keys: number of keys (rows).
        bytes: file size.
        seconds: time taken to build and write it (read back from a file: the time recorded
            when it was written, which leaves out the final write); not compared by ``==``.
        epoch: the owner epoch whose entries counted for ``txid``, None if that batch wrote
            no state-topic file.
        offset: for a state topic on Kafka, the partition offset the snapshot covers up to: the
            records of every later txid lie at or above it (None for the file state topic).
    """

    path: Path
    txid: int
    keys: int
    bytes: int
    seconds: float = field(compare=False)
    epoch: int | None = None
    offset: int | None = None


@dataclass(frozen=True)
class CompactionResult:
    """What :func:`compact_queue` did.

    Attributes:
        snapshot: the snapshot now covering the queue.
        deleted_files: batch files deleted (txid <= the snapshot's txid).
        deleted_bytes: their total size.
        kept_files: batch files left, all of txids above the snapshot's.
    """

    snapshot: SnapshotInfo
    deleted_files: int
    deleted_bytes: int
    kept_files: int


@dataclass(frozen=True)
class CompactionMarker:
    """The ``_compacted.json`` of a queue: batch files with txid <= ``txid`` may be gone.

    Attributes:
        txid: the txid of the snapshot that covers the deleted files.
        snapshot_dir: the directory holding that snapshot.
    """

    txid: int
    snapshot_dir: Path


# --- reading ------------------------------------------------------------------------------


def list_snapshots(snapshot_dir: Path) -> list[SnapshotInfo]:
    """Every snapshot in ``snapshot_dir``, oldest first (an absent directory has none).

    Raises:
        ReplayError: a file named like a snapshot is not a readable stream_ops snapshot.
    """
    snapshot_dir = Path(snapshot_dir)
    if not snapshot_dir.is_dir():
        return []
    found = []
    for path in snapshot_dir.iterdir():
        if _NAME.match(path.name) and path.is_file():
            found.append(path)
    infos = []
    for path in found:
        try:
            infos.append(_read_info(path))
        except FileNotFoundError:  # removed by a concurrent compaction after the listing
            continue
    return sorted(infos, key=lambda info: info.txid)


def latest_snapshot(snapshot_dir: Path) -> SnapshotInfo | None:
    """The newest snapshot in ``snapshot_dir``, or None if there is none.

    Example:
        >>> latest_snapshot(layout.snapshot_dir(stage, 2))
        SnapshotInfo(path=PosixPath('.../snapshot-x000000000041.parquet'), txid=41, keys=1200, ...)
    """
    snapshots = list_snapshots(snapshot_dir)
    return snapshots[-1] if snapshots else None


def read_snapshot(path: Path) -> Iterator[tuple[Key, Any]]:
    """Every (key tuple, wrapped value) of a snapshot file, in key order.

    Example:
        >>> dict(read_snapshot(latest_snapshot(snapshot_dir).path))
        {('apple',): TransactionalValue(txid=7, val=5), ...}

    Raises:
        ReplayError: the file is not a stream_ops snapshot or holds a malformed row.
    """
    path = Path(path)
    parquet = _open_parquet(path)
    try:
        for keys, values in _decoded_batches(parquet, path, exclude=None):
            for key, value in zip(keys, values, strict=True):
                yield as_key(key), value
    finally:
        parquet.close()


def read_compaction_marker(queue: StateTopicQueue) -> CompactionMarker | None:
    """The queue's compaction marker, or None if its batch files were never deleted.

    Raises:
        ReplayError: the marker is unreadable.
    """
    path = queue.path / COMPACTED_MARKER
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        snapshot_dir = Path(data["snapshot_dir"])
        if not snapshot_dir.is_absolute():
            snapshot_dir = queue.path / snapshot_dir
        txid = data["txid"]
        if not isinstance(txid, int) or isinstance(txid, bool) or txid < 0:
            raise ValueError(f"txid {txid!r} is not a non-negative integer")
        return CompactionMarker(txid=txid, snapshot_dir=Path(os.path.normpath(snapshot_dir)))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ReplayError(
            f"the compaction marker {path} is unreadable ({e}); it should name the snapshot directory and "
            "txid of the last compaction — restore it, or rebuild from that directory's latest snapshot"
        ) from e


# --- writing ------------------------------------------------------------------------------


def write_snapshot(
    queue: StateTopicQueue, snapshot_dir: Path, committed_txid: int, *, committed_epoch: int | None = None
) -> SnapshotInfo:
    """Write the snapshot of ``queue`` at ``committed_txid`` into ``snapshot_dir``.

    Starts from the newest snapshot in ``snapshot_dir`` at or below ``committed_txid`` and
    applies the batch files above it, so each compaction reads only what is new. When the
    newest snapshot already is at ``committed_txid`` it is returned as it is. Older snapshots
    are removed once the new one is in place. Batch files are not deleted (see
    :func:`compact_queue`).

    Example:
        >>> info = write_snapshot(StateTopicQueue(layout.state_topic(stage), 2),
        ...                       layout.snapshot_dir(stage, 2), committed_txid=41)
        >>> info.txid, info.keys
        (41, 1200)

    Args:
        queue: the state-topic queue.
        snapshot_dir: the queue's snapshot directory (created if missing).
        committed_txid: the queue's committed txid in ZooKeeper; later batches are left out.
        committed_epoch: the epoch ZooKeeper recorded with it; when given, a committed batch
            whose file is missing fails the snapshot instead of making the loss permanent.

    Returns:
        The snapshot at ``committed_txid``.

    Raises:
        ReplayError: a snapshot newer than ``committed_txid`` exists, the queue was compacted
            past the newest snapshot in ``snapshot_dir``, or an entry or snapshot is corrupt.
        StateError: the snapshot could not be written.
    """
    _check_txid(committed_txid)
    started = time.perf_counter()
    snapshot_dir = Path(snapshot_dir)
    snapshots = list_snapshots(snapshot_dir)
    base = snapshot_base(snapshots, committed_txid, snapshot_dir, where=queue.path)
    _check_covers_marker(queue, base, snapshot_dir, read_compaction_marker(queue))
    if base is not None and base.txid == committed_txid:
        logger.info("state topic %s: snapshot %s is already at txid %d", queue.path, base.path, committed_txid)
        return base

    after = base.txid if base is not None else -1
    changes = replay_arrow_changes(queue, after_txid=after, committed_txid=committed_txid, committed_epoch=committed_epoch)
    return store_snapshot(snapshot_dir, snapshots, base, changes, committed_txid, where=queue.path, started=started)


def snapshot_base(
    snapshots: list[SnapshotInfo], committed_txid: int, snapshot_dir: Path, *, where: object
) -> SnapshotInfo | None:
    """The snapshot a new one at ``committed_txid`` builds on: the newest at or below it, or None.

    Raises:
        ReplayError: ``snapshots`` holds one newer than ``committed_txid`` (``where`` names the queue).
    """
    newer = [info.txid for info in snapshots if info.txid > committed_txid]
    if newer:
        raise ReplayError(
            f"cannot snapshot {where} at txid {committed_txid}: {snapshot_dir} already holds a snapshot at "
            f"txid {max(newer)}. A committed txid never goes back, so the committed txid given is wrong (read it "
            "from /transactional in ZooKeeper) or the directory belongs to another queue"
        )
    return usable_snapshot(snapshots, committed_txid, snapshot_dir)


def store_snapshot(
    snapshot_dir: Path,
    snapshots: list[SnapshotInfo],
    base: SnapshotInfo | None,
    changes: ReplayedChanges | ArrowChanges,
    committed_txid: int,
    *,
    where: object,
    started: float,
    offset: int | None = None,
) -> SnapshotInfo:
    """Write the snapshot at ``committed_txid``: ``base`` overlaid with ``changes`` (the net changes
    of the txids above it), then remove the older ``snapshots``.

    Shared by the file state topic (:func:`write_snapshot`) and the Kafka one, which records the
    partition ``offset`` the snapshot covers up to.

    Raises:
        ReplayError: a changed value is not a stored state value.
        StateError: the snapshot could not be written.
    """
    with paused_cyclic_gc():
        table = _merged_table(base, changes, where)
    epoch = changes.top_epochs.get(committed_txid)
    target = snapshot_dir / snapshot_file_name(committed_txid)
    meta = {
        "format": SNAPSHOT_FORMAT,
        "txid": committed_txid,
        "epoch": epoch,
        "keys": table.num_rows,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "seconds": round(time.perf_counter() - started, 6),
        "base_txid": base.txid if base is not None else None,
        "tail_files": changes.files,
        "tail_entries": changes.entries,
        "queue": str(where),
    }
    if offset is not None:
        meta["offset"] = offset
    _write_atomically(target, table, meta)
    _write_sst_beside(target, table)
    seconds = time.perf_counter() - started
    info = SnapshotInfo(
        path=target,
        txid=committed_txid,
        keys=table.num_rows,
        bytes=target.stat().st_size,
        seconds=seconds,
        epoch=epoch,
        offset=offset,
    )
    for old in snapshots:
        if old.txid < committed_txid:
            old.path.unlink(missing_ok=True)
            snapshot_sst(old.path).unlink(missing_ok=True)
            logger.info("removed snapshot %s (superseded by txid %d)", old.path, committed_txid)
    logger.info(
        "state topic %s: wrote snapshot %s (%d keys, %d bytes) from %s + %d files / %d entries in %.2fs",
        where,
        target,
        info.keys,
        info.bytes,
        f"snapshot at txid {base.txid}" if base is not None else "no snapshot",
        changes.files,
        changes.entries,
        seconds,
    )
    return info


def compact_queue(
    queue: StateTopicQueue,
    snapshot_dir: Path,
    committed_txid: int,
    *,
    committed_epoch: int | None = None,
    delete_covered: bool = True,
) -> CompactionResult:
    """Snapshot ``queue`` at ``committed_txid``, then delete the batch files the snapshot covers.

    Only batch files with txid <= the snapshot's txid are deleted — each holds entries of its
    own txid only, so every file a later txid needs (including uncommitted batches being
    written now) stays. Before deleting, the queue's ``_compacted.json`` is updated to name
    the snapshot directory, so :func:`~stream_ops.state.restore.rebuild_store` finds the
    snapshot even when its caller passes no ``snapshot_dir``.

    Example:
        >>> result = compact_queue(queue, layout.snapshot_dir(stage, 2), committed_txid=41)
        >>> result.snapshot.txid, result.deleted_files
        (41, 37)

    Args:
        queue: the state-topic queue.
        snapshot_dir: the queue's snapshot directory; use the same one every time.
        committed_txid: the queue's committed txid in ZooKeeper.
        committed_epoch: the epoch recorded with it (see :func:`write_snapshot`).
        delete_covered: delete the covered batch files (False only writes the snapshot).

    Raises:
        ReplayError: see :func:`write_snapshot`.
        StateError: the snapshot, the marker or a deletion failed; nothing is deleted before
            the snapshot and the marker are durable.
    """
    snapshot = write_snapshot(queue, snapshot_dir, committed_txid, committed_epoch=committed_epoch)
    files = queue.batch_files()
    if not delete_covered:
        return CompactionResult(snapshot=snapshot, deleted_files=0, deleted_bytes=0, kept_files=len(files))
    _write_marker(queue, snapshot.txid, Path(snapshot_dir))
    deleted = deleted_bytes = kept = 0
    for file_id, path in files:
        if file_id.txid > snapshot.txid:
            kept += 1
            continue
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            continue
        except OSError as e:
            raise StateError(f"could not delete the covered state-topic file {path}: {e}") from e
        deleted += 1
        deleted_bytes += size
    logger.info(
        "state topic %s: compacted to txid %d, deleted %d covered files (%d bytes), kept %d",
        queue.path,
        snapshot.txid,
        deleted,
        deleted_bytes,
        kept,
    )
    return CompactionResult(snapshot=snapshot, deleted_files=deleted, deleted_bytes=deleted_bytes, kept_files=kept)


# --- restoring ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SstLoad:
    """A restore by ingesting a snapshot's SST (see :meth:`RestoreSource.sst_load`).

    Attributes:
        sst: the SST file beside the snapshot.
        changes: the tail's (encoded key, encoded value or None to delete) in key order.
        keys: the keys the store holds afterwards.
    """

    sst: Path
    changes: Iterator[tuple[bytes, bytes | None]]
    keys: int


class RestoreSource:
    """The (key, wrapped value) pairs of a queue at a committed txid: snapshot rows + tail.

    Made by :func:`open_restore_source`; the snapshot file stays open, so a concurrent
    compaction that removes it does not disturb the restore.

    Attributes:
        snapshot: the snapshot the pairs start from, None for a full replay.
        total: how many pairs at most (a tail key also in the snapshot is counted twice; a
            replay computed in key ranges counts its entries, see ``ArrowChanges.live_at_most``).
    """

    def __init__(
        self,
        snapshot: SnapshotInfo | None,
        parquet: pq.ParquetFile | None,
        tail: ReplayedChanges | EncodedChanges | ArrowChanges,
        where: object,
    ) -> None:
        """``where`` names the state-topic queue the tail was read from, for errors."""
        self.snapshot = snapshot
        self._parquet = parquet
        self._readers: list[Generator[Any, None, None]] = []  # snapshot runs handed out, to close first
        self._tail = tail
        self._where = where
        # the keys the tail changes, to leave out of the snapshot rows (none without a snapshot)
        if isinstance(tail, ArrowChanges):
            self._tail_keys = tail.keys if snapshot is not None else pa.array([], type=pa.string())
            live = tail.live_at_most  # without waiting for a partitioned replay's ranges
        else:
            changed = [key_text(key) for key in tail.changes] if snapshot is not None else []
            self._tail_keys = pa.array(changed, type=pa.string())
            live = sum(1 for value in tail.changes.values() if value is not None)
        # an upper bound: a tail key that is also in the snapshot counts twice
        self.total = (snapshot.keys if snapshot is not None else 0) + live

    @property
    def description(self) -> str:
        """Where the pairs come from, for logs."""
        tail = f"{self._tail.files} state-topic files, {self._tail.entries} entries"
        if self.snapshot is None:
            return f"full replay of {tail}"
        return f"snapshot {self.snapshot.path.name} ({self.snapshot.keys} keys) + tail of {tail}"

    def items(self) -> Iterator[tuple[Any, Any]]:
        """(key, wrapped value): snapshot rows whose key the tail does not change, then the tail's live values.

        Snapshot keys come as JSON lists (what :func:`~stream_ops.state.keys.as_key` takes),
        tail keys as tuples; :meth:`RocksDBBackingMap.restore` normalises both.
        """
        if self._parquet is not None and self.snapshot is not None:
            exclude = self._tail_keys if len(self._tail_keys) else None
            for keys, values in _decoded_batches(self._parquet, self.snapshot.path, exclude=exclude):
                yield from zip(keys, values, strict=True)
        if isinstance(self._tail, EncodedChanges | ArrowChanges):
            yield from self._tail.live_items(self._where)
        else:
            for key, obj in self._tail.live_items():
                yield key, _value_of(obj, self._where)

    def encoded_items(self) -> Iterator[tuple[bytes, bytes]]:
        """The pairs of :meth:`items` as the bytes a store keeps, for :meth:`RocksDBBackingMap.restore_encoded`.

        Snapshot rows are passed on as they are — their columns hold exactly the stored bytes —
        after cheap column-wide checks (no nulls, keys JSON lists, values tagged JSON
        objects); the tail's live values come as :func:`~stream_ops.state.state_topic.replay_arrow_changes`
        read them (the stored bytes), or are encoded once each.

        Raises:
            ReplayError: a snapshot row fails the checks, or a tail value is not a stored value.
        """
        for run in self.sorted_runs():
            for keys, values in run:
                yield from zip(keys, values)

    def sorted_runs(self) -> Iterator[Iterator[tuple[list[bytes], list[bytes]]]]:
        """The pairs of :meth:`encoded_items` as :meth:`RocksDBBackingMap.restore_sorted` takes
        them: the snapshot rows (in key order, the tail's keys left out), then the tail's live
        values in key order, each run as chunks of (key bytes, value bytes).

        Raises:
            ReplayError: see :meth:`encoded_items`.
        """
        if self._parquet is not None and self.snapshot is not None:
            exclude = self._tail_keys if len(self._tail_keys) else None
            run = _encoded_batches(self._parquet, self.snapshot.path, exclude=exclude)
            self._readers.append(run)
            yield run
        yield self._tail_chunks()

    def sst_load(self) -> SstLoad | None:
        """The snapshot's SST and the tail's changes, for :meth:`RocksDBBackingMap.restore_from_sst`,
        when the snapshot has an SST beside it and the tail was read in Arrow; else None.

        Raises:
            ReplayError: the snapshot's key column cannot be read (to count the keys).
        """
        if self.snapshot is None or self._parquet is None or not isinstance(self._tail, ArrowChanges):
            return None
        sst = snapshot_sst(self.snapshot.path)
        if not sst.is_file():
            return None
        tail = self._tail.table
        keys = self.snapshot.keys + tail.num_rows - tail["value"].null_count
        if len(self._tail_keys):  # a tail key already in the snapshot is not a new key, a deleted one is gone
            snapshot_keys = self._parquet.read(columns=["key"]).column("key")
            keys -= pc.sum(pc.is_in(snapshot_keys, value_set=self._tail_keys)).as_py() or 0
        return SstLoad(sst=sst, changes=self._tail.encoded_items(), keys=keys)

    def _tail_chunks(self) -> Iterator[tuple[list[bytes], list[bytes]]]:
        if isinstance(self._tail, ArrowChanges):
            yield from self._tail.encoded_live_chunks()
            return
        # in key order: RocksDB loads sorted keys about three times cheaper (its memtable
        # flushes then do not overlap, so nothing needs compacting), far more than the sort costs
        pairs = sorted(self._tail.encoded_live_items(self._where), key=itemgetter(0))
        yield [key for key, _ in pairs], [value for _, value in pairs]

    def close(self) -> None:
        """Close the snapshot file, once no reader's background thread reads it any more."""
        for reader in self._readers:  # stops its read-ahead thread (a load that failed midway)
            reader.close()
        self._readers.clear()
        if self._parquet is not None:
            self._parquet.close()
            self._parquet = None


def open_restore_source(
    queue: StateTopicQueue,
    committed_txid: int,
    *,
    committed_epoch: int | None = None,
    snapshot_dir: Path | None = None,
    on_file: Callable[[int, int, int], None] | None = None,
    encoded: bool = False,
) -> RestoreSource:
    """Open the newest usable snapshot and read the tail above it, for a restore at ``committed_txid``.

    The snapshot directory is ``snapshot_dir``, or the one the queue's compaction marker
    names. If a compaction deletes files while the tail is read, the read starts again from
    the newer snapshot. With ``encoded`` the tail is read for
    :meth:`RestoreSource.encoded_items` (:func:`~stream_ops.state.state_topic.replay_arrow_changes`);
    both :meth:`RestoreSource.items` and :meth:`RestoreSource.encoded_items` work either way.

    With ``committed_epoch`` (the epoch ZooKeeper recorded for ``committed_txid``) the tail
    must be complete (see :func:`~stream_ops.state.state_topic.replay_changes`).

    Raises:
        ReplayError: only snapshots newer than ``committed_txid`` exist, the queue was
            compacted past ``committed_txid`` or past every snapshot found, an entry is
            corrupt, or a committed batch's file is missing or cut short.
    """
    _check_txid(committed_txid)
    reason = ""
    for _attempt in range(_RESTORE_ATTEMPTS):
        marker = read_compaction_marker(queue)
        directory = Path(snapshot_dir) if snapshot_dir is not None else marker.snapshot_dir if marker else None
        if marker is not None and marker.txid > committed_txid:
            raise ReplayError(
                f"cannot rebuild {queue.path} at txid {committed_txid}: it was compacted at txid {marker.txid}, "
                "so the state of older txids is gone. A committed txid never goes back, so the committed txid "
                "given is wrong (read it from /transactional in ZooKeeper)"
            )
        snapshots = list_snapshots(directory) if directory is not None else []
        base = usable_snapshot(snapshots, committed_txid, directory)
        _check_covers_marker(queue, base, directory, marker)
        try:
            parquet = _open_parquet(base.path) if base is not None else None
            try:
                start = base.txid if base else -1
                tail: ReplayedChanges | ArrowChanges = (
                    replay_arrow_changes(
                        queue,
                        after_txid=start,
                        committed_txid=committed_txid,
                        committed_epoch=committed_epoch,
                        on_file=on_file,
                    )
                    if encoded
                    else replay_changes(
                        queue,
                        after_txid=start,
                        committed_txid=committed_txid,
                        committed_epoch=committed_epoch,
                        on_file=on_file,
                    )
                )
            except BaseException:
                if parquet is not None:
                    parquet.close()
                raise
        except FileNotFoundError as e:  # a compaction removed it after the listing
            reason = f"{e.filename} went away while being read"
            logger.info("state topic %s: %s (compacted meanwhile?); reading again", queue.path, reason)
            continue
        after = read_compaction_marker(queue)
        if after is not None and after.txid > (base.txid if base is not None else -1):
            reason = f"it was compacted to txid {after.txid} while being read"
            logger.info("state topic %s: %s; reading again", queue.path, reason)
            if parquet is not None:
                parquet.close()
            continue
        return RestoreSource(base, parquet, tail, queue.path)
    raise ReplayError(
        f"could not read state topic {queue.path} consistently in {_RESTORE_ATTEMPTS} attempts (last: {reason}); "
        "if its compaction runs back to back, pause the compaction schedule and rebuild again"
    )


def open_snapshot_source(
    base: SnapshotInfo | None, tail: ReplayedChanges | EncodedChanges | ArrowChanges, where: object
) -> RestoreSource:
    """A :class:`RestoreSource` of ``base`` (opened now, None for a full replay) and ``tail``.

    Raises:
        FileNotFoundError: the snapshot was removed (by a newer compaction) meanwhile.
        ReplayError: the snapshot is not a readable stream_ops snapshot.
    """
    parquet = _open_parquet(base.path) if base is not None else None
    return RestoreSource(base, parquet, tail, where)


# --- helpers ------------------------------------------------------------------------------


def _check_txid(txid: Any) -> None:
    if not isinstance(txid, int) or isinstance(txid, bool) or txid < 0:
        raise ReplayError(f"committed txid must be a non-negative integer, got {txid!r}")


def usable_snapshot(snapshots: list[SnapshotInfo], committed_txid: int, directory: Path | None) -> SnapshotInfo | None:
    """The newest snapshot at or below ``committed_txid``; ReplayError if only newer ones exist."""
    usable = [info for info in snapshots if info.txid <= committed_txid]
    if usable:
        return usable[-1]
    if snapshots:
        raise ReplayError(
            f"the snapshots in {directory} are all newer than the committed txid {committed_txid} "
            f"(the oldest is at txid {snapshots[0].txid}); a committed txid never goes back, so the committed "
            "txid given is wrong (read it from /transactional in ZooKeeper) or the snapshots belong to another queue"
        )
    return None


def _check_covers_marker(
    queue: StateTopicQueue, base: SnapshotInfo | None, directory: Path | None, marker: CompactionMarker | None
) -> None:
    """ReplayError unless ``base`` covers every batch file the queue's compaction deleted."""
    if marker is None or (base is not None and base.txid >= marker.txid):
        return
    found = f"holds snapshots only up to txid {base.txid}" if base is not None else "holds no snapshot"
    raise ReplayError(
        f"state topic {queue.path} was compacted at txid {marker.txid}, so its batch files up to there are "
        f"deleted, but the snapshot directory {directory} {found}; use the directory of that compaction, "
        f"{marker.snapshot_dir}"
    )


def _value_of(obj: Any, where: object) -> Any:
    try:
        return from_json_obj(obj)
    except StateError as e:
        raise ReplayError(f"state topic {where}: {e}") from e


def _merged_table(base: SnapshotInfo | None, changes: ReplayedChanges | ArrowChanges, where: object) -> pa.Table:
    """The rows of ``base`` overlaid with ``changes``, sorted by key (Arrow column operations)."""
    if isinstance(changes, ArrowChanges):
        new = changes.live_table().cast(_SCHEMA)  # sorted by key already
        changed = changes.keys
    else:
        tail: dict[str, str | None] = {}
        for key, obj in changes.changes.items():
            tail[key_text(key)] = None if obj is None else stored_value_text(obj, where)
        live = [(key, text) for key, text in tail.items() if text is not None]
        new = pa.table(
            {
                "key": pa.array([key for key, _ in live], type=pa.string()),
                "value": pa.array([text for _, text in live], type=pa.string()),
            },
            schema=_SCHEMA,
        ).sort_by([("key", "ascending")])
        changed = pa.array(list(tail), type=pa.string())
    if base is None:
        return new
    previous = _read_table(base.path)
    if len(changed):
        previous = previous.filter(pc.invert(pc.is_in(previous["key"], value_set=changed)))
    return pa.concat_tables([previous, new]).sort_by([("key", "ascending")])


def _write_atomically(target: Path, table: pa.Table, meta: dict[str, Any]) -> None:
    """Write ``table`` to ``target`` via a hidden temp file, fsync and rename."""
    make_dirs(target.parent)
    tmp = target.parent / f".{target.name}.{uuid.uuid4().hex}.tmp"
    schema = _SCHEMA.with_metadata({_META_KEY: json.dumps(meta, separators=(",", ":")).encode("utf-8")})
    try:
        with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
            writer.write_table(table.cast(schema), row_group_size=_ROW_GROUP_ROWS)
        os.chmod(tmp, FILE_MODE)
        fsync_file(tmp)
        os.replace(tmp, target)
        fsync_dir(target.parent)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, (OSError, pa.ArrowException)):
            raise StateError(f"could not write the snapshot {target}: {e}") from e
        raise


def snapshot_sst(path: Path) -> Path:
    """The SST file written beside the snapshot ``path``: its rows in RocksDB's own format, which
    a restore ingests whole instead of writing each key (:meth:`RocksDBBackingMap.restore_from_sst`)."""
    return path.with_suffix(".sst")


def _write_sst_beside(target: Path, table: pa.Table) -> None:
    """Write ``table`` (a snapshot's rows, sorted by key) as the SST beside ``target``, via a
    hidden temp file, fsync and rename. Optional: a failure is logged and restores read the
    Parquet snapshot instead."""
    sst = snapshot_sst(target)
    tmp = sst.parent / f".{sst.name}.{uuid.uuid4().hex}.tmp"

    def chunks() -> Iterator[tuple[list[bytes], list[bytes]]]:
        for start in range(0, table.num_rows, _ROW_GROUP_ROWS):
            chunk = table.slice(start, _ROW_GROUP_ROWS)
            yield chunk["key"].cast(pa.binary()).to_pylist(), chunk["value"].cast(pa.binary()).to_pylist()

    try:
        if write_sorted_sst(tmp, chunks(), where=target) == 0:
            return  # no rows: no file (RocksDB cannot finish an empty one); restores read the snapshot
        os.chmod(tmp, FILE_MODE)
        fsync_file(tmp)
        os.replace(tmp, sst)
        fsync_dir(sst.parent)
    except (OSError, StateError) as e:
        logger.warning("snapshot %s: could not write its SST (%s); restores will read the Parquet file", target, e)
    finally:
        tmp.unlink(missing_ok=True)


def _write_marker(queue: StateTopicQueue, txid: int, snapshot_dir: Path) -> None:
    """Durably record that the queue's batch files up to ``txid`` are covered by ``snapshot_dir``."""
    target = queue.path / COMPACTED_MARKER
    try:
        recorded = os.path.relpath(snapshot_dir.resolve(), queue.path.resolve())
    except ValueError:  # another drive on Windows
        recorded = str(snapshot_dir.resolve())
    data = {
        "txid": txid,
        "snapshot_dir": recorded,
        "compacted_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    tmp = queue.path / f".{COMPACTED_MARKER}.{uuid.uuid4().hex}.tmp"
    try:
        make_dirs(queue.path)
        tmp.write_text(json.dumps(data, separators=(",", ":")) + "\n", encoding="utf-8")
        os.chmod(tmp, FILE_MODE)
        fsync_file(tmp)
        os.replace(tmp, target)
        fsync_dir(queue.path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise StateError(f"could not write the compaction marker {target}: {e}; nothing was deleted") from e


def _read_info(path: Path) -> SnapshotInfo:
    meta = _read_meta(path)
    name_txid = int(_NAME.match(path.name)["txid"])  # type: ignore[index]
    if meta.get("txid") != name_txid:
        raise ReplayError(f"snapshot {path} records txid {meta.get('txid')!r} but is named for txid {name_txid}")
    return SnapshotInfo(
        path=path,
        txid=name_txid,
        keys=int(meta["keys"]),
        bytes=path.stat().st_size,
        seconds=float(meta.get("seconds", 0.0)),
        epoch=meta.get("epoch"),
        offset=meta.get("offset"),
    )


def _read_meta(path: Path) -> dict[str, Any]:
    try:
        kv = pq.read_metadata(path).metadata or {}
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowException) as e:
        raise ReplayError(f"snapshot {path} is not a readable Parquet file: {e}; delete it and compact again") from e
    return _parse_meta(kv, path)


def _parse_meta(kv: dict[bytes, bytes], path: Path) -> dict[str, Any]:
    try:
        meta = json.loads(kv[_META_KEY])
        if meta["format"] != SNAPSHOT_FORMAT:
            raise ValueError(f"format {meta['format']!r}, expected {SNAPSHOT_FORMAT}")
        int(meta["keys"])
        return meta
    except (KeyError, ValueError, TypeError) as e:
        raise ReplayError(f"{path} is not a stream_ops snapshot ({e}); delete it and compact again") from e


def _open_parquet(path: Path) -> pq.ParquetFile:
    try:
        parquet = pq.ParquetFile(path)
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowException) as e:
        raise ReplayError(f"snapshot {path} is not a readable Parquet file: {e}; delete it and compact again") from e
    _parse_meta(parquet.schema_arrow.metadata or {}, path)
    missing = {"key", "value"} - set(parquet.schema_arrow.names)
    if missing:
        parquet.close()
        raise ReplayError(f"snapshot {path} lacks the column(s) {', '.join(sorted(missing))}")
    return parquet


def _read_table(path: Path) -> pa.Table:
    parquet = _open_parquet(path)
    try:
        return parquet.read(columns=["key", "value"]).cast(_SCHEMA)
    finally:
        parquet.close()


def _decoded_batches(parquet: pq.ParquetFile, path: Path, *, exclude: pa.Array | None) -> Iterator[tuple[list[Any], list[Any]]]:
    """(key lists, wrapped values) per record batch, rows whose key is in ``exclude`` left out.

    Each column of a batch is decoded with one ``json.loads`` of the joined texts.
    """
    for batch in parquet.iter_batches(batch_size=_READ_BATCH_ROWS, columns=["key", "value"]):
        if exclude is not None:
            batch = batch.filter(pc.invert(pc.is_in(batch.column("key"), value_set=exclude)))
        if batch.num_rows == 0:
            continue
        keys = _load_texts(batch.column("key").to_pylist(), path, "key")
        objs = _load_texts(batch.column("value").to_pylist(), path, "value")
        try:
            values = [from_json_obj(obj) for obj in objs]
        except StateError as e:
            raise ReplayError(f"snapshot {path}: {e}") from e
        for key in keys:
            if type(key) is not list:
                raise ReplayError(f"snapshot {path}: a key is not a JSON list: {key!r}")
        yield keys, values


def _encoded_batches(
    parquet: pq.ParquetFile, path: Path, *, exclude: pa.Array | None
) -> Generator[tuple[list[bytes], list[bytes]], None, None]:
    """(key bytes, value bytes) per record batch, rows whose key is in ``exclude`` left out.

    Nothing is decoded: the columns are checked with Arrow compute (no nulls; every key starts
    with ``[`` and ends with ``]``, every value starts with ``{"k":"`` and ends with ``}``, as
    ``encode_key`` and ``encode_stored`` make them) and handed over as bytes. The Arrow part
    (reading, filtering, checking the next batches) runs ahead in a background thread, so it
    overlaps the caller's GIL-bound load of the current batch.
    """
    batches = read_ahead(_checked_batches(parquet, path, exclude=exclude))
    try:
        for keys, values in batches:
            for start in range(0, len(keys), LOAD_CHUNK_ROWS):
                yield keys.slice(start, LOAD_CHUNK_ROWS).to_pylist(), values.slice(start, LOAD_CHUNK_ROWS).to_pylist()
    finally:
        batches.close()  # waits for the batch being read: the caller may close the file next


def _checked_batches(parquet: pq.ParquetFile, path: Path, *, exclude: pa.Array | None) -> Iterator[tuple[pa.Array, pa.Array]]:
    """The key and value columns of :func:`_encoded_batches` per batch, checked, as binary arrays."""
    for batch in parquet.iter_batches(batch_size=_ROW_GROUP_ROWS, columns=["key", "value"]):
        if exclude is not None:
            batch = batch.filter(pc.invert(pc.is_in(batch.column("key"), value_set=exclude)))
        if batch.num_rows == 0:
            continue
        keys = _check_encoded(batch.column("key"), "[", "]", path, "key")
        values = _check_encoded(batch.column("value"), '{"k":"', "}", path, "value")
        yield keys.cast(pa.binary()), values.cast(pa.binary())


def _check_encoded(column: pa.Array, prefix: str, suffix: str, path: Path, name: str) -> pa.Array:
    """``column`` as strings; ReplayError unless every text is non-null and starts and ends as stored ones do."""
    if column.type != pa.string():
        try:
            column = column.cast(pa.string())  # e.g. large_string from another writer
        except pa.ArrowException as e:
            raise ReplayError(f"snapshot {path}: the {name} column is {column.type}, not string: {e}") from e
    good = pc.and_kleene(pc.starts_with(column, prefix), pc.ends_with(column, suffix))
    if column.null_count == 0 and pc.all(good).as_py():
        return column
    bad = pc.index(pc.fill_null(good, False), False).as_py()
    text = column[bad].as_py()
    raise ReplayError(
        f"snapshot {path}: a {name} is not {'a JSON list' if name == 'key' else 'a stored state value'}: "
        f"{str(text)[:80]!r}; delete the snapshot and compact again"
    )


def _load_texts(texts: list[str | None], path: Path, column: str) -> list[Any]:
    """Decode a list of JSON texts with one ``json.loads``; per text to name a bad one."""
    try:
        if None not in texts:
            decoded = json.loads("[" + ",".join(texts) + "]")  # type: ignore[arg-type]
            if len(decoded) == len(texts):
                return decoded
    except json.JSONDecodeError:
        pass
    out = []
    for text in texts:
        try:
            if text is None:
                raise ValueError("null")
            out.append(json.loads(text))
        except ValueError as e:
            raise ReplayError(f"snapshot {path}: a {column} is not JSON text ({e}): {str(text)[:80]!r}") from e
    return out
