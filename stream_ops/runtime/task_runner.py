"""One task of one topology running on this worker as a Spark streaming query.

``TaskRunner.process_batch`` is the commit protocol of DESIGN section 5, the same for every
stage kind (txid n, owner epoch e):

  1. if ZooKeeper already records n as committed (Spark re-delivers a batch after a crash
     between our commit and its own), check that Spark planned the same input files as the
     commit recorded (else stop: the checkpoint fell behind ZooKeeper), change nothing,
     publish the files the committing owner staged for n, and return;
  2. compute the batch: a source stage runs its operations and partial aggregation in Spark;
     a keyed stage combines the shuffled partials per key (Spark) and applies them to its map
     state with Trident's txid rules; join / process / partition stages run their processor
     and operations on the collected rows;
  3. stage the output files (shuffle, dead letters) named (task, n, e) where no reader sees
     them, fsynced; a partition_persist user State gets ``begin_commit(n)`` and the updates;
  4. append the batch's state changes to the state topic as (task, n, e), fsynced, an empty
     file when nothing changed (on Kafka: its records and end record, acknowledged by all
     in-sync replicas, see :mod:`stream_ops.state.kafka_state_topic`);
  5. ZooKeeper commit transaction (checks ownership; refused for a zombie and once the task
     is stopping), recording the staged files' sizes and the input files' fingerprint: one
     multi-op, one round trip; the fingerprint and offsets are read from Spark's checkpoint
     while Spark computes the batch (they are logged before ``foreachBatch`` runs);
  6. ``commit(n)`` of a user State, publish the staged files (rename into the queues, checked
     against what step 5 recorded), ``map_state.commit(n)``; and, on the task's I/O thread,
     the state changes and the applied marker (n, e) are written to RocksDB in one synced
     write batch, overlapping steps 6 and the next batch's Spark work. The next batch (and a
     stop) waits for that write before it touches the state. A write that fails is repaired
     at once on that thread: the committed batch is re-applied from the state topic
     (:meth:`~stream_ops.runtime.task_state.TaskState.catch_up`); when that fails too, the
     task fails (:meth:`TaskRunner.is_running` turns False, the worker records it).

A crash before 5 leaves only files no reader accepts (staged, or state-topic entries of an
uncommitted txid / lower epoch); a crash after 5 is finished when the task starts again
(it publishes the committed batch's files) and by step 1 of the replay. Because every file
is durable before step 5, this holds for an OS crash or power loss as well as for a process
crash, on storage that honours fsync; files lost anyway stop the task with an error
(:class:`~stream_ops.errors.CommittedBatchLostError`, :class:`~stream_ops.errors.ReplayError`)
instead of silently dropping a batch.

Why RocksDB is written after the commit, not overlapped with the state-topic append: the
local store must never hold a batch the state topic lacks, unless the next start rebuilds it.
Written after step 5, RocksDB is at most the committed state, so a failure of either write
costs little: a state-topic append that fails commits nothing and RocksDB is untouched; a
RocksDB write that fails or is cut short by a crash (a write batch applies whole or not at
all) leaves the store at an earlier committed marker, which the next start catches up from
the state-topic tail (:func:`~stream_ops.runtime.task_state.open_task_state`); the running
task catches it up the same way at once, or fails
(:class:`~stream_ops.errors.StateStoreBehindError`). Written before or alongside step 4, the
store could be ahead of the state topic and of ZooKeeper: a crash or a refused commit there
means a full rebuild at the next start, and state queries would need a copy of every
overwritten value to stay read-committed. Here they read RocksDB as it is: it never holds an
uncommitted batch, and a lookup waits for a committed batch's write in flight.
A lookup never answers from a store behind the committed txid: while that write is slower than
``commit_wait_s``, is being caught up, or failed for good (and while ZooKeeper is not connected,
so the task may have a new owner), it refuses with the retryable
:class:`~stream_ops.errors.StateNotReadyError`.

A ``print`` sink's records are staged and published like a function sink's batch
(:mod:`stream_ops.runtime.stage_outputs`): logged after the commit, by the owner that still owns
the task, and by the next owner when the process died before it logged them.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from stream_ops.config import QueryConfig
from stream_ops.coordination.cluster_state import read_storm
from stream_ops.coordination.records import BatchInput
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import (
    InputMismatchError,
    OwnershipLostError,
    StateError,
    StateNotReadyError,
    StateStoreBehindError,
    TaskStoppingError,
    ZooKeeperUnavailableError,
)
from stream_ops.helpers.field_paths import value_or_none
from stream_ops.kafka.shuffle_options import KafkaShuffle
from stream_ops.nimbus.compaction import compact_queue_locked
from stream_ops.operators.aggregators import Count, Max, Min, Sum, aggregator_from_spec
from stream_ops.operators.record_pipeline import as_fields, run_batch
from stream_ops.operators.trident_state import Collector, State
from stream_ops.runtime.ownership import Ownership, acquire, commit, release, verify_owner
from stream_ops.runtime.stage_outputs import StageOutputs
from stream_ops.runtime.stage_processors import TICK_STREAM, StageProcessor, make_processor
from stream_ops.runtime.state_reader import StateReader
from stream_ops.runtime.task_state import TaskState, open_task_state
from stream_ops.sources import SourceLag, source_kind
from stream_ops.sources.base import files_newer_than
from stream_ops.spark.checkpoint import batch_input, batch_offsets, latest_file_timestamp, remove_crashed_writes
from stream_ops.spark.compiler import keyed_batch, records_batch, source_batch, start_stage_query
from stream_ops.spark.shuffle_queue import (
    next_tick_stamp,
    offset_txids,
    planned_txids,
    read_before,
    retire_read,
    shuffle_suffix,
    tick_file_name,
    tick_file_prefix,
    unread_files,
)
from stream_ops.state.auto_snapshot import AutoSnapshot, SnapshotPolicy
from stream_ops.state.column_update import add_int_partials
from stream_ops.state.key_texts import decode_key_texts
from stream_ops.state.map_states import OpaqueMapState, TransactionalMapState
from stream_ops.state.rocksdb_backing import RocksDBBackingMap
from stream_ops.state.state_log import open_state_log
from stream_ops.state.state_topic import encode_changes
from stream_ops.state.value_columns import ChangeColumns
from stream_ops.topics.file_topic import batch_file_name
from stream_ops.topics.shuffle_files import shuffle_file_rows
from stream_ops.topics.staged_output import StagedOutput
from stream_ops.topology.functions import resolve_object
from stream_ops.topology.layout import TopologyLayout
from stream_ops.topology.plan import PersistSpec, Plan, ShuffleSpec, StageSpec, TaskSpec

if TYPE_CHECKING:
    from stream_ops.kafka.shuffle_ticks import TickProducer

logger = logging.getLogger(__name__)

_RAISED = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception): ")

CATCH_UP_ATTEMPTS = 3
"""Tries at catching the store up from the state topic after a committed batch's write failed,
0.2 s then 0.4 s apart, before the task fails (:class:`~stream_ops.errors.StateStoreBehindError`)."""

COMMIT_STEPS = ("state_topic", "zookeeper", "publish", "rocksdb")
"""The parts of the commit path :attr:`TaskStats.commit_steps_ms` times; the RocksDB write runs
on the task's I/O thread after the ZooKeeper commit (module docstring)."""


