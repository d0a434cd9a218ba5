"""What one task's query reads, seen from the task: its checkpoint's entries for a batch, the
ticks written into its input, the shuffle files its committed batches consumed, and its lag."""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stream_ops.coordination.records import BatchInput
from stream_ops.kafka.shuffle_options import KafkaShuffle
from stream_ops.runtime.stage_processors import TICK_STREAM
from stream_ops.sources import SourceLag, source_kind
from stream_ops.sources.base import files_newer_than
from stream_ops.spark.checkpoint import batch_input, batch_offsets, latest_file_timestamp, remove_crashed_writes
from stream_ops.spark.shuffle_queue import (
    next_tick_stamp,
    offset_txids,
    planned_txids,
    read_before,
    retire_read,
    shuffle_suffix,
    tick_file_name,
    unread_files,
)
from stream_ops.topics.shuffle_files import shuffle_file_rows
from stream_ops.topology.layout import TopologyLayout
from stream_ops.topology.plan import StageSpec, TaskSpec

if TYPE_CHECKING:
    from stream_ops.kafka.shuffle_reader import KafkaShuffleInput
    from stream_ops.kafka.shuffle_ticks import TickProducer

logger = logging.getLogger(__name__)


class TaskInput:
    """The input side of one task.

    The calls that depend on the shuffle between the stages take the topology's Kafka shuffle
    (None: shuffle files), which the task learns when it starts.
    """

    def __init__(self, *, layout: TopologyLayout, stage: StageSpec, task: TaskSpec) -> None:
        self.layout = layout
        self.stage = stage
        self.task = task
        self._last_tick = 0.0
        self._last_input_ms = 0
        self._ticks: TickProducer | None = None
        self._entries: tuple[int, Future[tuple[list[Any], BatchInput | None]]] | None = None

    @property
    def checkpoint_dir(self) -> Path:
        """The task's Spark checkpoint."""
        return self.layout.checkpoint_dir(self.task.task_id)

    @property
    def input_dir(self) -> Path | None:
        """The directory this task's query reads (None for a source that is not files)."""
        return self.layout.input_dir(self.stage, self.task.queue)

    def shuffle_topic_name(self, kafka_shuffle: KafkaShuffle | None) -> str:
        """This stage's Kafka shuffle topic (with the Kafka shuffle only)."""
        assert kafka_shuffle is not None
        return kafka_shuffle.topic_name(self.layout.topology_id, self.stage.index, self.stage.name)

    def open_checkpoint(self) -> Path:
        """Before the query starts: drop the temp files a crashed Spark left in the checkpoint
        and note the newest input it consumed; returns the checkpoint."""
        checkpoint = self.checkpoint_dir
        remove_crashed_writes(checkpoint)
        self._last_input_ms = latest_file_timestamp(checkpoint)
        return checkpoint

    def kafka_input(self, kafka_shuffle: KafkaShuffle | None) -> KafkaShuffleInput | None:
        """The Kafka shuffle partition the query reads, its topic created if missing (None
        for a source stage or shuffle files)."""
        if kafka_shuffle is None or self.stage.reads_source:
            return None
        from stream_ops.kafka.shuffle_reader import KafkaShuffleInput
        from stream_ops.kafka.shuffle_writer import ensure_shuffle_topic

        kafka_input = KafkaShuffleInput(kafka_shuffle, self.shuffle_topic_name(kafka_shuffle))
        # Created here too, so Spark never meets a missing topic (nor auto-creates a wrong one).
        ensure_shuffle_topic(kafka_shuffle, kafka_input.topic, self.stage.queues, kafka_shuffle.client_config())
        return kafka_input

    def maybe_tick(self, now: float, interval: float | None, kafka_shuffle: KafkaShuffle | None) -> bool:
        """Write a tick record into this task's input when ``interval`` (of its time-based
        windows or triggers; None: they have none) passed since the last; returns whether one
        was written."""
        if interval is None or now - self._last_tick < interval:
            return False
        self._last_tick = now
        tick = {"stream": TICK_STREAM, "key": None, "record": "{}"}
        if kafka_shuffle is not None:
            if self._ticks is None:
                from stream_ops.kafka.shuffle_ticks import TickProducer  # confluent-kafka, only with a Kafka shuffle

                self._ticks = TickProducer(kafka_shuffle, self.shuffle_topic_name(kafka_shuffle))
            self._ticks.send(self.task.queue, tick)
            return True
        topic = self.layout.shuffle_topic(self.stage)
        stamp = next_tick_stamp(self.checkpoint_dir, time.time_ns())
        topic.write_file(self.task.queue, tick_file_name(self.task.task_id, stamp), [tick])
        return True

    def close_ticks(self) -> None:
        """Close the Kafka tick producer, if one was opened."""
        if self._ticks is not None:
            self._ticks.close()
            self._ticks = None

    def checkpoint_entries(self, txid: int) -> tuple[list[Any], BatchInput | None]:
        """Spark's offsets and input fingerprint of batch ``txid`` (logged before the batch runs)."""
        checkpoint = self.checkpoint_dir
        return batch_offsets(checkpoint, txid), batch_input(checkpoint, txid)

    def read_entries_ahead(self, txid: int, io: ThreadPoolExecutor) -> None:
        """Start reading batch ``txid``'s checkpoint entries on the task's I/O thread ``io``
        (while Spark computes the batch: they are logged before ``foreachBatch`` runs)."""
        self._entries = (txid, io.submit(self.checkpoint_entries, txid))

    def batch_entries(self, txid: int) -> tuple[list[Any], BatchInput | None]:
        """Batch ``txid``'s offsets and input fingerprint: those read ahead, else read now."""
        entries, self._entries = self._entries, None
        if entries is not None and entries[0] == txid:
            return entries[1].result()
        return self.checkpoint_entries(txid)

    def retire_consumed(self, txid: int, epoch: int | None) -> None:
        """On the I/O thread: delete the shuffle files the batches before ``txid`` read, when the
        queue source reads them (Spark committed those batches before it planned this one, and
        ZooKeeper before that, so no replay reads them again)."""
        checkpoint = self.checkpoint_dir
        try:
            if offset_txids(checkpoint, txid) is None:
                return  # Spark's file source: its log holds every file, so they stay
            read = read_before(checkpoint, txid)
            if read:
                retire_read(self.layout.shuffle_topic(self.stage), self.task.queue, read, epoch=epoch)
        except Exception:  # on the I/O thread nobody awaits this: say what failed, and go on
            logger.exception("task %s/%d: consumed shuffle files not deleted", self.layout.topology_id, self.task.task_id)

    def lag(self, kafka_shuffle: KafkaShuffle | None) -> SourceLag:
        """Input not read yet: files modified after the newest file the query consumed, and
        their records where they can be counted (a source's kind says how)."""
        checkpoint = self.checkpoint_dir
        self._last_input_ms = max(self._last_input_ms, latest_file_timestamp(checkpoint))
        if self.stage.reads_source:
            assert self.stage.source is not None
            return source_kind(self.stage.source.kind).lag(self.stage.source, self.task.queue, self._last_input_ms)
        if kafka_shuffle is not None:
            return SourceLag(records=None, files=None)  # not measured for a Kafka shuffle
        queue_dir = self.layout.shuffle_topic(self.stage).queue_path(self.task.queue)
        read = planned_txids(self.checkpoint_dir)
        if read is not None:  # the queue source: what it planned so far is read
            files = unread_files(queue_dir, read, shuffle_suffix(self.stage))
        else:
            files = files_newer_than(queue_dir, self._last_input_ms)
        return SourceLag(records=sum(shuffle_file_rows(f) for f in files), files=len(files))
