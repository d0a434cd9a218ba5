"""The exactly-once Kafka sink: a task's committed batches, each delivered in one Kafka transaction.

``Stream.to_kafka(...)`` is a delivery sink (:mod:`stream_ops.topics.delivery_topic`): a batch's
records are staged under (task, txid, epoch) in step 3 of the commit protocol, recorded in the
ZooKeeper commit (step 5) and published after it (step 6), like a function sink's. The task then
hands every published, undelivered batch, oldest first, to :meth:`KafkaSinkWriter.deliver`, and
marks it delivered (``.delivered-t<task>``) once that returned. That path alone is at-least-once
per txid: a crash between the delivery and the marker delivers the batch again. The writer makes
the second delivery a no-op:

* **One transactional producer per (topology, sink, task)**, ``transactional.id`` =
  ``<prefix>.<topology id>.<sink>.t<task>`` (:func:`~stream_ops.kafka.sink_options.transactional_id`),
  the same for every owner of the task. A new owner's ``init_transactions()`` bumps the
  producer epoch: the broker completes or aborts every transaction of an earlier owner (a zombie,
  or a process that died mid-transaction) and refuses its later writes and commits
  (:class:`~stream_ops.errors.KafkaSinkFencedError`), as the task epoch fences it in ZooKeeper.
* **Progress in the same transaction.** The transaction of batch ``n`` holds its messages and a
  progress record (key: the transactional id, value: ``n``) in a compacted progress topic
  (:mod:`stream_ops.kafka.progress`): the messages become visible to ``read_committed``
  consumers exactly when Kafka records ``n`` as delivered.
* **Read after fencing.** When it starts (an owner's first delivery pass, at its start when a
  batch is committed, else after its first batch) the writer calls
  ``init_transactions()``, then reads the last delivered txid of its id ``read_committed`` up to
  the progress partition's end. After fencing no earlier producer of the id can commit, so that
  txid is final: batches up to it are in Kafka, later ones are not.
* ``deliver(n)`` skips ``n`` when it is at most the last delivered txid; else it writes it in one
  transaction and remembers ``n``. Batches are delivered in txid order, so "``n`` <= last" is
  "``n`` is in Kafka".

Exactly once, crash point by crash point (task epoch ``e``, txid ``n``):

1. before the ZooKeeper commit: nothing reached Kafka (delivery happens after the commit); the
   batch is replayed and its records delivered by the commit that succeeds.
2. after the ZooKeeper commit, before the Kafka commit: the batch is committed and published but
   not delivered, and Kafka may hold an open transaction of it. The next owner (or the same
   worker restarting the task) publishes the committed batch again (idempotent) and delivers
   it: its ``init_transactions()`` aborts the open transaction, the progress says ``n - 1``, and
   ``n`` is written once. This is the **recovery rule** for a crash between the two commits:
   ZooKeeper's commit decides that the batch exists, Kafka's progress record decides whether it
   was delivered, and the batch is delivered iff it is committed and not recorded as delivered.
3. after the Kafka commit, before the delivered marker: the progress says ``n``: the batch is
   skipped and marked delivered.
4. a zombie (an owner that lost the task but still runs): its ZooKeeper commits are refused, so it
   delivers no batch the new owner did not commit too; one it committed before losing the task
   is delivered by whichever producer commits first, and the other skips it (its progress read
   comes after its ``init_transactions()``) or is fenced.

Failures: a transaction the brokers refuse, or brokers that do not answer within ``timeout_s``,
raise :class:`~stream_ops.errors.KafkaSinkError` after dropping the producer (a commit whose
outcome is unknown is settled by the next ``init_transactions()``, and the progress tells); the
task stops and its next start delivers the batch. A transaction of a dead producer that nobody
replaces keeps ``read_committed`` consumers of its partitions waiting until the broker aborts
it after ``transaction.timeout.ms`` (60 s here unless ``config`` sets it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from stream_ops.errors import KafkaServerError, KafkaSinkError, KafkaSinkFencedError
from stream_ops.kafka.client import client_config, ensure_topic, topic_partitions
from stream_ops.kafka.progress import (
    PROGRESS_TOPIC_CONFIG,
    already_delivered,
    progress_partition,
    progress_record,
    read_delivered_txid,
)
from stream_ops.kafka.sink_options import KafkaSinkSpec, resolve_config, transactional_id
from stream_ops.kafka.sink_records import KafkaMessage, batch_headers, batch_messages

logger = logging.getLogger(__name__)

PRODUCER_DEFAULTS: dict[str, Any] = {
    "partitioner": "murmur2_random",
    "linger.ms": 5,
    "transaction.timeout.ms": 60_000,
}
"""Producer settings the sink's ``config`` may override: Java's key partitioning, a short linger
(a batch is flushed at its commit anyway) and the broker's default transaction timeout."""
PROGRESS_PARTITIONS = 1
"""Partitions of a progress topic the sink creates (an existing one is used as it is)."""
_FENCED_CODES = frozenset({-144, 90, 47})
"""librdkafka's ``_FENCED``, Kafka's ``PRODUCER_FENCED`` and ``INVALID_PRODUCER_EPOCH``."""


