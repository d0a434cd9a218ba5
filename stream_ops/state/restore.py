"""Restoring a task's state store: the newest snapshot plus the state-topic tail, or a full replay.

Builds on :mod:`stream_ops.state.state_topic` (the replay rule over the state topic) and
:mod:`stream_ops.state.snapshot` (compacted Parquet snapshots); kept apart from both so neither
imports the other's caller.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from stream_ops.errors import SstLoadError
from stream_ops.state.rocksdb_backing import RocksDBBackingMap
from stream_ops.state.snapshot import RestoreSource, open_restore_source
from stream_ops.state.state_topic import StateTopicQueue, paused_cyclic_gc, replay_arrow_changes

logger = logging.getLogger(__name__)


def rebuild_store(
    store: RocksDBBackingMap,
    queue: StateTopicQueue,
    committed_txid: int,
    committed_epoch: int,
    *,
    snapshot_dir: Path | None = None,
    require_complete: bool = False,
    clock: Callable[[], float] = time.monotonic,
    log_interval: float = 1.0,
) -> int:
    """Restore a task's state into an EMPTY store: latest snapshot + state-topic tail, or a full replay.

    With a snapshot at txid S <= ``committed_txid`` (see :mod:`stream_ops.state.snapshot`) the
    store gets the snapshot's keys overlaid with the changes of txids S < txid <=
    ``committed_txid``; without one, the whole queue is replayed. Both give exactly the state
    of DESIGN invariant 5. When ``snapshot_dir`` is None but the queue has been compacted (its
    covered files deleted), the snapshot directory recorded by the compaction is used, so a
    caller that does not know about snapshots never replays a truncated queue. The store is
    loaded with :meth:`RocksDBBackingMap.restore_sorted` (SST files, ingested): the snapshot's
    columns already are the stored bytes, in key order, and so are the tail's
    (:func:`replay_arrow_changes`), so the store ends up byte for byte as
    :meth:`RocksDBBackingMap.restore` of the replayed values leaves it. A snapshot written with
    an SST beside it (every compaction writes one) is not read row by row: the SST is ingested
    whole and the tail applied on top (:meth:`RocksDBBackingMap.restore_from_sst`), the same
    contents without a Python call per key; if the SST cannot be loaded, the Parquet file is read.

    The load runs as a pipeline on two cores: writing the SST file is GIL-bound Python, the
    rest is Arrow compute, which releases the GIL. A large replay is computed in key ranges in
    a thread pool and each range is written as soon as it is ready
    (:attr:`ArrowChanges.ranges <stream_ops.state.state_topic.ArrowChanges>`), and the
    snapshot's next row groups are read and checked in a background thread while the current
    one is written (:func:`~stream_ops.state.state_batch_arrow.read_ahead`).

    Example:
        >>> with RocksDBBackingMap(path) as store:
        ...     rebuild_store(store, StateTopicQueue(topic, 3), committed_txid=41, committed_epoch=5,
        ...                   snapshot_dir=layout.snapshot_dir(stage, 3))
        1200

    Args:
        store: an empty store (see :meth:`RocksDBBackingMap.restore`).
        queue: the state-topic queue of the task's source queue.
        committed_txid: the task's committed txid in ZooKeeper.
        committed_epoch: the owner epoch recorded in the store's marker.
        snapshot_dir: where the queue's snapshots are written, or None (see above).
        require_complete: the queue was written by a task runner, which writes a file for
            every batch: require one for every txid above the snapshot and the committed
            txid's file of ``committed_epoch`` (see :func:`replay_changes`).
        clock: seconds, for rate-limiting progress logs and the keys/s figures.
        log_interval: at most one progress log per this many seconds.

    Returns:
        The number of keys restored.

    Raises:
        ReplayError: the state cannot be rebuilt at ``committed_txid``: a corrupt entry or
            snapshot, a snapshot or compaction newer than ``committed_txid``, or a compacted
            queue without a snapshot covering the deleted files.
    """
    started = clock()
    where = str(store.path)
    limiter = _RateLimit(clock, log_interval)

    def on_file(read: int, total: int, entries: int) -> None:
        if limiter.due():
            logger.info("rebuilding %s: read %d of %d state-topic files (%d entries)", where, read, total, entries)

    with paused_cyclic_gc():
        source = open_restore_source(
            queue,
            committed_txid,
            committed_epoch=committed_epoch if require_complete else None,
            snapshot_dir=snapshot_dir,
            on_file=on_file,
            encoded=True,
        )
        count = restore_from_source(
            store,
            source,
            where=queue.path,
            committed_txid=committed_txid,
            committed_epoch=committed_epoch,
            clock=clock,
            log_interval=log_interval,
        )
    seconds = clock() - started
    logger.info(
        "rebuilt state store %s: %d keys at txid %d epoch %d in %.2fs (%.0f keys/s)",
        where,
        count,
        committed_txid,
        committed_epoch,
        seconds,
        count / seconds if seconds > 0 else float("inf"),
    )
    return count


def tail_start(store: RocksDBBackingMap, queue: StateTopicQueue, committed_txid: int) -> int | None:
    """The txid a store that is behind can catch up from by applying the state-topic tail, or
    None when it cannot and must be rebuilt.

    A store whose marker is (t, e) holds exactly the committed state at txid t when t is at
    most the committed txid and e is the epoch the replay rule counts for t (the highest with
    a file: the committing one). Otherwise it applied a batch that was never committed (a
    lost owner's, or one above the committed txid), or t's file was compacted away so this
    cannot be checked, and only a rebuild is safe.
    """
    marker = store.applied_marker()
    if marker is None or marker[0] > committed_txid:
        return None
    txid, epoch = marker
    return txid if queue.top_epoch(txid) == epoch else None


def catch_up_store(store: RocksDBBackingMap, queue: StateTopicQueue, committed_txid: int, committed_epoch: int) -> int | None:
    """Bring a store that is behind up to (``committed_txid``, ``committed_epoch``) by applying
    only the state-topic tail above its marker (see :func:`tail_start`), in one atomic write.

    Used by a standby replica on every poll and by a task taking over a store its worker kept
    warm, so a failover replays only the txids the store had not applied yet.

    Returns:
        The number of changed keys applied (0 when the store is current already), or None when
        the store cannot catch up by a tail (not at a committed state, or the tail's files were
        compacted): the caller rebuilds it.

    Raises:
        ReplayError: a tail file is corrupt.
    """
    if store.applied_marker() == (committed_txid, committed_epoch):
        return 0
    start = tail_start(store, queue, committed_txid)
    if start is None:
        return None
    present = {file_id.txid for file_id, _ in queue.batch_files()}
    if any(txid not in present for txid in range(start + 1, committed_txid + 1)):
        logger.info("state store %s: the state-topic tail above txid %d was compacted; rebuilding instead", store.path, start)
        return None
    changes = replay_arrow_changes(queue, after_txid=start, committed_txid=committed_txid, committed_epoch=committed_epoch)
    applied = store.apply_encoded(changes.encoded_items(), committed_txid, committed_epoch)
    logger.info(
        "state store %s: applied the state-topic tail txid %d..%d (%d files, %d changed keys) instead of a rebuild",
        store.path,
        start + 1,
        committed_txid,
        changes.files,
        applied,
    )
    return applied


def restore_from_source(
    store: RocksDBBackingMap,
    source: RestoreSource,
    *,
    where: object,
    committed_txid: int,
    committed_epoch: int,
    clock: Callable[[], float] = time.monotonic,
    log_interval: float = 1.0,
) -> int:
    """Bulk-load a :class:`~stream_ops.state.snapshot.RestoreSource` into an EMPTY ``store`` at
    (``committed_txid``, ``committed_epoch``), logging progress; closes ``source``.

    ``where`` names the state-topic queue the source was read from. Returns the keys restored.

    Raises:
        ReplayError: a snapshot row or tail value is malformed.
        StateError: the store is not empty.
    """
    store_path = str(store.path)
    try:
        logger.info(
            "rebuilding state store %s at txid %d from %s: about %d keys (%s)",
            store_path,
            committed_txid,
            where,
            source.total,
            source.description,
        )
        load = source.sst_load()
        if load is not None:
            try:
                store.restore_from_sst(load.sst, load.changes, committed_txid, committed_epoch)
                return load.keys
            except SstLoadError as e:  # nothing written: load the Parquet snapshot instead
                logger.warning("%s; restoring from the Parquet snapshot instead", e)
        # the bytes the store keeps, in sorted runs: snapshot columns as they are, then the tail
        progress = _Progress(source.total, store_path, clock, log_interval)
        runs = (progress.chunks(run) for run in source.sorted_runs())
        return store.restore_sorted(runs, committed_txid, committed_epoch)
    finally:
        source.close()


class _RateLimit:
    """True at most once per ``interval`` seconds of ``clock``."""

    def __init__(self, clock: Callable[[], float], interval: float) -> None:
        self._clock = clock
        self._interval = interval
        self._last = clock()

    def due(self) -> bool:
        now = self._clock()
        if now - self._last >= self._interval:
            self._last = now
            return True
        return False


class _Progress:
    """Logs a restore's progress and keys/s at most once per ``interval`` seconds, per chunk of keys."""

    def __init__(self, total: int, what: str, clock: Callable[[], float], interval: float) -> None:
        self._total = total
        self._what = what
        self._clock = clock
        self._interval = interval
        self._start = self._last = clock()
        self._done = 0

    def chunks(self, chunks: Iterable[tuple[list[bytes], list[bytes]]]) -> Iterator[tuple[list[bytes], list[bytes]]]:
        """Pass ``chunks`` through, counting their keys."""
        for chunk in chunks:
            yield chunk
            self._done += len(chunk[0])
            now = self._clock()
            if now - self._last >= self._interval:
                rate = self._done / (now - self._start) if now > self._start else float("inf")
                logger.info("rebuilding %s: %d/%d keys (%.0f keys/s)", self._what, self._done, self._total, rate)
                self._last = now
