"""The ``print`` sink kind (``Stream.print``): each committed batch's records logged to the worker
log (logger ``stream_ops.print``), through a :class:`~stream_ops.topics.delivery_topic.DeliveryTopic`
so a batch committed by an owner that died before logging it is logged by the next owner, once.

Only the owner logs: no batch above the txid it committed (a newer owner's), and only after it
checked it still owns the task. A crash after the lines were logged and before the batch was
marked delivered logs them again (the window of one marker write): to the log, ``print`` is at
least once per txid.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from stream_ops.sinks.delivered import DeliveredBatchWriter
from stream_ops.topology.sink_kinds import AfterPublish, Record, SinkContext, SinkKind, SinkWriter

if TYPE_CHECKING:
    from stream_ops.topology.plan import SinkSpec

print_logger = logging.getLogger("stream_ops.print")


class PrintWriter(DeliveredBatchWriter):
    """Logs each published batch's lines (records as JSON text) up to the committed txid."""

    delivers_unfenced = True

    def lines(self, records: list[Record]) -> list[Any]:
        return [json.dumps(record, default=str) for record in records]  # any record prints, JSON or not

    def deliver(self, txid: int, records: list[Record]) -> None:
        for line in records:
            print_logger.info("%s task %d txid %d: %s", self.spec.name, self.context.task.task_id, txid, line)

    def after_publish(self, publish: AfterPublish) -> None:
        queue, task_id = self.context.task.queue, self.context.task.task_id
        for batch in self.topic.published(queue, task_id):
            if batch.txid > publish.committed_txid:
                break
            lines = self.topic.read_batch(batch)
            if lines is None:
                continue  # delivered and removed meanwhile by a stale owner
            publish.verify_owner()
            self.deliver(batch.txid, lines)
            self.topic.mark_delivered(queue, task_id, batch.txid, epoch=publish.epoch, path=batch.path)


class PrintKind(SinkKind):
    """The worker log."""

    name = "print"
    asset_kinds = frozenset({"python"})

    def writer(self, spec: SinkSpec, context: SinkContext) -> SinkWriter:
        return PrintWriter(spec, context)