class KafkaSinkWriter:
    """Delivers one task's committed batches of one Kafka sink, each exactly once (module docstring).

    Args:
        spec: the sink's options.
        topology_id: the submitted topology.
        sink: the sink's name.
        task_id: the task.
        timeout_s: how long one Kafka operation (fencing, reading the progress, a commit) may take.
    """

    def __init__(self, spec: KafkaSinkSpec, *, topology_id: str, sink: str, task_id: int, timeout_s: float = 30.0) -> None:
        self.spec = spec
        self.topology_id = topology_id
        self.sink = sink
        self.task_id = task_id
        self.timeout_s = timeout_s
        self.transactional_id = transactional_id(spec.transactional_id_prefix, topology_id, sink, task_id)
        self._producer: Any = None
        self._delivered: int | None = None
        self._progress_partition = 0

    @property
    def delivered_txid(self) -> int | None:
        """The last txid in Kafka from this task (None until :meth:`start`)."""
        return self._delivered

    def start(self) -> int:
        """Check the topics (creating what the spec allows), fence every earlier producer of the
        task's transactional id and read what they delivered; returns the last delivered txid.

        Raises:
            KafkaSinkError: the output topic is missing (and ``partitions`` not given), or Kafka
                refused or did not answer.
        """
        from confluent_kafka import KafkaException, Producer

        spec = self.spec
        config = resolve_config(spec.config)
        try:
            if spec.partitions is None:
                if topic_partitions(spec.bootstrap, spec.topic, config=config, timeout_s=self.timeout_s) is None:
                    raise KafkaSinkError(
                        f"Kafka sink {self.sink!r}: topic {spec.topic!r} does not exist at {spec.bootstrap}; create it, "
                        "or pass partitions= to to_kafka() to have it created"
                    )
            else:
                ensure_topic(
                    spec.bootstrap,
                    spec.topic,
                    partitions=spec.partitions,
                    replication_factor=spec.replication_factor,
                    config=config,
                    timeout_s=self.timeout_s,
                )
            partitions = ensure_topic(
                spec.bootstrap,
                spec.progress_topic,
                partitions=PROGRESS_PARTITIONS,
                replication_factor=spec.replication_factor,
                topic_config=PROGRESS_TOPIC_CONFIG,
                config=config,
                timeout_s=self.timeout_s,
            )
        except KafkaServerError as e:
            raise KafkaSinkError(f"Kafka sink {self.sink!r}: {e}") from e
        self._progress_partition = progress_partition(self.transactional_id, partitions)
        settings = {**PRODUCER_DEFAULTS, **config, "transactional.id": self.transactional_id, "enable.idempotence": True}
        producer = Producer(client_config(spec.bootstrap, **settings))
        try:
            producer.init_transactions(self.timeout_s)
        except KafkaException as e:
            raise KafkaSinkError(f"Kafka sink {self.sink!r}: init_transactions of {self.transactional_id!r} failed: {e}") from e
        self._delivered = read_delivered_txid(
            spec.bootstrap,
            config,
            spec.progress_topic,
            self._progress_partition,
            self.transactional_id,
            timeout_s=self.timeout_s,
        )
        self._producer = producer
        logger.info(
            "Kafka sink %s of task %s/%d: producer %r ready, delivered up to txid %d",
            self.sink,
            self.topology_id,
            self.task_id,
            self.transactional_id,
            self._delivered,
        )
        return self._delivered

    def deliver(self, txid: int, records: Sequence[Mapping[str, Any]]) -> bool:
        """Write batch ``txid`` in one transaction unless Kafka has it already; returns whether it wrote.

        Raises:
            KafkaSinkFencedError: a newer owner's producer fenced this one (nothing of the
                transaction becomes visible).
            KafkaSinkError: Kafka refused the transaction or did not answer; the outcome is
                settled when the next writer starts.
        """
        if self._producer is None:
            self.start()
        assert self._delivered is not None
        if already_delivered(txid, self._delivered):
            logger.info(
                "Kafka sink %s: txid %d of task %s/%d is in Kafka already (delivered up to %d); skipped",
                self.sink,
                txid,
                self.topology_id,
                self.task_id,
                self._delivered,
            )
            return False
        from confluent_kafka import KafkaException

        spec = self.spec
        headers = batch_headers(self.topology_id, self.task_id, txid)
        messages = batch_messages(records, key=spec.key, value=spec.value, headers=headers)
        key, value = progress_record(
            self.transactional_id, topology_id=self.topology_id, sink=self.sink, task_id=self.task_id, txid=txid
        )
        started = time.perf_counter()
        try:
            self._producer.begin_transaction()
            for message in messages:
                self._produce(spec.topic, message)
            self._produce(spec.progress_topic, KafkaMessage(key, value, headers), partition=self._progress_partition)
            self._commit()
        except KafkaException as e:
            self._abandon()
            error = e.args[0] if e.args else None
            code = error.code() if error is not None and hasattr(error, "code") else None
            what = f"Kafka sink {self.sink!r}: txid {txid} of task {self.topology_id}/{self.task_id}"
            if code in _FENCED_CODES:
                raise KafkaSinkFencedError(f"{what}: producer {self.transactional_id!r} was fenced by a newer owner") from e
            raise KafkaSinkError(f"{what} not delivered: {e}") from e
        except BaseException:
            self._abandon()
            raise
        self._delivered = txid
        logger.debug(
            "Kafka sink %s: txid %d of task %s/%d delivered, %d messages in %.1f ms",
            self.sink,
            txid,
            self.topology_id,
            self.task_id,
            len(messages),
            (time.perf_counter() - started) * 1000.0,
        )
        return True

    def _produce(self, topic: str, message: KafkaMessage, partition: int | None = None) -> None:
        extra = {} if partition is None else {"partition": partition}
        while True:
            try:
                self._producer.produce(topic, value=message.value, key=message.key, headers=list(message.headers), **extra)
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
            logger.debug("Kafka sink %s: abort of %r failed: %s", self.sink, self.transactional_id, e)
            return  # dropped as it is: closing would try to abort again
        try:
            producer.close()
        except Exception as e:  # noqa: BLE001 - closing is best effort on this path
            logger.debug("Kafka sink %s: closing %r failed: %s", self.sink, self.transactional_id, e)

    def close(self) -> None:
        """Close the producer (no transaction is open between deliveries)."""
        producer, self._producer, self._delivered = self._producer, None, None
        if producer is not None:
            producer.close()
