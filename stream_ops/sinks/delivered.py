"""Writers of sinks delivered after the commit: each batch staged in a
:class:`~stream_ops.topics.delivery_topic.DeliveryTopic`, published, then handed over once.

A batch is marked delivered only after :meth:`DeliveredBatchWriter.deliver` returned, so a
crash in between delivers it again with the same txid and records: the consumer makes a second
delivery of a txid a no-op (a user function writing by txid, a Kafka sink's progress record).
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from typing import TYPE_CHECKING, Any

from stream_ops.topology.sink_kinds import AfterPublish, Record, SinkContext, SinkWriter

if TYPE_CHECKING:
    from stream_ops.topics.delivery_topic import PublishedBatch
    from stream_ops.topics.staged_output import StagedOutput
    from stream_ops.topology.plan import SinkSpec

logger = logging.getLogger(__name__)


class DeliveredBatchWriter(SinkWriter):
    """Stages a task's batches in its delivery topic and delivers each published one, oldest first."""

    def __init__(self, spec: SinkSpec, context: SinkContext) -> None:
        self.spec = spec
        self.context = context
        self.topic = context.delivery_topic(spec)

    def staged_outputs(self) -> list[StagedOutput]:
        return [self.topic]

    def stage_batch(self, txid: int, epoch: int, records: list[Record]) -> None:
        task = self.context.task
        self.topic.stage_batch(task.queue, task.task_id, txid, epoch, self.lines(records))

    def lines(self, records: list[Record]) -> list[Any]:
        """What a batch file holds (default: the records)."""
        return records

    def start_delivery(self) -> None:
        """Called at each delivery pass before the first batch, even with none (default: nothing)."""

    @abstractmethod
    def deliver(self, txid: int, records: list[Record]) -> None:
        """Hand one published batch over; raising leaves it undelivered (retried at the next start)."""

    def deliver_published(self, batch: PublishedBatch) -> bool:
        """Hand one published batch over, read from its file (default); False when the file is
        gone (delivered and removed meanwhile by a stale owner)."""
        records = self.topic.read_batch(batch)
        if records is None:
            return False
        self.deliver(batch.txid, records)
        return True

    def after_publish(self, publish: AfterPublish) -> None:
        queue, task_id = self.context.task.queue, self.context.task.task_id
        self.start_delivery()
        for batch in self.topic.published(queue, task_id):
            if not self.deliver_published(batch):
                continue
            self.topic.mark_delivered(queue, task_id, batch.txid, epoch=publish.epoch, path=batch.path)
            logger.debug("sink %s: txid %d of task %d delivered", self.spec.name, batch.txid, task_id)
