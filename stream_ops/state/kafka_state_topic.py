"""The state topic on Kafka: one partition per queue of a stateful stage, same replay rule as files.

Chosen per topology in its conf (``submit(..., conf=KafkaStateTopic(bootstrap).to_conf())``,
i.e. ``state_topic="kafka"`` and ``state_topic_bootstrap``); without it the file state topic
stays. The topic is ``stream_ops-state.<topology id>.<stage index>-<stage name>``, created by
the first task with one partition per queue of the stage.

**The commit protocol.** Step 4 produces the batch's entries and its end record to the queue's
partition with an idempotent producer (``acks=all``) and returns only once the brokers
acknowledged every record; a refused or unacknowledged record raises, so step 5 (the ZooKeeper
commit) never runs for a batch that is not durable. The records carry (task, txid, epoch) and an
attempt id in their headers, so the replay rule of the file state topic applies unchanged
(:mod:`stream_ops.state.kafka_state_records`): entries of committed txids only, for each txid the
highest epoch's complete batch, a batch complete only with its end record. A zombie owner's late
produce (a lower epoch, or a txid it never commits) lands in the partition and counts for
nothing, exactly as its file would; a replayed batch is one more attempt of its txid, which
replaces the earlier attempt instead of adding to it.

**Why the topic is not key-compacted.** Kafka's log compaction keeps the last record per key,
whatever its txid or epoch: if the record key were the state key, a zombie's or an uncommitted
batch's later write of a key would let the cleaner delete the committed entry that replay needs,
and nothing could tell. So the topic is created with ``cleanup.policy=delete`` and infinite
retention (``retention.ms=-1``, ``retention.bytes=-1``; a topic found with other settings is
refused), and it is compacted as the file state topic is, by stream_ops: a compaction (``stream-ops
compact``, the automatic snapshot) writes the Parquet snapshot at the committed txid S, recording
the partition offset O just after S's counted end record, and only then deletes the records below
O (``DeleteRecords``). Every record a later txid counts lies at or above O (batch S + 1 is
produced only after S was committed), so truncating there drops nothing replay needs. The end
record has a null key, which a key-compacted topic refuses: a topic switched to compaction by hand
fails the next batch loudly instead of losing state silently.

**Restore** reads the partition from the newest snapshot's offset (or from offset 0 when there is
no snapshot; a partition truncated without a snapshot covering it is an error, not an empty
state) to its end, applies the rule for the txids above the snapshot and bulk-loads the store as a
file restore does. A compaction that truncates while a restore reads makes the restore start again
from the newer snapshot. **Standbys** keep their :class:`KafkaStateLog` between polls: each poll
reads only the records produced since the last one and applies the txids committed meanwhile.

Snapshots stay files in the stage's snapshot directory (shared, like today); only the log moves to
Kafka.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from stream_ops.errors import ReplayError, StateTopicTruncatedError
from stream_ops.kafka.conf_choice import KafkaConfChoice
from stream_ops.state.kafka_state_partition import StatePartition, resolved_client_config
from stream_ops.state.kafka_state_records import KafkaStateBatches, batch_records
from stream_ops.state.restore import restore_from_source
from stream_ops.state.rocksdb_backing import RocksDBBackingMap
from stream_ops.state.snapshot import (
    CompactionResult,
    SnapshotInfo,
    list_snapshots,
    open_snapshot_source,
    snapshot_base,
    store_snapshot,
    usable_snapshot,
)
from stream_ops.state.state_topic import paused_cyclic_gc

logger = logging.getLogger(__name__)

TOPIC_PREFIX = "stream_ops-state"
_RESTORE_ATTEMPTS = 3


class KafkaStateTopic(KafkaConfChoice):
    """Keep a topology's state topics in Kafka (its conf says so, see :meth:`from_conf`).

    Conf keys: ``state_topic`` (``"files"``, the default, or ``"kafka"``),
    ``state_topic_bootstrap`` (required for Kafka), ``state_topic_config``,
    ``state_topic_replication_factor``, ``state_topic_timeout_s``.

    Example:
        >>> submit(store, cluster, topology, conf={**KafkaStateTopic(bootstrap="kafka:9092").to_conf()})
    """

    KIND_KEY: ClassVar[str] = "state_topic"
    WHAT: ClassVar[str] = "state topic"
    TOPIC_PREFIX: ClassVar[str] = TOPIC_PREFIX

    def log(self, topic: str, partition: int, *, partitions: int) -> KafkaStateLog:
        """The :class:`KafkaStateLog` of one queue (no client connects before its first use)."""
        return KafkaStateLog(
            StatePartition(
                self.bootstrap,
                topic,
                partition,
                partitions=partitions,
                client=resolved_client_config(self.config),
                replication_factor=self.replication_factor,
                timeout_s=self.timeout_s,
            )
        )


class KafkaStateLog:
    """One queue of a state topic kept in a Kafka partition (a
    :class:`~stream_ops.state.state_log.StateLog`); see the module docstring for the design."""

    def __init__(self, partition: StatePartition) -> None:
        self.partition = partition
        self._attempt_prefix = uuid.uuid4().hex[:16]
        self._attempts = itertools.count()
        # What catch_up read past the store's marker, kept for the next catch-up (a standby's poll).
        self._tail: KafkaStateBatches | None = None
        self._tail_marker: tuple[int, int] | None = None
        self._tail_position = 0

    @property
    def where(self) -> str:
        return self.partition.where

    # --- step 4 -------------------------------------------------------------------------

    def append_batch(self, task_id: int, txid: int, epoch: int, encoded: Sequence[tuple[str, str | None]]) -> int:
        """Produce batch ``txid``'s entries and end record; durable (acknowledged by all in-sync
        replicas) when this returns. Raises StateError otherwise."""
        attempt = f"{self._attempt_prefix}-{next(self._attempts)}"
        return self.partition.append(batch_records(task_id, txid, epoch, attempt, encoded))

    # --- restoring ----------------------------------------------------------------------

    def rebuild(
        self,
        store: RocksDBBackingMap,
        committed_txid: int,
        committed_epoch: int,
        *,
        snapshot_dir: Path | None,
        require_complete: bool = True,
    ) -> int:
        """Restore an EMPTY store at the committed txid: the newest snapshot at or below it, then
        the partition from the snapshot's offset (or from the start) to its end.

        Raises:
            ReplayError: no snapshot covers a truncated partition, a committed batch is missing
                (with ``require_complete``), a record is malformed, or compactions kept
                truncating the partition under the read.
        """
        _check_txid(committed_txid)
        reason = ""
        for _attempt in range(_RESTORE_ATTEMPTS):
            with paused_cyclic_gc():
                base = self._restore_base(snapshot_dir, committed_txid)
                start = base.offset if base is not None and base.offset is not None else 0
                try:
                    records, end = self.partition.read(start)
                except StateTopicTruncatedError as e:
                    reason = str(e)
                    logger.info("%s; reading again from the newer snapshot", reason)
                    continue
                batches = KafkaStateBatches(self.where)
                batches.extend(records)
                tail = batches.encoded_changes(
                    after_txid=base.txid if base is not None else -1,
                    committed_txid=committed_txid,
                    committed_epoch=committed_epoch if require_complete else None,
                )
                try:
                    source = open_snapshot_source(base, tail, self.where)
                except FileNotFoundError:
                    reason = f"the snapshot {base.path if base else ''} was replaced while being read"
                    continue
                count = restore_from_source(
                    store, source, where=self.where, committed_txid=committed_txid, committed_epoch=committed_epoch
                )
            batches.forget_through(committed_txid)
            self._keep_tail(batches, (committed_txid, committed_epoch), end)
            return count
        raise ReplayError(
            f"could not read state topic {self.where} consistently in {_RESTORE_ATTEMPTS} attempts (last: {reason}); "
            "if its compaction runs back to back, pause it and rebuild again"
        )

    def _restore_base(self, snapshot_dir: Path | None, committed_txid: int) -> SnapshotInfo | None:
        """The snapshot a restore at ``committed_txid`` starts from; ReplayError when none covers
        what the partition no longer holds."""
        snapshots = list_snapshots(snapshot_dir) if snapshot_dir is not None else []
        return self._checked_base(usable_snapshot(snapshots, committed_txid, snapshot_dir), snapshot_dir, committed_txid)

    def _checked_base(self, base: SnapshotInfo | None, snapshot_dir: Path | None, committed_txid: int) -> SnapshotInfo | None:
        """``base``, once it is known to be a snapshot of a Kafka state topic, or None when the
        partition still holds everything from offset 0."""
        if base is not None and base.offset is None:
            raise ReplayError(
                f"snapshot {base.path} records no Kafka offset: it is a file state topic's, not one of {self.where}"
            )
        low, _ = self.partition.watermarks()
        if base is None and low > 0:
            raise ReplayError(
                f"state topic {self.where} was truncated to offset {low}, but {snapshot_dir} holds no snapshot at or "
                f"below txid {committed_txid} covering the deleted records; use the snapshot directory of its compaction"
            )
        return base

    def catch_up(
        self, store: RocksDBBackingMap, committed_txid: int, committed_epoch: int, *, snapshot_dir: Path | None
    ) -> int | None:
        """Apply the batches committed above the store's marker (t, e), read from the partition:
        from where the last catch-up of this log stopped when it left the store at (t, e), else
        from the newest snapshot at or below t (checking that e is the epoch that counts for t).

        Returns:
            The changed keys applied (0: current already), or None when the store is not at a
            committed state or its tail was truncated: the caller rebuilds it.

        Raises:
            ReplayError: a record is malformed.
        """
        marker = store.applied_marker()
        if marker == (committed_txid, committed_epoch):
            return 0
        if marker is None or marker[0] > committed_txid:
            return None
        txid, epoch = marker
        with paused_cyclic_gc():
            if self._tail is not None and self._tail_marker == marker:
                batches, start, verified = self._tail, self._tail_position, True
            else:
                found = self._tail_start(snapshot_dir, txid, epoch)
                if found is None:
                    return None
                start, verified = found
                batches = KafkaStateBatches(self.where)
            try:
                records, end = self.partition.read(start)
            except StateTopicTruncatedError as e:
                logger.info("state store %s: %s; rebuilding instead", store.path, e)
                self._tail = None
                return None
            batches.extend(records)
            counted = batches.counted(txid)
            if not verified and (counted is None or counted.epoch != epoch):
                return None  # the store applied a batch that was not the committed one
            try:
                changes = batches.encoded_changes(after_txid=txid, committed_txid=committed_txid, committed_epoch=committed_epoch)
            except ReplayError as e:
                logger.info("state store %s: the tail cannot be applied (%s); rebuilding instead", store.path, e)
                self._tail = None
                return None
            applied = store.apply_encoded(changes.encoded_items(self.where), committed_txid, committed_epoch)
        batches.forget_through(committed_txid)
        self._keep_tail(batches, (committed_txid, committed_epoch), end)
        logger.info(
            "state store %s: applied the state-topic tail txid %d..%d from %s (%d batches, %d changed keys) instead of a rebuild",
            store.path,
            txid + 1,
            committed_txid,
            self.where,
            changes.files,
            applied,
        )
        return applied

    def _tail_start(self, snapshot_dir: Path | None, txid: int, epoch: int) -> tuple[int, bool] | None:
        """(offset to read from, whether (txid, epoch) is verified already) for a store at
        (txid, epoch), or None when the partition no longer holds what would check it."""
        snapshots = list_snapshots(snapshot_dir) if snapshot_dir is not None else []
        usable = [info for info in snapshots if info.txid <= txid and info.offset is not None]
        low, _ = self.partition.watermarks()
        if not usable:
            return (0, False) if low == 0 else None
        base = usable[-1]
        assert base.offset is not None
        if base.offset < low:
            return None
        if base.txid == txid:
            return (base.offset, True) if base.epoch == epoch else None
        return base.offset, False

    def _keep_tail(self, batches: KafkaStateBatches, marker: tuple[int, int], position: int) -> None:
        self._tail, self._tail_marker, self._tail_position = batches, marker, position

    # --- compaction ---------------------------------------------------------------------

    def compact(
        self, snapshot_dir: Path, committed_txid: int, *, committed_epoch: int | None = None, delete_covered: bool = True
    ) -> CompactionResult:
        """Snapshot the queue at ``committed_txid`` (the previous snapshot plus the records above
        its offset), recording the offset after the committed batch's end record, then delete
        the records below that offset.

        In the result, ``deleted_files`` and ``kept_files`` count records (the partition's
        records below and from the new first offset), ``deleted_bytes`` the keys and values of
        the deleted records read for this snapshot.

        Raises:
            ReplayError: a snapshot newer than ``committed_txid``, a snapshot directory of another
                state topic, a partition truncated past every snapshot, or a missing or
                malformed committed batch.
            StateError: the snapshot could not be written.
            KafkaServerError: the brokers did not answer, or refused the truncation.
        """
        _check_txid(committed_txid)
        started = time.perf_counter()
        snapshot_dir = Path(snapshot_dir)
        snapshots = list_snapshots(snapshot_dir)
        base = self._checked_base(
            snapshot_base(snapshots, committed_txid, snapshot_dir, where=self.where), snapshot_dir, committed_txid
        )
        deleted_bytes = 0
        if base is not None and base.txid == committed_txid:
            info = base
            logger.info("state topic %s: snapshot %s is already at txid %d", self.where, base.path, committed_txid)
        else:
            start = base.offset if base is not None and base.offset is not None else 0
            try:
                records, _ = self.partition.read(start)
            except StateTopicTruncatedError as e:
                raise ReplayError(f"{e}, past the snapshot in {snapshot_dir}: another compaction of it ran meanwhile") from e
            with paused_cyclic_gc():
                batches = KafkaStateBatches(self.where)
                batches.extend(records)
                changes = batches.replayed_changes(
                    after_txid=base.txid if base is not None else -1,
                    committed_txid=committed_txid,
                    committed_epoch=committed_epoch,
                )
            counted = batches.counted(committed_txid)
            if counted is None:
                raise ReplayError(f"state topic {self.where}: the committed txid {committed_txid} has no complete batch")
            offset = counted.end_offset + 1
            deleted_bytes = sum(len(r.key or b"") + len(r.value or b"") for r in records if r.offset < offset)
            info = store_snapshot(
                snapshot_dir, snapshots, base, changes, committed_txid, where=self.where, started=started, offset=offset
            )
        assert info.offset is not None
        low, high = self.partition.watermarks()
        if not delete_covered or info.offset <= low:
            return CompactionResult(snapshot=info, deleted_files=0, deleted_bytes=0, kept_files=high - low)
        new_low = self.partition.truncate(info.offset)
        logger.info(
            "state topic %s: compacted to txid %d, deleted the %d records below offset %d, kept %d",
            self.where,
            committed_txid,
            new_low - low,
            info.offset,
            high - new_low,
        )
        return CompactionResult(
            snapshot=info, deleted_files=new_low - low, deleted_bytes=deleted_bytes, kept_files=high - new_low
        )

    def close(self) -> None:
        """Close the Kafka clients (a later call opens new ones)."""
        self.partition.close()


def _check_txid(txid: Any) -> None:
    if not isinstance(txid, int) or isinstance(txid, bool) or txid < 0:
        raise ReplayError(f"committed txid must be a non-negative integer, got {txid!r}")
