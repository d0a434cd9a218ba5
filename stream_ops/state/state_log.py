"""Where a keyed task's state topic is kept: the interface the runtime uses, and its file form.

A task appends each batch's state changes to its queue of the state topic (step 4 of the commit
protocol), restores its store from it (snapshot + tail), lets a store that is behind catch up
with the tail, and compacts it into snapshots. :class:`StateLog` is those four operations;
the runtime (task state, standbys, compaction) uses only them, so where the queue lives is
decided once, when it is opened:

- :class:`FileStateLog`: the file state topic (:mod:`stream_ops.state.state_topic`), the
  embedded default;
- :class:`~stream_ops.state.kafka_state_topic.KafkaStateLog`: one partition of a Kafka topic
  (``state_topic="kafka"`` in the topology's conf).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from stream_ops.state.kafka_state_topic import KafkaStateTopic
from stream_ops.state.restore import catch_up_store, rebuild_store
from stream_ops.state.rocksdb_backing import RocksDBBackingMap
from stream_ops.state.snapshot import CompactionResult, compact_queue
from stream_ops.state.state_topic import StateTopicQueue
from stream_ops.topics.file_topic import FileTopic


class StateLog(Protocol):
    """One queue of a state topic, wherever it is kept."""

    @property
    def where(self) -> str:
        """The queue, for logs and errors (a directory, or ``kafka:<topic>/<partition>``)."""
        ...

    def append_batch(self, task_id: int, txid: int, epoch: int, encoded: Sequence[tuple[str, str | None]]) -> int:
        """Append batch ``txid`` of owner ``epoch``: every (key text, stored value text or None
        for a deletion) and its end record, durable when this returns (step 4, before the
        ZooKeeper commit). Every batch appends, with no entries when nothing changed.

        Returns:
            The bytes appended (for the automatic snapshot's threshold).

        Raises:
            StateError: the batch is not durable (the caller must not commit it).
        """
        ...

    def rebuild(
        self,
        store: RocksDBBackingMap,
        committed_txid: int,
        committed_epoch: int,
        *,
        snapshot_dir: Path | None,
        require_complete: bool = True,
    ) -> int:
        """Restore an EMPTY store at the committed txid from the newest snapshot plus the tail
        (see :func:`~stream_ops.state.restore.rebuild_store`); returns the keys restored.

        Raises:
            ReplayError: the state cannot be rebuilt exactly at ``committed_txid``.
        """
        ...

    def catch_up(
        self, store: RocksDBBackingMap, committed_txid: int, committed_epoch: int, *, snapshot_dir: Path | None
    ) -> int | None:
        """Bring a store at an earlier committed state up to the committed txid by applying only
        the tail above its marker (see :func:`~stream_ops.state.restore.catch_up_store`).

        Returns:
            The changed keys applied (0: current already), or None when the store cannot catch
            up (not at a committed state, or its tail was compacted): the caller rebuilds it.
        """
        ...

    def compact(
        self, snapshot_dir: Path, committed_txid: int, *, committed_epoch: int | None = None, delete_covered: bool = True
    ) -> CompactionResult:
        """Snapshot the queue at the committed txid, then drop what the snapshot covers (see
        :func:`~stream_ops.state.snapshot.compact_queue`)."""
        ...

    def close(self) -> None:
        """Release the clients the log holds (it may be used again: they reopen)."""
        ...


class FileStateLog:
    """The file state topic's queue as a :class:`StateLog` (its behaviour is the module functions')."""

    def __init__(self, queue: StateTopicQueue) -> None:
        self.queue = queue

    @property
    def where(self) -> str:
        return str(self.queue.path)

    def append_batch(self, task_id: int, txid: int, epoch: int, encoded: Sequence[tuple[str, str | None]]) -> int:
        return self.queue.append_encoded(task_id, txid, epoch, encoded).stat().st_size

    def rebuild(
        self,
        store: RocksDBBackingMap,
        committed_txid: int,
        committed_epoch: int,
        *,
        snapshot_dir: Path | None,
        require_complete: bool = True,
    ) -> int:
        return rebuild_store(
            store, self.queue, committed_txid, committed_epoch, snapshot_dir=snapshot_dir, require_complete=require_complete
        )

    def catch_up(
        self, store: RocksDBBackingMap, committed_txid: int, committed_epoch: int, *, snapshot_dir: Path | None
    ) -> int | None:
        return catch_up_store(store, self.queue, committed_txid, committed_epoch)

    def compact(
        self, snapshot_dir: Path, committed_txid: int, *, committed_epoch: int | None = None, delete_covered: bool = True
    ) -> CompactionResult:
        return compact_queue(
            self.queue, snapshot_dir, committed_txid, committed_epoch=committed_epoch, delete_covered=delete_covered
        )

    def close(self) -> None:
        """Nothing to release: every operation opens and closes its files."""


def open_state_log(
    conf: Mapping[str, Any], *, file_topic: FileTopic, queue: int, topology_id: str, stage_index: int, stage_name: str
) -> StateLog:
    """The queue ``queue`` of a stateful stage's state topic, where the topology's conf keeps it.

    Args:
        conf: the topology's conf (``StormRecord.conf``): ``state_topic="kafka"`` and its
            settings (see :meth:`KafkaStateTopic.from_conf`) put it in Kafka, else it is files.
        file_topic: the stage's file state topic (``TopologyLayout.state_topic``); its queue
            count is the stage's.
        queue: the queue (the task's source queue).
        topology_id: the submission.
        stage_index: the stage's index in the plan.
        stage_name: the stage's name.

    Raises:
        ConfigError: the conf's state-topic settings are malformed.
    """
    kafka = KafkaStateTopic.from_conf(conf)
    if kafka is None:
        return FileStateLog(StateTopicQueue(file_topic, queue))
    file_topic.queue_path(queue)  # validates the queue number
    topic = kafka.topic_name(topology_id, stage_index, stage_name)
    return kafka.log(topic, queue, partitions=file_topic.queues)