@dataclass
class TaskStats:
    """Counters a task reports in its heartbeats."""

    batches: int = 0
    rows_in: int = 0
    rows_out: int = 0
    dead_letters: int = 0
    rows_per_s: float = 0.0
    rows_out_per_s: float = 0.0
    txid_in_flight: int | None = None
    last_batch_at: float | None = None
    last_batch_ms: float = 0.0
    spark_ms_total: float = 0.0
    """Time spent in Spark's part of step 2 (the batch's jobs and collecting their rows) over all batches."""
    state_ms_total: float = 0.0
    """Time spent applying batches to the task's state or processor (step 2 on the driver) over all batches."""
    commit_ms_total: float = 0.0
    """Time the batch thread spent in the commit path (state topic, ZooKeeper, publish) over all batches."""
    stage_ms_total: float = 0.0
    """Time spent writing staged output files (shuffle, dead letters, persisted tuples) over all batches."""
    commit_steps_ms: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COMMIT_STEPS, 0.0))
    """The commit path by step: state topic, ZooKeeper, publish (these sum to ``commit_ms_total``)
    and RocksDB (on the task's I/O thread, overlapping the publish and the next batch)."""
    started_at: float = field(default_factory=time.time)


@dataclass
class _Batch:
    """What step 2 computed for one batch, filled in as the steps go."""

    rows_in: int
    records: list[dict[str, Any]] = field(default_factory=list)
    """The records at the stage's input tap, when its operations run on the driver."""
    outputs: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    """Records per stage output index."""
    output_partials: dict[int, list[tuple[str, Any]]] = field(default_factory=dict)
    """Partial aggregates Spark computed per partials output."""
    partials: list[tuple[str, Any]] = field(default_factory=list)
    """(encoded key, partial aggregate) a keyed stage applies to its state."""
    dead: list[dict[str, Any]] = field(default_factory=list)
    side: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Records of the processor's named side streams (late records, named output streams)."""
    rows: list[tuple[str, str | None, dict[str, Any]]] = field(default_factory=list)
    """The shuffled (stream, key, record) rows a records stage's processor reads."""
    driver_operations: bool = False
    """Whether the stage's record operations still have to run on the driver."""
    updated_keys: int = 0


@dataclass(frozen=True)
class RunnerSettings:
    """How a worker runs its tasks' queries."""

    trigger_seconds: float = 1.0
    """Trigger interval of a task that reads a source."""
    shuffle_trigger_seconds: float = 1.0
    """Trigger interval of a task that reads a shuffle: the batch its upstream committed waits
    for its next trigger, and a trigger that finds nothing costs JVM CPU."""
    max_files_per_trigger: int = 100
    commit_wait_s: float = 10.0
    max_file_age: str = "7d"
    """Spark's ``maxFileAge`` for a task's input: files older than the newest file seen by more
    than this are skipped (published batches are touched, so this concerns landed source files)."""
    stop_wait_s: float = 30.0
    """How long :meth:`TaskRunner.stop` waits for a running batch before closing under it."""
    query: QueryConfig | None = None
    """The worker's state-query token and TLS CA, for ``state_query`` lookups on other workers."""
    snapshot_policy: SnapshotPolicy = field(default_factory=SnapshotPolicy)
    """When the task snapshots its state-topic queue by itself (the topology's conf)."""


