"""One task's committed batches delivered to Kafka, each in one transaction with its progress record.

The machinery shared by the exactly-once Kafka sink (:mod:`stream_ops.kafka.sink`) and the
shuffle between stages kept in Kafka (:mod:`stream_ops.kafka.shuffle_writer`):

* a transactional producer whose ``transactional.id`` is stable per (topology, output, task), so
  a new owner's ``init_transactions()`` fences every earlier producer of the task (a zombie, a
  dead process's open transaction);
* after fencing, the last txid Kafka holds from the id is read from the progress topic
  (:mod:`stream_ops.kafka.progress`); it is final, since no earlier producer can commit any more;
* :meth:`TransactionalBatchWriter.deliver_messages` writes batch ``n``'s messages and the progress
  record ``n`` in one transaction, unless ``n`` is at most the last delivered txid (then it is a
  no-op): batches are delivered in txid order, so "``n`` <= last" is "``n`` is in Kafka".

The exactly-once argument, crash point by crash point, is in :mod:`stream_ops.kafka.sink`; it
holds for every subclass, which only says which topics it checks and how a batch's records
become messages.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from stream_ops.errors import KafkaServerError, KafkaSinkError, KafkaSinkFencedError
from stream_ops.kafka.client import client_config, ensure_topic
from stream_ops.kafka.progress import (
    PROGRESS_TOPIC_CONFIG,
    already_delivered,
    progress_partition,
    progress_record,
    read_delivered_txid,
)
from stream_ops.kafka.sink_records import KafkaMessage, batch_headers

PRODUCER_DEFAULTS: dict[str, Any] = {
    "partitioner": "murmur2_random",
    "linger.ms": 5,
    "transaction.timeout.ms": 60_000,
}
"""Producer settings ``config`` may override: Java's key partitioning, a short linger (a batch is
flushed at its commit anyway) and the broker's default transaction timeout."""
PROGRESS_PARTITIONS = 1
"""Partitions of a progress topic the writer creates (an existing one is used as it is)."""
FENCED_CODES = frozenset({-144, 90, 47})
"""librdkafka's ``_FENCED``, Kafka's ``PRODUCER_FENCED`` and ``INVALID_PRODUCER_EPOCH``."""


