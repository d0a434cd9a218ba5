"""The exactly-once Kafka sink: a task's committed batches, each delivered in one Kafka transaction.

``Stream.to_kafka(...)`` is a delivery sink (:mod:`stream_ops.topics.delivery_topic`): a batch's
records are staged under (task, txid, epoch) in step 3 of the commit protocol, recorded in the
ZooKeeper commit (step 5) and published after it (step 6), like a function sink's. The task then
hands every published, undelivered batch, oldest first, to :meth:`KafkaSinkWriter.deliver` (the
batch just published, kept in memory as its messages, to :meth:`KafkaSinkWriter.deliver_parts`:
the same bytes, :mod:`stream_ops.sinks.kafka`), and marks it delivered (``.delivered-t<task>-v<version>.json``) once that returned. That path alone is at-least-once
per txid: a crash between the delivery and the marker delivers the batch again. The writer makes
the second delivery a no-op:

The delivery machinery (fencing, the progress record, the transaction per batch) is
:class:`~stream_ops.kafka.transactions.TransactionalBatchWriter`, shared with the shuffle between
stages kept in Kafka (:mod:`stream_ops.kafka.shuffle_writer`); the argument below holds for both.

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

from collections.abc import Mapping, Sequence
from typing import Any

from stream_ops.errors import KafkaSinkError
from stream_ops.kafka.client import ensure_topic, topic_partitions
from stream_ops.kafka.sink_options import KafkaSinkSpec, resolve_config, transactional_id
from stream_ops.kafka.sink_records import MessageParts, batch_headers, message_parts, messages_of
from stream_ops.kafka.transactions import TransactionalBatchWriter


class KafkaSinkWriter(TransactionalBatchWriter):
    """Delivers one task's committed batches of one Kafka sink, each exactly once (module docstring).

    Args:
        spec: the sink's options.
        topology_id: the submitted topology.
        sink: the sink's name.
        task_id: the task.
        timeout_s: how long one Kafka operation (fencing, reading the progress, a commit) may take.
    """

    def __init__(self, spec: KafkaSinkSpec, *, topology_id: str, sink: str, task_id: int, timeout_s: float = 30.0) -> None:
        super().__init__(
            bootstrap=spec.bootstrap,
            config=resolve_config(spec.config),
            transactional_id=transactional_id(spec.transactional_id_prefix, topology_id, sink, task_id),
            progress_topic=spec.progress_topic,
            replication_factor=spec.replication_factor,
            topology_id=topology_id,
            output=sink,
            task_id=task_id,
            timeout_s=timeout_s,
        )
        self.spec = spec
        self.sink = sink

    def _prepare_topics(self) -> None:
        """The output topic must exist, or is created when the spec gives its partitions."""
        spec = self.spec
        if spec.partitions is None:
            if topic_partitions(spec.bootstrap, spec.topic, config=self.config, timeout_s=self.timeout_s) is None:
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
                config=self.config,
                timeout_s=self.timeout_s,
            )

    def deliver(self, txid: int, records: Sequence[Mapping[str, Any]]) -> bool:
        """Write batch ``txid`` in one transaction unless Kafka has it already; returns whether it wrote.

        Raises:
            KafkaSinkFencedError: a newer owner's producer fenced this one (nothing of the
                transaction becomes visible).
            KafkaSinkError: Kafka refused the transaction or did not answer; the outcome is
                settled when the next writer starts.
        """
        return self.deliver_parts(txid, message_parts(records, key=self.spec.key, value=self.spec.value))

    def deliver_parts(self, txid: int, parts: Sequence[MessageParts]) -> bool:
        """:meth:`deliver` for the batch's messages' (key, value) already encoded
        (:func:`~stream_ops.kafka.sink_records.message_parts`)."""
        headers = batch_headers(self.topology_id, self.task_id, txid)
        return self.deliver_messages(txid, messages_of(parts, headers), self.spec.topic)
