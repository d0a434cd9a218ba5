"""A topic of batches handed to a consumer once each: the queue of a function or Kafka sink.

Batches are staged and published like any :class:`~stream_ops.topics.file_topic.FileTopic`
batch; the task then hands each published batch to the user's function and removes it. A
marker per task (``.delivered-t<task>-v<version>.json`` in the queue, the last txid handed
over) remembers what was delivered, so publishing a delivered batch again (a replay after a
crash) is a no-op and a batch is removed only after its function call returned. The marker is
a :class:`~stream_ops.durable_files.ForwardMarker`: a previous owner finishing an older batch
after the new owner marked a newer one cannot move it back (the new owner's restart would
then find the newer batch's file gone and take it for lost). A crash between the call and the
marker calls the function again with the same txid: the sink contract is at-least-once per
txid, made exactly-once by a function that writes idempotently by txid (or, for a Kafka sink, by
the progress record of :mod:`stream_ops.kafka.sink`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from stream_ops.durable_files import ForwardMarker
from stream_ops.topics.file_topic import FileTopic, parse_batch_file_name, queue_sizes

logger = logging.getLogger(__name__)

_TXID = "txid"
"""The one key of a delivery marker."""


@dataclass(frozen=True)
class PublishedBatch:
    """A published batch of a task, not yet delivered: its (txid, owner epoch) and file."""

    txid: int
    epoch: int
    path: Path


@dataclass(frozen=True)
class DeliveryTopic(FileTopic):
    """A FileTopic whose published batches are delivered once, oldest first, then removed."""

    def _marker(self, queue: int, task_id: int) -> ForwardMarker:
        return ForwardMarker(self.queue_path(queue), f".delivered-t{task_id:05d}", durable=self.durable)

    def delivered_txid(self, queue: int, task_id: int) -> int:
        """The last txid of ``task_id`` delivered from ``queue`` (-1 if none)."""
        return self._marker(queue, task_id).read().txids.get(_TXID, -1)

    def publish_batch(self, task_id: int, txid: int, epoch: int, expected: Mapping[str, int] | Mapping[int, int]) -> int:
        """Publish as :meth:`FileTopic.publish_batch`, except batches delivered already."""
        pending = {q: size for q, size in queue_sizes(expected).items() if txid > self.delivered_txid(q, task_id)}
        return super().publish_batch(task_id, txid, epoch, pending)

    def published(self, queue: int, task_id: int) -> Iterator[PublishedBatch]:
        """Each published batch of ``task_id`` not yet delivered, by txid (its records not read:
        :meth:`read_batch`). The files of batches delivered before a crash are removed."""
        delivered = self.delivered_txid(queue, task_id)
        for path in self.files(queue):
            found = parse_batch_file_name(path.name)
            if found is None or found.task_id != task_id:
                continue
            if found.txid <= delivered:
                path.unlink(missing_ok=True)  # delivered before a crash that left the file
                continue
            yield PublishedBatch(found.txid, found.epoch, path)

    @staticmethod
    def read_batch(batch: PublishedBatch) -> list[dict] | None:
        """The records of a published batch; None when its file is gone (delivered and removed
        meanwhile by a stale owner finishing its last batch)."""
        try:
            with open(batch.path, encoding="utf-8") as f:
                return [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return None

    def undelivered(self, queue: int, task_id: int) -> Iterator[tuple[int, list[dict]]]:
        """(txid, records) of each published batch of ``task_id`` not yet delivered, by txid."""
        for batch in self.published(queue, task_id):
            records = self.read_batch(batch)
            if records is not None:
                yield batch.txid, records

    def mark_delivered(self, queue: int, task_id: int, txid: int, *, epoch: int | None = None, path: Path | None = None) -> bool:
        """Record ``txid`` as delivered (durably, never moving the marker back, as a stale owner
        finishing an older batch would), then remove its batch file: ``path`` when the caller
        knows it (:attr:`PublishedBatch.path`), else every file of the txid in the queue.

        Given the task's owner ``epoch``, a previous owner's call records and removes nothing
        once a newer owner has marked a batch (that owner delivers the batch itself). Returns
        whether the batch is recorded as delivered.
        """
        if self._marker(queue, task_id).advance({_TXID: txid}, epoch=epoch) is None:
            logger.info(
                "%s: task %d's newer owner marks its deliveries; this one (epoch %s) leaves txid %d to it",
                self.queue_path(queue),
                task_id,
                epoch,
                txid,
            )
            return False
        if path is not None:
            path.unlink(missing_ok=True)
            return True
        for file in self.files(queue):
            found = parse_batch_file_name(file.name)
            if found is not None and found.task_id == task_id and found.txid == txid:
                file.unlink(missing_ok=True)
        return True