class TransactionalBatchWriter:
    """Delivers one task's committed batches of one output to Kafka, each exactly once.

    Args:
        bootstrap: the brokers.
        config: resolved librdkafka settings (SASL, TLS, ...) for every client.
        transactional_id: the task's producer identity for this output (stable across owners).
        progress_topic: the compacted topic of the progress records.
        replication_factor: replicas of the topics the writer creates (None: the brokers' default).
        topology_id: the submitted topology.
        output: the output's name (a sink's name, a shuffle's), for the progress record and messages.
        task_id: the task.
        timeout_s: how long one Kafka operation (fencing, reading the progress, a commit) may take.
    """

    error: type[KafkaSinkError] = KafkaSinkError
    """What a failure raises (a subclass names its kind of output)."""
    what = "Kafka sink"

    def __init__(
        self,
        *,
        bootstrap: str,
        config: Mapping[str, str],
        transactional_id: str,
        progress_topic: str,
        replication_factor: int | None,
        topology_id: str,
        output: str,
        task_id: int,
        timeout_s: float = 30.0,
    ) -> None:
        self.bootstrap = bootstrap
        self.config = dict(config)
        self.transactional_id = transactional_id
        self.progress_topic = progress_topic
        self.replication_factor = replication_factor
        self.topology_id = topology_id
        self.output = output
        self.task_id = task_id
        self.timeout_s = timeout_s
        self._producer: Any = None
        self._delivered: int | None = None
        self._progress_partition = 0
        self._logger = logging.getLogger(type(self).__module__)

    @property
    def delivered_txid(self) -> int | None:
        """The last txid in Kafka from this task (None until :meth:`start`)."""
        return self._delivered

    def _prepare_topics(self) -> None:
        """Check (or create) the topics the messages go to; raises KafkaServerError or :attr:`error`."""

    def start(self) -> int:
        """Check the topics, fence every earlier producer of the task's transactional id and read
        what they delivered; returns the last delivered txid.

        Raises:
            KafkaSinkError: (:attr:`error`) a topic is missing or unfit, or Kafka refused or did
                not answer.
        """
        from confluent_kafka import KafkaException, Producer

        try:
            self._prepare_topics()
            partitions = ensure_topic(
                self.bootstrap,
                self.progress_topic,
                partitions=PROGRESS_PARTITIONS,
                replication_factor=self.replication_factor,
                topic_config=PROGRESS_TOPIC_CONFIG,
                config=self.config,
                timeout_s=self.timeout_s,
            )
        except KafkaServerError as e:
            raise self.error(f"{self.what} {self.output!r}: {e}") from e
        self._progress_partition = progress_partition(self.transactional_id, partitions)
        settings = {**PRODUCER_DEFAULTS, **self.config, "transactional.id": self.transactional_id, "enable.idempotence": True}
        producer = Producer(client_config(self.bootstrap, **settings))
        try:
            producer.init_transactions(self.timeout_s)
        except KafkaException as e:
            raise self.error(f"{self.what} {self.output!r}: init_transactions of {self.transactional_id!r} failed: {e}") from e
        self._delivered = read_delivered_txid(
            self.bootstrap,
            self.config,
            self.progress_topic,
            self._progress_partition,
            self.transactional_id,
            timeout_s=self.timeout_s,
        )
        self._producer = producer
        self._logger.info(
            "%s %s of task %s/%d: producer %r ready, delivered up to txid %d",
            self.what,
            self.output,
            self.topology_id,
            self.task_id,
            self.transactional_id,
            self._delivered,
        )
        return self._delivered

    def deliver_messages(self, txid: int, messages: Sequence[KafkaMessage], topic: str) -> bool:
        """Write batch ``txid``'s ``messages`` to ``topic`` in one transaction with its progress
        record, unless Kafka has the batch already; returns whether it wrote.

        Raises:
            KafkaSinkFencedError: a newer owner's producer fenced this one (nothing of the
                transaction becomes visible).
            KafkaSinkError: (:attr:`error`) Kafka refused the transaction or did not answer; the
                outcome is settled when the next writer starts.
        """
        if self._producer is None:
            self.start()
        assert self._delivered is not None
        if already_delivered(txid, self._delivered):
            self._logger.info(
                "%s %s: txid %d of task %s/%d is in Kafka already (delivered up to %d); skipped",
                self.what,
                self.output,
                txid,
                self.topology_id,
                self.task_id,
                self._delivered,
            )
            return False
        from confluent_kafka import KafkaException

        headers = batch_headers(self.topology_id, self.task_id, txid)
        key, value = progress_record(
            self.transactional_id, topology_id=self.topology_id, sink=self.output, task_id=self.task_id, txid=txid
        )
        started = time.perf_counter()
        try:
            self._producer.begin_transaction()
            shared: tuple[tuple[str, bytes], ...] | None = None
            as_list: list[tuple[str, bytes]] = []
            for message in messages:
                if message.headers is not shared:  # the client takes a list: one per batch, not per message
                    shared, as_list = message.headers, list(message.headers)
                self._produce(topic, message, as_list)
            self._produce(self.progress_topic, KafkaMessage(key, value, headers, self._progress_partition))
            self._commit()
        except KafkaException as e:
            self._abandon()
            error = e.args[0] if e.args else None
            code = error.code() if error is not None and hasattr(error, "code") else None
            what = f"{self.what} {self.output!r}: txid {txid} of task {self.topology_id}/{self.task_id}"
            if code in FENCED_CODES:
                raise KafkaSinkFencedError(f"{what}: producer {self.transactional_id!r} was fenced by a newer owner") from e
            raise self.error(f"{what} not delivered: {e}") from e
        except BaseException:
            self._abandon()
            raise
        self._delivered = txid
        self._logger.debug(
            "%s %s: txid %d of task %s/%d delivered, %d messages in %.1f ms",
            self.what,
            self.output,
            txid,
            self.topology_id,
            self.task_id,
            len(messages),
            (time.perf_counter() - started) * 1000.0,
        )
        return True

    def _produce(self, topic: str, message: KafkaMessage, headers: list[tuple[str, bytes]] | None = None) -> None:
        """Produce ``message`` (``headers``: its headers as a list, when the caller has one)."""
        extra = {} if message.partition is None else {"partition": message.partition}
        headers = list(message.headers) if headers is None else headers
        while True:
            try:
                self._producer.produce(topic, value=message.value, key=message.key, headers=headers, **extra)
                return
            except BufferError:  # the local queue is full: let it drain into the transaction
                self._producer.poll(0.05)

    def _commit(self) -> None:
        """Commit the open transaction (flushes its messages first)."""
        self._producer.commit_transaction(self.timeout_s)

    def _abandon(self) -> None:
        """Abort the open transaction if the producer still can, and drop the producer: the next
        delivery starts a new one, whose ``init_transactions()`` settles what this one left."""
        producer, self._producer, self._delivered = self._producer, None, None
        if producer is None:
            return
        try:
            producer.abort_transaction(min(self.timeout_s, 5.0))
        except Exception as e:  # noqa: BLE001 - a fenced or failed producer cannot abort; the next owner's init does
            self._logger.debug("%s %s: abort of %r failed: %s", self.what, self.output, self.transactional_id, e)
            return  # dropped as it is: closing would try to abort again
        try:
            producer.close()
        except Exception as e:  # noqa: BLE001 - closing is best effort on this path
            self._logger.debug("%s %s: closing %r failed: %s", self.what, self.output, self.transactional_id, e)

    def close(self) -> None:
        """Close the producer (no transaction is open between deliveries)."""
        producer, self._producer, self._delivered = self._producer, None, None
        if producer is not None:
            producer.close()
