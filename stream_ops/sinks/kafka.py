"""The ``kafka`` sink kind (``Stream.to_kafka``): each committed batch of a task in one Kafka
transaction, whose progress record makes a second delivery of a txid a no-op
(:mod:`stream_ops.kafka.sink`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stream_ops.asset_metadata import AssetMetadata
from stream_ops.errors import TopologyDefinitionError
from stream_ops.kafka.sink_options import KafkaSinkSpec
from stream_ops.kafka.sink_records import MessageParts, staged_message_parts
from stream_ops.sinks.delivered import DeliveredBatchWriter
from stream_ops.topics.file_topic import encode_json_lines
from stream_ops.topology.sink_kinds import Record, SinkAsset, SinkContext, SinkKind, SinkWriter

if TYPE_CHECKING:
    from stream_ops.kafka.sink import KafkaSinkWriter
    from stream_ops.topics.delivery_topic import PublishedBatch
    from stream_ops.topology.plan import SinkSpec

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _StagedMessages:
    """What this writer staged last: batch (txid, epoch)'s messages' (key, value), as the
    batch's file gives them back."""

    txid: int
    epoch: int
    parts: list[MessageParts]


class KafkaWriter(DeliveredBatchWriter):
    """Delivers a task's published batches through its transactional producer.

    The batch it staged last is also kept in memory, encoded as its messages: when that batch
    is the one to deliver (the usual case: the batch just published) its messages are taken
    from there, without reading and parsing its file; any other batch (one published by an
    earlier owner, or left undelivered by a failure) is read from its file. The messages are
    the same bytes either way (:func:`~stream_ops.kafka.sink_records.staged_message_parts`):
    the file stays the one record of the batch, and what a restart delivers from it.
    """

    def __init__(self, spec: SinkSpec, context: SinkContext) -> None:
        super().__init__(spec, context)
        self._producer: KafkaSinkWriter | None = None
        self._staged: _StagedMessages | None = None

    def stage_batch(self, txid: int, epoch: int, records: list[Record]) -> None:
        """Stage the batch's file and keep its messages for its delivery."""
        assert self.spec.kafka is not None  # checked by KafkaKind.check_spec
        task = self.context.task
        self._staged = None  # until the file holds the batch kept
        lines = encode_json_lines(records, self.topic.pending_path(task.queue))
        self.topic.stage_lines(task.queue, task.task_id, txid, epoch, lines)
        try:
            parts = staged_message_parts(records, lines, key=self.spec.kafka.key, value=self.spec.kafka.value)
        except Exception:  # a record no message is made of fails its delivery, as from the file
            logger.debug("sink %s: txid %d kept for delivery from its file", self.spec.name, txid, exc_info=True)
            return
        self._staged = _StagedMessages(txid, epoch, parts)

    def start_delivery(self) -> None:
        """Start the producer (a new owner fences the old one's) at the first pass, even with nothing to deliver."""
        if self._producer is None:
            from stream_ops.kafka.sink import KafkaSinkWriter  # confluent-kafka, only for tasks with a Kafka sink

            assert self.spec.kafka is not None  # checked by KafkaKind.check_spec
            self._producer = KafkaSinkWriter(
                self.spec.kafka,
                topology_id=self.context.layout.topology_id,
                sink=self.spec.name,
                task_id=self.context.task.task_id,
            )
        if self._producer.delivered_txid is None:
            self._producer.start()

    def deliver(self, txid: int, records: list[Record]) -> None:
        assert self._producer is not None
        self._producer.deliver(txid, records)

    def deliver_published(self, batch: PublishedBatch) -> bool:
        """Deliver the batch staged last from memory when it is ``batch`` (same txid and owner
        epoch: the same file), else from its file."""
        staged = self._staged
        if staged is None or (staged.txid, staged.epoch) != (batch.txid, batch.epoch):
            return super().deliver_published(batch)
        assert self._producer is not None
        self._producer.deliver_parts(batch.txid, staged.parts)
        self._staged = None  # delivered: the marker comes next, nothing delivers it again
        return True

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()


def kafka_asset_metadata(spec: KafkaSinkSpec) -> dict[str, AssetMetadata]:
    """Where a Kafka sink writes; of its client settings only the names (values may be secrets,
    or ``env:NAME`` references).

    Example:
        >>> meta = kafka_asset_metadata(KafkaSinkSpec(bootstrap="k:9092", topic="out", config={"sasl.password": "x"}))
        >>> meta["stream_ops/kafka_topic"].value, meta["stream_ops/kafka_client_settings"].value
        ('out', ['sasl.password'])
    """
    metadata = {
        "stream_ops/kafka_topic": AssetMetadata("text", spec.topic),
        "stream_ops/kafka_bootstrap": AssetMetadata("text", spec.bootstrap),
        "stream_ops/kafka_progress_topic": AssetMetadata("text", spec.progress_topic),
        "stream_ops/kafka_transactional_id_prefix": AssetMetadata("text", spec.transactional_id_prefix),
        "stream_ops/kafka_key_field": AssetMetadata("text", spec.key or "(none)"),
        "stream_ops/kafka_value_field": AssetMetadata("text", spec.value or "(the record as JSON)"),
        "stream_ops/kafka_client_settings": AssetMetadata("json", sorted(spec.config)),
    }
    if spec.partitions is not None:
        metadata["stream_ops/kafka_partitions"] = AssetMetadata("int", spec.partitions)
    return metadata


class KafkaKind(SinkKind):
    """A Kafka topic (``spec.kafka`` holds the options)."""

    name = "kafka"
    asset_kinds = frozenset({"kafka"})

    def check_spec(self, spec: SinkSpec) -> None:
        super().check_spec(spec)
        if spec.kafka is None:
            raise TopologyDefinitionError(f"kafka sink {spec.name!r}: needs its Kafka options")

    def writer(self, spec: SinkSpec, context: SinkContext) -> SinkWriter:
        return KafkaWriter(spec, context)

    def asset(self, spec: SinkSpec) -> SinkAsset:
        assert spec.kafka is not None
        return SinkAsset(
            kinds=self.asset_kinds,
            where=f" into Kafka topic `{spec.kafka.topic}` on `{spec.kafka.bootstrap}`",
            metadata=kafka_asset_metadata(spec.kafka),
        )
