"""An upstream task's shuffle into a stage kept in Kafka: staged batches delivered exactly once.

Step 3 of the commit protocol stages the batch's shuffle rows as one delivery batch of the task
(:class:`~stream_ops.topics.delivery_topic.DeliveryTopic`, like a Kafka sink's), each row tagged
with its downstream queue (:func:`staged_rows`); the ZooKeeper commit records it, step 6 publishes
it and :class:`ShuffleWriter` delivers it: one Kafka transaction per batch holding each row in the
partition of its queue (partition = downstream queue) and the task's progress record, through the
sink's machinery (:class:`~stream_ops.kafka.transactions.TransactionalBatchWriter`). A downstream
task reads its partition ``read_committed``, so it sees an upstream batch only once the upstream's
ZooKeeper commit succeeded and its transaction committed, exactly once (the argument of
:mod:`stream_ops.kafka.sink`, with the downstream task as the ``read_committed`` consumer).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from stream_ops.errors import KafkaServerError, KafkaShuffleError
from stream_ops.kafka.client import ensure_topic
from stream_ops.kafka.shuffle_options import SHUFFLE_TOPIC_CONFIG, KafkaShuffle, output_name
from stream_ops.kafka.sink_records import KafkaMessage, batch_headers
from stream_ops.kafka.transactions import TransactionalBatchWriter

PARTITION_FIELD = "partition"
ROW_FIELD = "row"


def staged_rows(by_queue: Mapping[int, Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """One batch's shuffle rows per downstream queue as the records of its delivery batch
    (``{"partition": queue, "row": row}``), queue by queue, rows in order."""
    return [{PARTITION_FIELD: queue, ROW_FIELD: row} for queue, rows in sorted(by_queue.items()) for row in rows]


def encode_row(row: Mapping[str, Any]) -> bytes:
    """A shuffle row as a message value: the JSON line a shuffle file would hold."""
    return json.dumps(dict(row), separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def shuffle_messages(
    records: Iterable[Mapping[str, Any]], headers: tuple[tuple[str, bytes], ...], partitions: int
) -> list[KafkaMessage]:
    """The messages of a delivery batch's records (see :func:`staged_rows`): no key, the row as
    the value, the queue as the partition.

    Raises:
        KafkaShuffleError: a record names no partition of the topic.
    """
    messages = []
    for record in records:
        partition = record.get(PARTITION_FIELD)
        if not isinstance(partition, int) or isinstance(partition, bool) or not 0 <= partition < partitions:
            raise KafkaShuffleError(f"a staged shuffle row names partition {partition!r}, not one of 0..{partitions - 1}")
        messages.append(KafkaMessage(None, encode_row(record[ROW_FIELD]), headers, partition))
    return messages


def ensure_shuffle_topic(shuffle: KafkaShuffle, topic: str, queues: int, config: Mapping[str, str]) -> None:
    """Create the shuffle topic with one partition per downstream queue unless it exists.

    Raises:
        KafkaShuffleError: it exists with fewer partitions, or Kafka refused or did not answer.
    """
    try:
        found = ensure_topic(
            shuffle.bootstrap,
            topic,
            partitions=queues,
            replication_factor=shuffle.replication_factor,
            topic_config=SHUFFLE_TOPIC_CONFIG,
            config=config,
            timeout_s=shuffle.timeout_s,
        )
    except KafkaServerError as e:
        raise KafkaShuffleError(f"Kafka shuffle topic {topic!r}: {e}") from e
    if found < queues:
        raise KafkaShuffleError(f"Kafka shuffle topic {topic!r} has {found} partitions, the stage it feeds has {queues} queues")


class ShuffleWriter(TransactionalBatchWriter):
    """Delivers one upstream task's committed shuffle batches into one stage's topic, each once.

    Args:
        shuffle: the topology's Kafka shuffle settings.
        topology_id: the submitted topology.
        stage_index: the downstream stage's index.
        stage_name: the downstream stage's name.
        queues: the downstream stage's queues (the topic's partitions).
        task_id: the upstream task.
    """

    error = KafkaShuffleError
    what = "Kafka shuffle"

    def __init__(
        self, shuffle: KafkaShuffle, *, topology_id: str, stage_index: int, stage_name: str, queues: int, task_id: int
    ) -> None:
        super().__init__(
            bootstrap=shuffle.bootstrap,
            config=shuffle.client_config(),
            transactional_id=shuffle.transactional_id(topology_id, stage_index, task_id),
            progress_topic=shuffle.progress_topic,
            replication_factor=shuffle.replication_factor,
            topology_id=topology_id,
            output=output_name(stage_index),
            task_id=task_id,
            timeout_s=shuffle.timeout_s,
        )
        self.shuffle = shuffle
        self.topic = shuffle.topic_name(topology_id, stage_index, stage_name)
        self.queues = queues

    def _prepare_topics(self) -> None:
        ensure_shuffle_topic(self.shuffle, self.topic, self.queues, self.config)

    def deliver(self, txid: int, records: Sequence[Mapping[str, Any]]) -> bool:
        """Write batch ``txid``'s rows, each to its queue's partition, in one transaction unless
        Kafka has the batch already; returns whether it wrote.

        Raises:
            KafkaSinkFencedError: a newer owner of the upstream task fenced this producer.
            KafkaShuffleError: Kafka refused the transaction or did not answer.
        """
        messages = shuffle_messages(records, batch_headers(self.topology_id, self.task_id, txid), self.queues)
        return self.deliver_messages(txid, messages, self.topic)
