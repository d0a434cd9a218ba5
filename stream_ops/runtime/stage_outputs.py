"""Where one task's batch results go: steps 3 and 6 of the commit protocol for every output.

A stage's outputs (shuffles into other stages, sinks) are written per batch as files staged
under (task, txid, epoch), recorded in the ZooKeeper commit and published after it (see
:mod:`stream_ops.topics.staged_output`). Outputs of one stage that share a destination (two
branches into the same keyed stage, a merged stream into one sink) are written as one file,
since a file name is per (task, txid, epoch). Partial aggregates go to a keyed stage as Parquet
files (:class:`~stream_ops.topics.shuffle_files.PartialsShuffle`, ``StageSpec.shuffle_format``),
whole records as JSON lines.

Sinks are written by their kinds (:mod:`stream_ops.sinks`): per sink, the task's
:class:`~stream_ops.topology.sink_kinds.SinkWriter` stages the batch's records and, after the publish,
delivers what the published batches owe (a function sink calls the user's function, a Kafka
sink writes one transaction per batch, ``print`` logs the lines, only as the verified owner and
after the fenced deliveries).

With the shuffle kept in Kafka (the topology's conf, :class:`~stream_ops.kafka.shuffle_options.KafkaShuffle`)
a shuffle is delivered like a Kafka sink: the batch's rows for every queue of the downstream stage
are staged as one delivery batch of the task, published after the commit, then written in one
Kafka transaction, each row to the partition of its queue (:mod:`stream_ops.kafka.shuffle_writer`).
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stream_ops.hashing import encode_key, partition_for, partition_of_encoded
from stream_ops.helpers.field_paths import value_or_none
from stream_ops.operators.aggregators import aggregator_from_spec
from stream_ops.operators.window_partials import PartialRow, WindowPartials
from stream_ops.runtime.stage_processors import progress_row, window_partials_row
from stream_ops.topics.delivery_topic import DeliveryTopic
from stream_ops.topics.file_topic import FileTopic
from stream_ops.topics.shuffle_files import PartialsShuffle
from stream_ops.topics.staged_output import StagedOutput
from stream_ops.topology.layout import TopologyLayout
from stream_ops.topology.plan import PersistSpec, Plan, RecordsSpec, ShuffleSpec, SinkSpec, StageSpec, TaskSpec
from stream_ops.topology.sink_kinds import AfterPublish, SinkContext, SinkWriter
from stream_ops.topology.windows import event_time_of

if TYPE_CHECKING:
    from stream_ops.kafka.shuffle_options import KafkaShuffle
    from stream_ops.kafka.shuffle_writer import ShuffleWriter

logger = logging.getLogger(__name__)

Record = dict[str, Any]
Partial = tuple[str, Any]


class StageOutputs:
    """The outputs of one task: what it stages per batch and what it does after a commit."""

    def __init__(
        self, *, plan: Plan, stage: StageSpec, task: TaskSpec, layout: TopologyLayout, kafka_shuffle: KafkaShuffle | None = None
    ) -> None:
        self.plan = plan
        self.stage = stage
        self.task = task
        self.layout = layout
        self._aggregators = {
            i: aggregator_from_spec(o.aggregator) for i, o in enumerate(stage.outputs) if isinstance(o, ShuffleSpec)
        }
        self._shuffles: dict[int, FileTopic] = {}
        """Downstream stage index -> its shuffle topic of JSON lines (records)."""
        self._partial_shuffles: dict[int, PartialsShuffle] = {}
        """Downstream stage index -> its Parquet partials files (``shuffle_format`` parquet)."""
        self._sinks: dict[str, SinkWriter] = {}
        """Sink name -> this task's writer of it (a sink tapped twice in the stage is one writer)."""
        self.kafka_shuffle = kafka_shuffle
        self._kafka_shuffles: dict[int, DeliveryTopic] = {}
        """Downstream stage index -> the staged batches of the shuffle into it (Kafka shuffle only)."""
        self._shuffle_writers: dict[int, ShuffleWriter] = {}
        self.event_times_sent: dict[int, float] = {}
        """Window stage index -> the largest event time the last staged batch sent it."""
        for shuffle in stage.shuffles:
            to_stage = plan.stage(shuffle.to_stage)
            if kafka_shuffle is None and isinstance(shuffle, ShuffleSpec) and to_stage.shuffle_format == "parquet":
                value_type = to_stage.input_fields["value"]
                self._partial_shuffles[shuffle.to_stage] = PartialsShuffle(layout.shuffle_topic(to_stage), value_type)
            elif kafka_shuffle is None:
                self._shuffles[shuffle.to_stage] = layout.shuffle_topic(to_stage)
            else:
                self._kafka_shuffles[shuffle.to_stage] = layout.shuffle_delivery_topic(stage, to_stage)
        context = SinkContext(layout=layout, stage=stage, task=task)
        for sink in stage.outputs_of(SinkSpec):
            if sink.name not in self._sinks:
                self._sinks[sink.name] = sink.sink_kind.writer(sink, context)

    def staged_outputs(self) -> list[StagedOutput]:
        """Every output this task stages files in (the dead-letter topic included)."""
        outputs: list[StagedOutput] = [self.layout.dead_letter_topic()]
        outputs += self._shuffles.values()
        outputs += self._partial_shuffles.values()
        outputs += self._kafka_shuffles.values()
        for writer in self._sinks.values():
            outputs += writer.staged_outputs()
        return outputs

    # --- step 3 --------------------------------------------------------------------------------

    def stage_batch(
        self,
        txid: int,
        epoch: int,
        records: dict[int, list[Record]],
        partials: dict[int, list[Partial]],
        dead: list[Record],
        emitted: dict[int, list[Record]] | None = None,
        *,
        window_partials: dict[int, WindowPartials] | None = None,
    ) -> int:
        """Stage the batch's files for every output except partition_persist; returns the rows
        written. ``records`` are per output index; ``partials`` hold the partial aggregates of
        partials outputs Spark computed already (others are computed here from ``records``);
        ``emitted`` are the records a partition_persist updater emitted, per output index;
        ``window_partials`` the partials per (window, key) a records output sends an event-time
        window stage besides its records. The largest event time the batch sent to each such
        stage is kept in :attr:`event_times_sent` until the next batch."""
        self.event_times_sent = {}
        shuffle_lines: dict[int, dict[int, list[Record]]] = defaultdict(lambda: defaultdict(list))
        partial_columns: dict[int, dict[int, tuple[list[str], list[Any]]]] = defaultdict(lambda: defaultdict(lambda: ([], [])))
        sink_records: dict[str, list[Record]] = defaultdict(list)
        for index, output in enumerate(self.stage.outputs):
            if isinstance(output, ShuffleSpec):
                pairs = partials[index] if index in partials else self._partials_of(index, records.get(index, []), dead)
                if output.to_stage in self._partial_shuffles:
                    columns = partial_columns[output.to_stage]
                    # Partials' keys are encode_key's canonical text: their queue is read off the
                    # text, without decoding and encoding each key again.
                    for key, value in pairs:
                        keys, values = columns[partition_of_encoded(key, output.queues)]
                        keys.append(key)
                        values.append(value)
                    continue
                for key, value in pairs:
                    queue = partition_of_encoded(key, output.queues)
                    shuffle_lines[output.to_stage][queue].append({"key": key, "value": value})
            elif isinstance(output, RecordsSpec):
                windowed = (window_partials or {}).get(index)
                self._shuffle_records(output, records.get(index, []), shuffle_lines[output.to_stage], windowed)
            elif isinstance(output, PersistSpec) and output.emits is not None:
                self._shuffle_records(output.emits, (emitted or {}).get(index, []), shuffle_lines[output.emits.to_stage])
            elif isinstance(output, SinkSpec):
                sink_records[output.name].extend(records.get(index, []))
        rows = 0
        for to_stage, by_column in partial_columns.items():
            for queue, (keys, values) in sorted(by_column.items()):
                self._partial_shuffles[to_stage].stage_batch(queue, self.task.task_id, txid, epoch, keys, values)
                rows += len(keys)
        for to_stage, by_queue in shuffle_lines.items():
            if to_stage in self._kafka_shuffles:
                rows += self._stage_kafka_shuffle(to_stage, txid, epoch, by_queue)
                continue
            for queue, lines in sorted(by_queue.items()):
                self._shuffles[to_stage].stage_batch(queue, self.task.task_id, txid, epoch, lines)
                rows += len(lines)
        for name, batch in sink_records.items():
            rows += self._stage_sink(name, txid, epoch, batch)
        return rows

    def _shuffle_records(
        self,
        spec: RecordsSpec,
        records: list[Record],
        by_queue: dict[int, list[Record]],
        partials: WindowPartials | None = None,
    ) -> None:
        """Whole records to a records stage, by their key fields (without any: to the queue of
        the same number as this task's, modulo the queues, so partitions stay apart), and the
        window partials of an event-time window stage to the queue of their key, after them."""
        for record in records:
            key_values = [value_or_none(record, f) for f in spec.key_fields]
            line = {"stream": spec.stream, "key": encode_key(key_values), "record": json.dumps(record, default=str)}
            if spec.broadcast_unkeyed and all(v is None for v in key_values):
                for queue in range(spec.queues):
                    by_queue[queue].append(line)
                continue
            queue = partition_for(key_values, spec.queues) if spec.key_fields else self.task.queue % spec.queues
            by_queue[queue].append(line)
        if partials is not None and partials.rows:
            to_queue: dict[int, list[PartialRow]] = defaultdict(list)
            for row in partials.rows:
                to_queue[partition_of_encoded(row[2], spec.queues) if spec.key_fields else self.task.queue % spec.queues].append(
                    row
                )
            for queue, rows in sorted(to_queue.items()):
                by_queue[queue].append(window_partials_row(rows))
        if spec.progress is not None:
            self._report_progress(spec, records, by_queue, partials.max_event if partials is not None else None)

    def _report_progress(
        self, spec: RecordsSpec, records: list[Record], by_queue: dict[int, list[Record]], partials_max: float | None
    ) -> None:
        """Tell every queue of an event-time window stage the largest event time this batch
        sent to the stage (in its records and its partials, ``partials_max``), so each window
        task's watermark waits for the slowest upstream task (see
        :class:`~stream_ops.topology.windows.Watermark`). Written in the same files as the
        records, so a report is never published before the records it covers."""
        assert spec.progress is not None
        field, unit = spec.progress["timestamp_field"], spec.progress["timestamp_unit"]
        times = [t for t in (event_time_of(r, field, unit) for r in records) if t is not None]
        if partials_max is not None:
            times.append(partials_max)
        if not times:
            return
        largest = max(times)
        self.event_times_sent[spec.to_stage] = max(largest, self.event_times_sent.get(spec.to_stage, largest))
        report = progress_row(self.stage.index, self.task.queue, largest)
        for queue in range(spec.queues):
            by_queue[queue].append(report)

    def _stage_kafka_shuffle(self, to_stage: int, txid: int, epoch: int, by_queue: dict[int, list[Record]]) -> int:
        """Stage the rows for every queue of ``to_stage`` as one delivery batch of this task."""
        from stream_ops.kafka.shuffle_writer import staged_rows

        batch = staged_rows(by_queue)
        if batch:
            self._kafka_shuffles[to_stage].stage_batch(self.task.queue, self.task.task_id, txid, epoch, batch)
        return len(batch)

    def _stage_sink(self, name: str, txid: int, epoch: int, batch: list[Record]) -> int:
        if not batch:
            return 0
        self._sinks[name].stage_batch(txid, epoch, batch)
        return len(batch)

    def _partials_of(self, index: int, records: list[Record], dead: list[Record]) -> list[Partial]:
        """Partial aggregates per key of records computed on the driver; a record the
        aggregator rejects (e.g. a null Sum field) is appended to ``dead`` with the reason."""
        output = self.stage.outputs[index]
        assert isinstance(output, ShuffleSpec)
        aggregator = self._aggregators[index]
        partial: dict[str, Any] = {}
        for record in records:
            try:
                key = encode_key([value_or_none(record, f) for f in output.key_fields])
                value = aggregator.init(record)
                partial[key] = value if key not in partial else aggregator.combine(partial[key], value)
            except Exception as e:  # noqa: BLE001 - a bad field value must not stop the task
                dead.append({"record": record, "error": f"partials: {type(e).__name__}: {e}"})
        return list(partial.items())

    # --- step 6, after the publish --------------------------------------------------------------

    def after_publish(
        self, committed_txid: int, *, epoch: int | None = None, verify_owner: Callable[[], object] | None = None
    ) -> None:
        """Deliver what the published batches owe: function and Kafka sinks (every published
        batch of this task not yet delivered, oldest first), Kafka shuffles likewise, and the
        ``print`` sinks' records.

        Args:
            committed_txid: the task's committed txid as its caller, the owner, committed it:
                no batch above it is logged (only a newer owner can have published one).
            epoch: the caller's owner epoch: a ``print`` batch is marked logged under it, so the
                marker of an owner superseded meanwhile moves nothing
                (:meth:`~stream_ops.topics.delivery_topic.DeliveryTopic.mark_delivered`).
            verify_owner: raises (``OwnershipLostError``) when the caller no longer owns the
                task; called once before the first line is logged, so a superseded owner logs
                nothing.
        """
        for to_stage, shuffle_topic in self._kafka_shuffles.items():
            self._deliver_shuffle(to_stage, shuffle_topic, epoch)
        publish = AfterPublish(committed_txid=committed_txid, epoch=epoch, verify_owner=_once(verify_owner))
        # Fenced deliveries (functions, Kafka) first, then what no marker fences (the log).
        for writer in sorted(self._sinks.values(), key=lambda w: w.delivers_unfenced):
            writer.after_publish(publish)

    def _deliver_shuffle(self, to_stage: int, topic: DeliveryTopic, epoch: int | None) -> None:
        """Deliver this task's published, undelivered shuffle batches into ``to_stage``'s topic.
        The writer starts (fencing the task's earlier owners' producers) at the first pass."""
        writer = self._shuffle_writers.get(to_stage)
        if writer is None:
            from stream_ops.kafka.shuffle_writer import ShuffleWriter  # confluent-kafka, only with a Kafka shuffle

            assert self.kafka_shuffle is not None
            target = self.plan.stage(to_stage)
            writer = ShuffleWriter(
                self.kafka_shuffle,
                topology_id=self.layout.topology_id,
                stage_index=target.index,
                stage_name=target.name,
                queues=target.queues,
                task_id=self.task.task_id,
            )
            self._shuffle_writers[to_stage] = writer
        if writer.delivered_txid is None:
            writer.start()
        queue, task_id = self.task.queue, self.task.task_id
        for batch in topic.published(queue, task_id):
            records = topic.read_batch(batch)
            if records is None:
                continue  # delivered and removed meanwhile by a stale owner
            writer.deliver(batch.txid, records)
            topic.mark_delivered(queue, task_id, batch.txid, epoch=epoch, path=batch.path)
            logger.debug("shuffle into stage %d: txid %d of task %d delivered", to_stage, batch.txid, task_id)

    def close(self) -> None:
        """Close the Kafka producers of this task's shuffles and sinks (none is mid-transaction
        between batches)."""
        for writer in self._shuffle_writers.values():
            writer.close()
        for sink in self._sinks.values():
            sink.close()


def _once(verify_owner: Callable[[], object] | None) -> Callable[[], None]:
    """``verify_owner`` called at most once (None: nothing to verify)."""
    verified = verify_owner is None

    def verify() -> None:
        nonlocal verified
        if not verified:
            assert verify_owner is not None
            verify_owner()
            verified = True

    return verify