class TaskRunner:
    """Owns one task and runs its streaming query.

    Args:
        zk: ZooKeeper access (shared by the worker's runners; kazoo is thread-safe).
        spark: the worker's SparkSession.
        layout: paths of the topology.
        plan: the topology's plan.
        task: the task to run.
        worker_id: this worker's ``host:port``.
        settings: trigger and batching settings.
        connected: set while the ZooKeeper session is connected; commits wait for it
            (SUSPENDED pauses work).
    """

    def __init__(
        self,
        *,
        zk: ZkStore,
        spark: SparkSession,
        layout: TopologyLayout,
        plan: Plan,
        task: TaskSpec,
        worker_id: str,
        settings: RunnerSettings,
        connected: threading.Event,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.zk = zk
        self.spark = spark
        self.layout = layout
        self.plan = plan
        self.task = task
        self.stage: StageSpec = plan.stage(task.stage)
        self.worker_id = worker_id
        self.settings = settings
        self.connected = connected
        self.clock = clock
        self.stats = TaskStats()
        self.ownership: Ownership | None = None
        self.state: TaskState | None = None
        self.processor: StageProcessor | None = None
        self.user_state: State | None = None
        self._state_reader: StateReader | None = None
        self._last_tick = 0.0
        self.query: StreamingQuery | None = None
        self._batch_lock = threading.Lock()
        # Held while a batch touches the task's state (steps 2-6 after Spark's part) and by
        # stop() while it closes the state: once the state is closed no batch can touch it or
        # commit, and no batch runs on a closed state.
        self._commit_lock = threading.RLock()
        self._auto_snapshot: AutoSnapshot | None = None
        # One I/O thread per task: reads the batch's checkpoint entries while Spark computes,
        # and writes a committed batch to RocksDB after the ZooKeeper commit.
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"task-{task.task_id}-io")
        self._checkpoint_entries: tuple[int, Future[tuple[list[Any], BatchInput | None]]] | None = None
        self._state_write: Future[None] | None = None
        self._state_write_failed: BaseException | None = None
        self._ownership_lost: OwnershipLostError | None = None
        self._appended: tuple[int, int] | None = None
        # (txid, keys, their shuffled key texts) of the map-state update, for the commit's encoding
        self._key_texts: tuple[int, list[tuple[Any, ...]], list[str]] | None = None
        # (txid, changes) of a column-wise map-state update, which bypasses the store's buffer
        self._column_changes: tuple[int, ChangeColumns] | None = None
        self._stopping = threading.Event()
        self._last_input_ms = 0
        self._aggregator = aggregator_from_spec(self.stage.state.aggregator) if self.stage.state else None
        self.outputs = StageOutputs(plan=plan, stage=self.stage, task=task, layout=layout)
        self.kafka_shuffle: KafkaShuffle | None = None
        """The topology's shuffle between stages when its conf keeps it in Kafka (set by :meth:`prepare`)."""
        self._ticks: TickProducer | None = None

    @property
    def topology_id(self) -> str:
        return self.layout.topology_id

    @property
    def key(self) -> tuple[str, int]:
        return self.topology_id, self.task.task_id

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Take ownership, prepare state, start the query (TaskBusyError if still owned)."""
        self.prepare()
        try:
            self.start_query()
        except BaseException:
            self._close_state()
            assert self.ownership is not None
            release(self.zk, self.ownership)
            raise

    def prepare(self) -> None:
        """Take ownership under a new epoch and open (or rebuild) the task's state."""
        self.ownership = acquire(self.zk, self.topology_id, self.task.task_id, self.worker_id, clock=self.clock)
        try:
            self._choose_shuffle()
            self._prepare_state()
        except BaseException:
            self._close_state()
            release(self.zk, self.ownership)
            raise

    def _choose_shuffle(self) -> None:
        """Files or Kafka between the stages, as the topology's conf says (ConfigError if malformed)."""
        self.kafka_shuffle = KafkaShuffle.from_conf(read_storm(self.zk, self.topology_id).conf)
        if self.kafka_shuffle is not None:
            self.outputs = StageOutputs(
                plan=self.plan, stage=self.stage, task=self.task, layout=self.layout, kafka_shuffle=self.kafka_shuffle
            )

    def _shuffle_topic_name(self) -> str:
        """This stage's Kafka shuffle topic (with the Kafka shuffle only)."""
        assert self.kafka_shuffle is not None
        return self.kafka_shuffle.topic_name(self.topology_id, self.stage.index, self.stage.name)

    def _prepare_state(self) -> None:
        assert self.ownership is not None
        committed = self.ownership.committed
        # Our predecessors' staged files that no commit will ever publish, and temp files a
        # crashed writer left, are dropped; the committed batch's are published now (step 6
        # of a commit whose owner died before it). Only epochs below ours are touched, and
        # only after checking we still own the task: a stale owner that resumes here never
        # deletes a newer owner's files.
        verify_owner(self.zk, self.ownership)
        keep = (committed.committed_txid, committed.committed_epoch) if committed.committed_txid >= 0 else None
        topics = self._output_topics()
        if self.stage.keeps_state:
            topics.append(self.layout.state_topic(self.stage))
        if self.stage.persist is not None:
            topics.append(self.layout.persist_topic(self.stage))
        for topic in topics:
            topic.discard_staged(self.task.task_id, below_epoch=self.ownership.epoch, keep=keep)
        if not self.stage.reads_source:
            self.layout.shuffle_topic(self.stage).discard_stale_temp_files(
                self.task.queue, tick_file_prefix(self.task.task_id), older_than_s=60.0, now=time.time()
            )
        if keep is not None:
            self._publish(*keep)
            # sinks: batches published but not yet delivered (a print of a batch our predecessor committed)
            self._after_publish(keep[0])
        stage = self.stage
        if stage.keeps_state:
            started = time.monotonic()
            log = open_state_log(
                read_storm(self.zk, self.topology_id).conf,
                file_topic=self.layout.state_topic(stage),
                queue=self.task.queue,
                topology_id=self.topology_id,
                stage_index=stage.index,
                stage_name=stage.name,
            )
            self.state = open_task_state(
                store_dir=self.layout.local_store_dir(self.worker_id, self.task.task_id),
                log=log,
                kind=stage.state.kind if stage.state is not None else None,
                committed_txid=committed.committed_txid,
                committed_epoch=committed.committed_epoch,
                snapshot_dir=self.layout.snapshot_dir(stage, self.task.queue),
            )
            self._auto_snapshot = AutoSnapshot(
                self.settings.snapshot_policy, self._snapshot_own_queue, name=f"task {self.topology_id}/{self.task.task_id}"
            )
            if self.state.rebuilt:
                logger.info(
                    "task %s/%d: state rebuilt from the state topic, %d keys in %.3f s",
                    self.topology_id,
                    self.task.task_id,
                    self.state.restored_keys,
                    time.monotonic() - started,
                )
            else:
                logger.info(
                    "task %s/%d: kept the local state store (no rebuild), applied the state-topic tail only: "
                    "%d changed keys in %.3f s",
                    self.topology_id,
                    self.task.task_id,
                    self.state.tail_keys or 0,
                    time.monotonic() - started,
                )
        self.processor = make_processor(stage, self.state.store if self.state else None, self.clock())
        if stage.persist is not None:
            factory = resolve_object(stage.persist.factory)
            self.user_state = factory.make_state(self.task.queue, stage.queues)
            if keep is not None:
                self._finish_user_state_commit(*keep)
        if any(op.kind == "state_query" for op in stage.operations):
            self._state_reader = StateReader(self.zk, self.topology_id, self.plan, query_config=self.settings.query)

    def maybe_tick(self, now: float) -> bool:
        """Write a tick record into this task's input when its time-based windows or triggers
        need a batch although no data arrives; returns whether one was written."""
        interval = getattr(self.processor, "tick_interval_s", None)
        if interval is None or now - self._last_tick < interval:
            return False
        self._last_tick = now
        tick = {"stream": TICK_STREAM, "key": None, "record": "{}"}
        if self.kafka_shuffle is not None:
            if self._ticks is None:
                from stream_ops.kafka.shuffle_ticks import TickProducer  # confluent-kafka, only with a Kafka shuffle

                self._ticks = TickProducer(self.kafka_shuffle, self._shuffle_topic_name())
            self._ticks.send(self.task.queue, tick)
            return True
        topic = self.layout.shuffle_topic(self.stage)
        stamp = next_tick_stamp(self.layout.checkpoint_dir(self.task.task_id), time.time_ns())
        topic.write_file(self.task.queue, tick_file_name(self.task.task_id, stamp), [tick])
        return True

    def start_query(self) -> None:
        """Start the task's Spark streaming query; its batches call :meth:`process_batch`.

        Raises:
            OwnershipLostError: the task was taken over since :meth:`prepare` (the query runs
                on the shared checkpoint only while we own the task).
        """
        assert self.ownership is not None
        verify_owner(self.zk, self.ownership)
        checkpoint = self.layout.checkpoint_dir(self.task.task_id)
        remove_crashed_writes(checkpoint)
        self._last_input_ms = latest_file_timestamp(checkpoint)
        kafka_input = None
        if self.kafka_shuffle is not None and not self.stage.reads_source:
            from stream_ops.kafka.shuffle_reader import KafkaShuffleInput
            from stream_ops.kafka.shuffle_writer import ensure_shuffle_topic

            kafka_input = KafkaShuffleInput(self.kafka_shuffle, self._shuffle_topic_name())
            # Created here too, so Spark never meets a missing topic (nor auto-creates a wrong one).
            ensure_shuffle_topic(self.kafka_shuffle, kafka_input.topic, self.stage.queues, self.kafka_shuffle.client_config())
        self.query = start_stage_query(
            self.spark,
            stage=self.stage,
            queue=self.task.queue,
            input_dir=self.input_dir,
            checkpoint_dir=checkpoint,
            query_name=f"{self.topology_id}-task{self.task.task_id}-e{self.ownership.epoch}",
            on_batch=self.process_batch,
            trigger_seconds=(self.settings.trigger_seconds if self.stage.reads_source else self.settings.shuffle_trigger_seconds),
            max_files_per_trigger=self.settings.max_files_per_trigger,
            max_file_age=self.settings.max_file_age,
            kafka_input=kafka_input,
            wake_producers=sum(self.plan.stages[index].queues for index in self.stage.from_stages),
        )

    @property
    def input_dir(self) -> Path | None:
        """The directory this task's query reads (None for a source that is not files)."""
        return self.layout.input_dir(self.stage, self.task.queue)

    def is_running(self) -> bool:
        """True while the query is active and the task's state is sound (a committed batch's
        store write that could not be repaired fails the task at once)."""
        return self._state_write_failed is None and self.query is not None and self.query.isActive

    def failure(self) -> str | None:
        """Why the task stopped running, if it failed."""
        failed = self._state_write_failed
        if failed is not None:
            return f"{type(failed).__name__}: {failed}"[:1000]
        if self.query is None:
            return None
        exc = self.query.exception()
        if exc is None:
            return None
        lines = str(exc).splitlines()
        # A foreachBatch error comes wrapped in Py4J's and Spark's text; name the Python one.
        raised = next((line for line in reversed(lines) if _RAISED.match(line)), None)
        return (raised or lines[0])[:1000]

    def stop(self, *, release_ownership: bool = True, wait_s: float | None = None) -> None:
        """Stop the query, close the state and (if we still can) release the task.

        Args:
            release_ownership: delete our owner node, so the task can move at once.
            wait_s: how long to wait for a running batch (default ``settings.stop_wait_s``).
                When a batch still holds the commit lock after that (e.g. waiting for
                ZooKeeper to commit), the state is left open rather than waited for: the
                caller is shutting the process down, which is as safe as a SIGKILL.
        """
        deadline = time.monotonic() + (self.settings.stop_wait_s if wait_s is None else wait_s)
        self._stopping.set()
        if self.query is not None:
            try:
                self.query.stop()
            except Exception as e:  # noqa: BLE001 - a failed query still has to be cleaned up
                logger.warning("task %s/%d: stopping query: %s", self.topology_id, self.task.task_id, e)
        # Wait for a batch callback that may still be running in its Python thread; if it
        # outlasts the wait, close under it: the commit lock makes its commit either finish
        # before the state closes or refuse (the task is stopping), never run on a closed state.
        if self._batch_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            self._batch_lock.release()
        else:
            logger.warning(
                "task %s/%d: a batch still runs after the stop wait; closing its state, its commit will be refused",
                self.topology_id,
                self.task.task_id,
            )
        if self._commit_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            try:
                self._close_state()
                self._io.shutdown(wait=False)
            finally:
                self._commit_lock.release()
        else:
            logger.warning(
                "task %s/%d: a batch holds the commit lock (ZooKeeper unreachable?); leaving its state to the process exit",
                self.topology_id,
                self.task.task_id,
            )
        self._close_producers()
        if release_ownership and self.ownership is not None:
            release(self.zk, self.ownership)
        logger.info("task %s/%d stopped on %s", self.topology_id, self.task.task_id, self.worker_id)

    def _close_producers(self) -> None:
        """Close the task's Kafka producers (shuffles, sinks, ticks); best effort on the way out."""
        try:
            self.outputs.close()
        except Exception as e:  # noqa: BLE001 - a stopping task must still release its ownership
            logger.warning("task %s/%d: closing Kafka producers: %s", self.topology_id, self.task.task_id, e)
        if self._ticks is not None:
            self._ticks.close()
            self._ticks = None

    def _close_state(self) -> None:
        try:
            self._await_state_write()
        except StateError as e:
            logger.warning("task %s/%d: %s", self.topology_id, self.task.task_id, e)
        if self.state is not None:
            self.state.close()
            self.state = None
        if self.user_state is not None:
            self.user_state.close()
            self.user_state = None
        if self._state_reader is not None:
            self._state_reader.close()
            self._state_reader = None
        self.processor = None

    # --- per batch -------------------------------------------------------------------------

    def process_batch(self, df: DataFrame, batch_id: int) -> None:
        """``foreachBatch`` callback: run and commit batch ``batch_id`` (the txid).

        Each step of the commit protocol (module docstring) is one call.
        """
        with self._batch_lock:
            if self._stopping.is_set():
                raise TaskStoppingError(
                    f"task {self.topology_id}/{self.task.task_id} is stopping; batch {batch_id} left for replay"
                )
            assert self.ownership is not None
            txid = int(batch_id)
            self.stats.txid_in_flight = txid
            started = time.monotonic()
            # Step 1
            if self._already_committed(txid):
                self.stats.txid_in_flight = None
                return
            # Step 5's checkpoint reads, on the I/O thread while Spark computes the batch
            self._checkpoint_entries = (txid, self._io.submit(self._read_checkpoint_entries, txid))
            # Step 2, Spark's part (outside the commit lock: a stop need not wait for it)
            spark_started = time.perf_counter()
            batch = self._compute_in_spark(df)
            self.stats.spark_ms_total += (time.perf_counter() - spark_started) * 1000.0
            with self._state_section(txid):
                rows_out = self._commit_batch(batch, txid)
            self._record_stats(batch.rows_in, rows_out, time.monotonic() - started)

    def _commit_batch(self, batch: _Batch, txid: int) -> int:
        """Steps 2 (the driver's part) to 6 for a batch Spark computed, under the commit lock;
        returns the number of output rows."""
        assert self.ownership is not None
        epoch = self.ownership.epoch
        # The previous batch's RocksDB write must be done before this one reads the state.
        self._await_state_write()
        # Step 2, the part that reads and updates the task's state
        state_started = time.perf_counter()
        self._compute_on_state(batch, txid)
        self.stats.state_ms_total += (time.perf_counter() - state_started) * 1000.0
        # Step 3
        rows_out = self._stage_outputs(batch, txid, epoch)
        commit_started = time.perf_counter()
        # Step 4
        encoded = self._append_state_changes(txid, epoch)
        zookeeper_started = time.perf_counter()
        # Step 5. From here a state query waits until the store holds this batch (or the commit
        # failed), so it never reads the store behind a commit ZooKeeper already shows.
        visible: Future[None] = Future()
        self._state_write = visible
        try:
            self._commit_to_zookeeper(txid, batch.rows_in)
        except BaseException as e:
            if isinstance(e, OwnershipLostError):
                self._ownership_lost = e  # a newer owner commits from now on: this one answers no query
            visible.set_result(None)  # nothing committed: the store holds the committed state
            raise
        publish_started = time.perf_counter()
        # Step 6: RocksDB on the I/O thread, the rest here
        if encoded is not None:
            self._io.submit(self._write_state_store, txid, epoch, encoded).add_done_callback(
                lambda written: self._state_written(txid, written, visible)
            )
        else:
            visible.set_result(None)
        self._publish_committed(txid, epoch)
        if not self.stage.reads_source and self.kafka_shuffle is None:
            self._io.submit(self._retire_consumed_input, txid)
        done = time.perf_counter()
        steps = self.stats.commit_steps_ms
        steps["zookeeper"] += (publish_started - zookeeper_started) * 1000.0
        steps["publish"] += (done - publish_started) * 1000.0
        self.stats.commit_ms_total += (done - commit_started) * 1000.0
        if self._auto_snapshot is not None and self._appended is not None:
            self._auto_snapshot.appended(*self._appended)
        return rows_out

    def _snapshot_own_queue(self) -> None:
        """Compact this task's state-topic queue at its committed txid (the automatic snapshot)."""
        compact_queue_locked(self.zk, self.layout, self.plan, self.stage, self.task.queue, lock_timeout_s=1.0)

    def _wait_connected(self) -> None:
        # SUSPENDED: pause before committing; the worker stops us if the session is LOST.
        deadline = time.monotonic() + self.settings.commit_wait_s
        while not self.connected.wait(min(0.2, max(0.0, deadline - time.monotonic()))):
            if self._stopping.is_set() or time.monotonic() >= deadline:
                break
        if not self.connected.is_set():
            raise ZooKeeperUnavailableError(
                f"task {self.topology_id}/{self.task.task_id}: ZooKeeper not connected; batch left for replay"
            )

    def _already_committed(self, txid: int) -> bool:
        """Step 1: True if ``txid`` is committed already (its files are published again).

        Spark re-delivers the committed batch after a crash between our commit and its own;
        it must plan exactly the input the commit recorded. A txid below the committed one,
        or other input files, means Spark's checkpoint fell behind ZooKeeper (a machine crash,
        a restored or deleted checkpoint, a checkpoint root that is not really shared), and
        skipping or re-running the batch would lose or double input.

        Raises:
            InputMismatchError: Spark's plan for ``txid`` differs from what was committed.
        """
        assert self.ownership is not None
        committed = self.ownership.committed
        if txid > committed.committed_txid:
            return False
        checkpoint = self.layout.checkpoint_dir(self.task.task_id)
        planned = batch_input(checkpoint, txid)
        recorded = committed.input_of(txid)
        where = f"task {self.topology_id}/{self.task.task_id}: Spark's checkpoint {checkpoint} plans batch {txid}"
        behind = (
            f"{where}, but ZooKeeper committed up to txid {committed.committed_txid} and keeps no record of the input "
            f"of txid {txid}: the checkpoint is {committed.committed_txid - txid} batch(es) behind ZooKeeper (restored, "
            "deleted or not shared between workers). The task stops rather than skip or re-count input; restore the "
            "checkpoint directory that ran these batches"
        )
        if planned is None or (planned.offsets and recorded is None):
            # No input logged (or an offset range committed before offsets were recorded):
            # txids are all there is.
            if txid < committed.committed_txid:
                raise InputMismatchError(behind)
        elif recorded is None:
            raise InputMismatchError(behind)
        elif planned.digest != recorded.digest:
            planned_what = "another offset range" if planned.offsets else f"{planned.files} input file(s)"
            recorded_what = "its offset range" if recorded.offsets else f"{recorded.files} other file(s)"
            raise InputMismatchError(
                f"{where} with {planned_what}, but txid {txid} was committed with {recorded_what} "
                f"(sha256 {recorded.digest[:12]} vs {planned.digest[:12]}): the checkpoint fell behind "
                "ZooKeeper and Spark re-planned the batch. The task stops rather than skip or re-count input; restore "
                "the checkpoint directory that ran these batches"
            )
        if txid < committed.committed_txid:
            logger.warning(
                "task %s/%d: Spark replays txid %d with the same input as committed; skipping it",
                self.topology_id,
                self.task.task_id,
                txid,
            )
        else:
            self._publish(txid, committed.committed_epoch)
            self._finish_user_state_commit(txid, committed.committed_epoch)
            self._after_publish(txid)
        return True

    @contextmanager
    def _state_section(self, txid: int) -> Iterator[None]:
        """Hold the commit lock for a batch's work on the task's state; refuse once stopping."""
        with self._commit_lock:
            if self._stopping.is_set():
                raise TaskStoppingError(f"task {self.topology_id}/{self.task.task_id} is stopping; txid {txid} left for replay")
            yield

    def _append_state_changes(self, txid: int, epoch: int) -> ChangeColumns | None:
        """Step 4: the batch's state changes to the state topic; returns them encoded for the
        RocksDB write (None for a task without state)."""
        state = self.state
        if state is None:
            return None
        started = time.perf_counter()
        held, self._column_changes = self._column_changes, None
        if held is not None and held[0] == txid and not state.store.has_pending():
            encoded = held[1]
        else:
            keys, values = state.store.pending_columns()
            encoded = encode_changes(keys, values, key_texts=self._shuffled_key_texts(txid, keys), where=state.log.where)
        size = state.log.append_batch(self.task.task_id, txid, epoch, encoded)
        self._appended = (len(encoded), size)
        self.stats.commit_steps_ms["state_topic"] += (time.perf_counter() - started) * 1000.0
        return encoded

    def _shuffled_key_texts(self, txid: int, keys: list[tuple[Any, ...]]) -> list[str] | None:
        """The shuffled texts of the batch's changed ``keys`` when the map-state update wrote
        exactly the keys it was given, in order (a skipped replay or a nested key does not);
        else None and the keys are encoded again."""
        held, self._key_texts = self._key_texts, None
        if held is None or held[0] != txid or held[1] != keys:
            return None
        return held[2]

    def _write_state_store(self, txid: int, epoch: int, encoded: ChangeColumns) -> None:
        """Step 6, on the I/O thread: the committed batch's changes and the applied marker (txid,
        epoch) into RocksDB, one synced write batch."""
        state = self.state
        if state is None:  # closed by a stop after the commit: the next start catches the store up
            return
        started = time.perf_counter()
        try:
            state.store.flush(txid, epoch, encoded=encoded)
        except Exception as e:  # noqa: BLE001 - whatever failed, the state topic holds the batch: re-apply it from there
            logger.warning(
                "task %s/%d: writing committed txid %d to the local state store failed (%s: %s); "
                "catching the store up from the state topic",
                self.topology_id,
                self.task.task_id,
                txid,
                type(e).__name__,
                e,
            )
            self._catch_up_store(state, txid, epoch, e)
        self.stats.commit_steps_ms["rocksdb"] += (time.perf_counter() - started) * 1000.0

    def _catch_up_store(self, state: TaskState, txid: int, epoch: int, cause: Exception) -> None:
        """On the I/O thread, after committed batch ``txid``'s store write failed: re-apply the
        batch from the state topic (a few tries), then check we still own the task, since state
        queries are answered from this store again once this returns.

        Raises:
            StateStoreBehindError: the store could not be caught up (the task fails).
            OwnershipLostError: the task has a newer owner (the task fails).
        """
        assert self.ownership is not None
        last: Exception = cause
        for attempt in range(CATCH_UP_ATTEMPTS):
            if attempt and self._stopping.wait(0.1 * 2**attempt):
                break  # a stop: the next start catches the store up
            try:
                applied = state.catch_up(txid, epoch)
            except StateStoreBehindError:
                raise
            except Exception as e:  # noqa: BLE001 - the disk may recover; tried again, then reported
                last = e
                continue
            verify_owner(self.zk, self.ownership)
            logger.info(
                "task %s/%d: local state store caught up to committed txid %d from the state topic (%d changed keys)",
                self.topology_id,
                self.task.task_id,
                txid,
                applied,
            )
            return
        raise StateStoreBehindError(
            f"task {self.topology_id}/{self.task.task_id}: the local state store could not be brought to committed "
            f"txid {txid}: its write failed ({type(cause).__name__}: {cause}) and so did catching it up from the state "
            f"topic ({type(last).__name__}: {last}); the task stops, and its next start catches the store up from the "
            "state topic or rebuilds it (check the local disk of the store)"
        ) from last

    def _state_written(self, txid: int, written: Future[None], visible: Future[None]) -> None:
        """The outcome of committed batch ``txid``'s store write, passed on to the state queries
        and the next batch through ``visible``; a failure fails the task at once (no later batch
        need arrive to notice), recorded before ``visible`` wakes the queries waiting on it."""
        error = written.exception()
        if error is None:
            visible.set_result(None)
            return
        if self._state_write_failed is None:
            self._state_write_failed = error
        logger.log(
            logging.WARNING if self._stopping.is_set() else logging.ERROR,  # a stop cut the catch-up short
            "task %s/%d: the local state store is behind committed txid %d; the task stops answering state queries "
            "and fails: %s: %s",
            self.topology_id,
            self.task.task_id,
            txid,
            type(error).__name__,
            error,
        )
        visible.set_exception(error)

    def _retire_consumed_input(self, txid: int) -> None:
        """On the I/O thread: delete the shuffle files the batches before ``txid`` read, when the
        queue source reads them (Spark committed those batches before it planned this one, and
        ZooKeeper before that, so no replay reads them again)."""
        checkpoint = self.layout.checkpoint_dir(self.task.task_id)
        try:
            if offset_txids(checkpoint, txid) is None:
                return  # Spark's file source: its log holds every file, so they stay
            read = read_before(checkpoint, txid)
            if read:
                epoch = self.ownership.epoch if self.ownership is not None else None
                retire_read(self.layout.shuffle_topic(self.stage), self.task.queue, read, epoch=epoch)
        except Exception:  # on the I/O thread nobody awaits this: say what failed, and go on
            logger.exception("task %s/%d: consumed shuffle files not deleted", self.topology_id, self.task.task_id)

    def _await_state_write(self) -> None:
        """Wait for the last committed batch's RocksDB write.

        Raises:
            StateError: that write failed; the store is behind the committed txid until the task
                starts again (which catches it up from the state topic).
        """
        pending = self._state_write
        if pending is not None:
            try:
                pending.result()
            except BaseException as e:  # noqa: BLE001 - whatever ended the write on its thread is reported below
                self._state_write_failed = e
            # cleared only once done: a query arriving meanwhile still waits for it
            if self._state_write is pending:
                self._state_write = None
        if self._state_write_failed is not None:
            raise StateError(
                f"task {self.topology_id}/{self.task.task_id}: writing a committed batch to the local state store "
                f"failed and could not be repaired ({type(self._state_write_failed).__name__}: "
                f"{self._state_write_failed}); the task must start again, which catches the store up from the state topic"
            ) from self._state_write_failed

    def _read_checkpoint_entries(self, txid: int) -> tuple[list[Any], BatchInput | None]:
        """Spark's offsets and input fingerprint of batch ``txid`` (logged before the batch runs)."""
        checkpoint = self.layout.checkpoint_dir(self.task.task_id)
        return batch_offsets(checkpoint, txid), batch_input(checkpoint, txid)

    def _commit_to_zookeeper(self, txid: int, rows: int) -> None:
        """Step 5: the ZooKeeper commit transaction (refused for a zombie)."""
        assert self.ownership is not None
        epoch = self.ownership.epoch
        self._wait_connected()
        outputs = {
            topic.output_id: sizes
            for topic in self._output_topics()
            if (sizes := topic.staged_sizes(self.task.task_id, txid, epoch))
        }
        entries, self._checkpoint_entries = self._checkpoint_entries, None
        if entries is not None and entries[0] == txid:
            offsets, fingerprint = entries[1].result()
        else:
            offsets, fingerprint = self._read_checkpoint_entries(txid)
        commit(
            self.zk,
            self.ownership,
            txid,
            offsets=offsets,
            rows=rows,
            outputs=outputs,
            batch_input=fingerprint,
            clock=self.clock,
        )

    def _publish_committed(self, txid: int, epoch: int) -> None:
        """Step 6: commit the user State, publish the staged files, commit the map state."""
        if self.user_state is not None:
            self.user_state.commit(txid)
            self._persisted_tuples_path(txid, epoch).unlink(missing_ok=True)
        self._publish(txid, epoch)
        state = self.state
        if state is not None and state.map_state is not None:
            state.map_state.commit(txid)
        self._after_publish(txid)

    def _after_publish(self, committed_txid: int) -> None:
        """What the published batches owe (sinks, Kafka shuffles), delivered as this owner: a
        ``print`` sink logs nothing above ``committed_txid`` and only once ZooKeeper confirms we
        still own the task, and marks what it logged under our epoch."""
        assert self.ownership is not None
        ownership = self.ownership
        self.outputs.after_publish(committed_txid, epoch=ownership.epoch, verify_owner=lambda: verify_owner(self.zk, ownership))

    def _update_user_state(self, txid: int, tuples: list[dict[str, Any]]) -> Collector:
        """Apply a batch's tuples to the partition_persist State, without committing it.

        The State keeps them uncommitted (e.g. in a database transaction) until step 6, so no
        reader sees a batch before ZooKeeper commits it, and a zombie's never.
        """
        assert self.stage.persist is not None and self.user_state is not None
        self.user_state.begin_commit(txid)
        collector = Collector(tuple(self.stage.persist.emit_fields or ()))
        resolve_object(self.stage.persist.updater).update_state(self.user_state, tuples, collector)
        return collector

    def _persisted_tuples_path(self, txid: int, epoch: int) -> Path:
        return self.layout.persist_topic(self.stage).pending_path(self.task.queue) / batch_file_name(
            self.task.task_id, txid, epoch
        )

    def _finish_user_state_commit(self, txid: int, epoch: int) -> None:
        """Apply committed batch ``txid``'s tuples to the user State again if its commit may not
        have happened (their staged file is deleted only after ``State.commit``).

        A transactional or opaque State recognises the txid; a plain State may count the batch
        twice if the crash fell between its commit and the deletion (Trident's non-transactional
        state is at-least-once too).
        """
        if self.user_state is None:
            return
        path = self._persisted_tuples_path(txid, epoch)
        if not path.exists():
            return
        tuples = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        logger.info(
            "task %s/%d: applying committed txid %d to its State again (%d tuples)",
            self.topology_id,
            self.task.task_id,
            txid,
            len(tuples),
        )
        self._update_user_state(txid, tuples)
        self.user_state.commit(txid)
        path.unlink(missing_ok=True)

    def _output_topics(self) -> list[StagedOutput]:
        return self.outputs.staged_outputs()

    def _publish(self, txid: int, epoch: int) -> None:
        """Publish committed batch ``txid``'s staged files, checked against its commit record."""
        assert self.ownership is not None
        recorded = self.ownership.committed.outputs
        for topic in self._output_topics():
            topic.publish_batch(self.task.task_id, txid, epoch, recorded.get(topic.output_id, {}))

    def _compute_in_spark(self, df: DataFrame) -> _Batch:
        """Step 2, Spark's part: read the micro-batch as its stage kind's input format."""
        reads = self.stage.kind_info.reads
        if reads == "source":
            result = source_batch(df, self.stage)
            batch = _Batch(rows_in=result.input_rows, dead=list(result.dead_letters))
            if result.inputs is not None:
                batch.records, batch.driver_operations = result.inputs, True
            else:
                for index, items in result.outputs.items():
                    if isinstance(self.stage.outputs[index], ShuffleSpec):
                        batch.output_partials[index] = items
                    else:
                        batch.outputs[index] = items
            return batch
        if reads == "partials":
            partials, rows_in = keyed_batch(df, self.stage)
            return _Batch(rows_in=rows_in, partials=partials, driver_operations=self.stage.state is None)
        rows = records_batch(df)
        return _Batch(rows_in=len(rows), rows=rows, driver_operations=True)

    def _compute_on_state(self, batch: _Batch, txid: int) -> None:
        """Step 2, on the driver: apply the shuffled partials to the map state (Trident's txid
        rules), or run the stage's processor and its driver-side record operations.

        A partial that cannot be combined (null, or of a type the aggregator rejects) goes to
        the dead letters with the reason instead of failing the batch on every replay.
        """
        if self.stage.state is not None:
            self._update_map_state(batch, txid)
        elif self.processor is not None:
            rows = batch.rows or [("", key, {"value": value}) for key, value in batch.partials]
            result = self.processor.process(rows, self.clock())
            batch.records, batch.dead, batch.side = result.records, result.dead, result.side
        if batch.driver_operations:
            stage = self.stage
            taps = [stage.tap_of(output) for output in stage.outputs]
            by_tap, letters = run_batch(batch.records, stage.operations, self._state_reader, taps, side=batch.side)
            batch.outputs = {index: by_tap[tap] for index, tap in enumerate(taps)}
            batch.dead.extend({"record": d.record, "error": d.error} for d in letters)

    def _update_map_state(self, batch: _Batch, txid: int) -> None:
        """Apply a keyed stage's combined partials to its map state (Trident's txid rules);
        with a ``new_values()`` stream, its input is each updated key with its new value."""
        assert self.state is not None and self.state.map_state is not None and self.stage.state is not None
        keys: list[tuple[Any, ...]] = []
        texts: list[str] = []
        updates: list[Callable[[Any], Any]] = []
        partials = batch.partials
        # One parse of all the keys (each is a JSON array) instead of one json.loads per key.
        decoded, canonical = decode_key_texts([encoded for encoded, _ in partials])
        map_state = self.state.map_state
        self._key_texts = self._column_changes = None
        if canonical and self._update_columnwise(batch, txid, decoded):
            return
        combinable = _combinable_types(self._aggregator)
        for (text, value), fields in zip(partials, decoded, strict=True):
            key = tuple(fields)
            if type(value) not in combinable and (problem := _uncombinable(self._aggregator, value)) is not None:
                batch.dead.append({"record": {"key": fields, "partial": value}, "error": problem})
                continue
            keys.append(key)
            texts.append(text)
            updates.append(_combiner(self._aggregator, key, value, batch.dead))
        map_state.begin_commit(txid)
        new_values = map_state.multi_update(keys, updates)
        # the store's key texts already, so the commit writes them as they are
        self._key_texts = (txid, keys, texts) if canonical else None
        self._set_new_values(batch, keys, new_values)

    def _update_columnwise(self, batch: _Batch, txid: int, decoded: list[Any]) -> bool:
        """The map-state update of a Count or Sum over int partials on opaque or transactional
        state, column-wise (:mod:`~stream_ops.state.column_update`); False when the batch is
        not one it covers (the per-key update then runs)."""
        assert self.state is not None and self.state.map_state is not None
        map_state = self.state.map_state
        kind = {OpaqueMapState: "op", TransactionalMapState: "tx"}.get(type(map_state))
        store = self.state.store
        if kind is None or type(self._aggregator) not in (Count, Sum) or not isinstance(store, RocksDBBackingMap):
            return False
        partials = batch.partials
        update = add_int_partials(store, kind, txid, [text for text, _ in partials], [value for _, value in partials])
        if update is None:
            return False
        map_state.begin_commit(txid)  # nothing goes through it; the commit closes the batch as usual
        self._column_changes = (txid, update.changes)
        self._set_new_values(batch, [tuple(fields) for fields in decoded] if self.stage.outputs else [], update.new_values)
        return True

    def _set_new_values(self, batch: _Batch, keys: list[tuple[Any, ...]], new_values: list[Any]) -> None:
        """The batch's updated-key count and, with a ``new_values()`` stream, its input records."""
        batch.updated_keys = len(new_values)
        if self.stage.outputs:
            spec = self.stage.state
            assert spec is not None
            batch.records = [
                {**dict(zip(spec.key_fields, key, strict=True)), spec.value_field: value}
                for key, value in zip(keys, new_values, strict=True)
            ]
            batch.driver_operations = True

    def _stage_outputs(self, batch: _Batch, txid: int, epoch: int) -> int:
        """Step 3: update the partition_persist State (uncommitted), write the batch's output
        files (unpublished); returns the number of output rows."""
        staging_started = time.perf_counter()
        rows_out = batch.updated_keys
        emitted: dict[int, list[dict[str, Any]]] = {}
        for index, output in enumerate(self.stage.outputs):
            if isinstance(output, PersistSpec):
                emitted[index] = self._stage_persisted(txid, epoch, output, batch.outputs.get(index, []), batch.dead)
                rows_out += len(batch.outputs.get(index, []))
        rows_out += self.outputs.stage_batch(txid, epoch, batch.outputs, batch.output_partials, batch.dead, emitted)
        self._stage_dead_letters(txid, epoch, batch.dead)
        self.stats.stage_ms_total += (time.perf_counter() - staging_started) * 1000.0
        return rows_out

    def _stage_dead_letters(self, txid: int, epoch: int, dead: list[dict[str, Any]]) -> None:
        """Step 3 for the records of a batch that could not be processed."""
        if not dead:
            return
        letters = [{**d, "topology": self.topology_id, "task": self.task.task_id, "txid": txid, "epoch": epoch} for d in dead]
        self.layout.dead_letter_topic().stage_batch(0, self.task.task_id, txid, epoch, letters)
        self.stats.dead_letters += len(letters)
        logger.warning(
            "task %s/%d txid %d: %d records to the dead-letter topic", self.topology_id, self.task.task_id, txid, len(letters)
        )

    def _stage_persisted(
        self, txid: int, epoch: int, persist: PersistSpec, records: list[dict[str, Any]], dead: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """Step 3 for a partition_persist: stage the tuples, then update the user State; returns
        the records its updater emitted (an emitted value that does not fit ``out=`` is a dead letter)."""
        tuples = [{f: value_or_none(record, f) for f in persist.fields} for record in records]
        # The tuples are staged so that a crash between the ZooKeeper commit and the
        # State's commit (step 6) can apply them again; see _finish_user_state_commit.
        self.layout.persist_topic(self.stage).stage_batch(self.task.queue, self.task.task_id, txid, epoch, tuples)
        collector = self._update_user_state(txid, tuples)
        out = list(persist.emit_fields or {})
        emitted: list[dict[str, Any]] = []
        for value in collector.emitted if out else ():
            try:
                emitted.append(as_fields(value, out, f"{persist.name} updater"))
            except ValueError as e:
                dead.append({"record": {"emitted": value}, "error": str(e)})
        return emitted

    def _record_stats(self, rows_in: int, rows_out: int, seconds: float) -> None:
        stats = self.stats
        now = self.clock()
        elapsed = max(now - (stats.last_batch_at or stats.started_at), 1e-3)
        stats.rows_per_s = rows_in / elapsed
        stats.rows_out_per_s = rows_out / elapsed
        stats.rows_in += rows_in
        stats.rows_out += rows_out
        stats.batches += 1
        stats.last_batch_at = now
        stats.last_batch_ms = seconds * 1000.0
        stats.txid_in_flight = None

    # --- reporting -------------------------------------------------------------------------

    def lag(self) -> SourceLag:
        """Input not read yet: files modified after the newest file the query consumed, and
        their records where they can be counted (a source's kind says how)."""
        checkpoint = self.layout.checkpoint_dir(self.task.task_id)
        self._last_input_ms = max(self._last_input_ms, latest_file_timestamp(checkpoint))
        if self.stage.reads_source:
            assert self.stage.source is not None
            return source_kind(self.stage.source.kind).lag(self.stage.source, self.task.queue, self._last_input_ms)
        if self.kafka_shuffle is not None:
            return SourceLag(records=None, files=None)  # not measured for a Kafka shuffle
        queue_dir = self.layout.shuffle_topic(self.stage).queue_path(self.task.queue)
        read = planned_txids(self.layout.checkpoint_dir(self.task.task_id))
        if read is not None:  # the queue source: what it planned so far is read
            files = unread_files(queue_dir, read, shuffle_suffix(self.stage))
        else:
            files = files_newer_than(queue_dir, self._last_input_ms)
        return SourceLag(records=sum(shuffle_file_rows(f) for f in files), files=len(files))

    def lag_files(self) -> int:
        """Input files not read yet (0 for a source that is not files)."""
        return self.lag().files or 0

    def state_keys(self) -> int:
        state = self.state
        return state.store.count_keys() if state is not None else 0

    def lookup(self, keys: list[tuple[Any, ...]]) -> list[Any]:
        """Committed values of ``keys`` in this task's state (for state queries), never older
        than the task's committed txid.

        Raises:
            LookupError: the task keeps no state.
            StateNotReadyError: the store may be behind the committed txid: a commit or its
                store write in flight longer than ``commit_wait_s``, a write that failed and is
                being caught up or failed for good; ZooKeeper not connected, or the task lost to a
                newer owner. Retryable.
        """
        state = self.state
        if state is None:
            raise LookupError(f"task {self.task.task_id} keeps no state")
        where = f"task {self.topology_id}/{self.task.task_id}"
        # Read first: a commit after this point is concurrent with the query, one before it is not.
        committed = self.ownership.committed_txid if self.ownership is not None else -1
        if not self.connected.is_set():
            raise StateNotReadyError(f"{where}: not connected to ZooKeeper, so the task may have a new owner; ask again shortly")
        # RocksDB never holds an uncommitted batch (it is written after the commit); waiting for
        # a committed batch's write in flight (milliseconds) lets a query see every commit made.
        writing = self._state_write
        if writing is not None and not wait((writing,), timeout=self.settings.commit_wait_s).done:
            raise StateNotReadyError(
                f"{where}: committed txid {committed} is still being written to the local state store (over "
                f"{self.settings.commit_wait_s:g} s); ask again shortly"
            )
        if self._ownership_lost is not None:
            raise StateNotReadyError(
                f"{where}: this worker lost the task to a newer owner (its commit was refused); ask again shortly, "
                "the query then goes to the task's new worker"
            ) from self._ownership_lost
        failed = self._state_write_failed
        if failed is not None:
            raise StateNotReadyError(
                f"{where}: its local state store is behind committed txid {committed} and the task is failing "
                f"({type(failed).__name__}); it answers again once it has started anew, ask again shortly"
            ) from failed
        marker = state.store.applied_marker()
        if committed >= 0 and (marker is None or marker[0] < committed):
            raise StateNotReadyError(
                f"{where}: its local state store is at {marker}, behind committed txid {committed}; ask again shortly"
            )
        return [_unwrap(v) for v in state.store.multi_get(keys, include_pending=False)]


def _combinable_types(aggregator: Any) -> tuple[type, ...]:
    """Partial types a built-in aggregator always combines into a state (no per-key check)."""
    if type(aggregator) in (Count, Sum):
        return (int, float)  # 0 + partial
    if type(aggregator) in (Min, Max):
        return (int, float, str)  # the partial itself for a new key
    return ()


def _uncombinable(aggregator: Any, partial: Any) -> str | None:
    """Why a shuffled partial cannot be combined into a state, or None if it can."""
    if partial is None:
        return "the partial aggregate is null (a null field reached the aggregator)"
    try:
        aggregator.apply(None, partial)
    except Exception as e:  # noqa: BLE001 - reported as a dead letter
        return f"the partial aggregate cannot be combined: {type(e).__name__}: {e}"
    return None


def _combiner(aggregator: Any, key: tuple[Any, ...], partial: Any, dead: list[dict[str, Any]]) -> Callable[[Any], Any]:
    """The map-state update of one key; a combine that fails leaves the value as it was and
    sends the partial to ``dead``."""

    def combine(current: Any) -> Any:
        try:
            return aggregator.apply(current, partial)
        except Exception as e:  # noqa: BLE001 - reported as a dead letter
            dead.append({"record": {"key": list(key), "partial": partial}, "error": f"combine: {type(e).__name__}: {e}"})
            return current

    return combine


def _unwrap(stored: Any) -> Any:
    if stored is None:
        return None
    if hasattr(stored, "curr"):
        return stored.curr
    if hasattr(stored, "val"):
        return stored.val
    return stored
