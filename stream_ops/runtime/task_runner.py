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

Why RocksDB is written after the commit, and why a lookup never answers from a store behind the
committed txid: ``docs/design.md`` section 5.

A ``print`` sink's records are staged and published like a function sink's batch
(:mod:`stream_ops.runtime.stage_outputs`): logged after the commit, by the owner that still owns
the task, and by the next owner when the process died before it logged them.

Each step is one call: step 1's input check :mod:`.replayed_input`; step 2 :mod:`.batch_compute`
(keyed state: :mod:`.map_state_update`); step 3 :mod:`.batch_staging` (a partition_persist
State: :mod:`.user_state_commit`); step 4, step 6's RocksDB write and state queries
:mod:`.state_store_writes`; step 5 :func:`~stream_ops.runtime.ownership.commit`; step 6's
publish :class:`~stream_ops.runtime.stage_outputs.StageOutputs`; the input side :mod:`.task_input`.
Each batch's step times are kept in ``stats.recent_batches`` (:mod:`.batch_timeline`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from stream_ops.compute.stage_query import start_stage_query
from stream_ops.config import QueryConfig
from stream_ops.coordination.cluster_state import read_storm
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import StateError, TaskStoppingError, ZooKeeperUnavailableError
from stream_ops.kafka.shuffle_options import KafkaShuffle
from stream_ops.operators.trident_state import State
from stream_ops.runtime.batch_compute import compute_in_spark, compute_on_state
from stream_ops.runtime.batch_staging import BatchStaging
from stream_ops.runtime.batch_timeline import BatchTimer
from stream_ops.runtime.computed_batch import ComputedBatch
from stream_ops.runtime.event_times_sent import sent_before, sent_through
from stream_ops.runtime.map_state_update import MapStateUpdate
from stream_ops.runtime.ownership import Ownership, acquire, commit, release, verify_owner
from stream_ops.runtime.predecessor_files import discard_unpublished
from stream_ops.runtime.query_failure import query_failure
from stream_ops.runtime.replayed_input import check_replayed_input
from stream_ops.runtime.stage_outputs import StageOutputs
from stream_ops.runtime.stage_processors import StageProcessor, make_processor
from stream_ops.runtime.stage_state import auto_snapshot, open_stage_state
from stream_ops.runtime.state_reader import StateReader
from stream_ops.runtime.state_store_writes import StateStoreWrites
from stream_ops.runtime.task_input import TaskInput
from stream_ops.runtime.task_state import TaskState
from stream_ops.runtime.task_stats import TaskStats
from stream_ops.runtime.user_state_commit import UserStateCommits
from stream_ops.sources import SourceLag
from stream_ops.state.auto_snapshot import AutoSnapshot, SnapshotPolicy
from stream_ops.topics.staged_output import StagedOutput
from stream_ops.topology.functions import resolve_object
from stream_ops.topology.layout import TopologyLayout
from stream_ops.topology.plan import Plan, RecordsSpec, StageSpec, TaskSpec

logger = logging.getLogger(__name__)


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
        self._stopping = threading.Event()
        self._store_writes = StateStoreWrites(
            zk=zk,
            topology_id=layout.topology_id,
            task_id=task.task_id,
            state=lambda: self.state,
            ownership=lambda: self.ownership,
            io=self._io,
            stopping=self._stopping,
            connected=connected,
            commit_wait_s=settings.commit_wait_s,
            stats=self.stats,
        )
        self._input = TaskInput(layout=layout, stage=self.stage, task=task)
        self._map_update = MapStateUpdate(self.stage)
        self._user_states = UserStateCommits(layout=layout, stage=self.stage, task=task)
        self._staging = BatchStaging(layout=layout, stage=self.stage, task=task, user_states=self._user_states, stats=self.stats)
        self.outputs = StageOutputs(plan=plan, stage=self.stage, task=task, layout=layout)
        self._keeps_event_times = self.stage.reads_source and any(
            isinstance(o, RecordsSpec) and o.window_partials is not None for o in self.stage.outputs
        )
        """Whether commits keep the largest event time sent to each window stage taking partials."""
        self.kafka_shuffle: KafkaShuffle | None = None
        """The topology's shuffle between stages when its conf keeps it in Kafka (set by :meth:`prepare`)."""

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

    def _prepare_state(self) -> None:
        assert self.ownership is not None
        committed = self.ownership.committed
        # Our predecessors' staged files that no commit will ever publish, and temp files a
        # crashed writer left, are dropped (only after checking we still own the task); the
        # committed batch's are published now (step 6 of a commit whose owner died before it).
        verify_owner(self.zk, self.ownership)
        keep = (committed.committed_txid, committed.committed_epoch) if committed.committed_txid >= 0 else None
        discard_unpublished(self.layout, self.stage, self.task, self._output_topics(), epoch=self.ownership.epoch, keep=keep)
        if keep is not None:
            self._publish(*keep)
            # sinks: batches published but not yet delivered (a print of a batch our predecessor committed)
            self._after_publish(keep[0])
        stage = self.stage
        if stage.keeps_state:
            self.state = open_stage_state(self.zk, self.layout, stage, self.task, self.worker_id, committed)
            self._auto_snapshot = auto_snapshot(
                self.zk, self.layout, self.plan, self.stage, self.task, self.settings.snapshot_policy
            )
        self.processor = make_processor(stage, self.state.store if self.state else None, self.clock())
        if stage.persist is not None:
            factory = resolve_object(stage.persist.factory)
            self.user_state = factory.make_state(self.task.queue, stage.queues)
            if keep is not None:
                self._user_states.finish_commit(self.user_state, *keep)
        if any(op.kind == "state_query" for op in stage.operations):
            self._state_reader = StateReader(self.zk, self.topology_id, self.plan, query_config=self.settings.query)

    def maybe_tick(self, now: float) -> bool:
        """Write a tick record into this task's input when its time-based windows or triggers
        need a batch although no data arrives; returns whether one was written."""
        return self._input.maybe_tick(now, getattr(self.processor, "tick_interval_s", None), self.kafka_shuffle)

    def start_query(self) -> None:
        """Start the task's Spark streaming query; its batches call :meth:`process_batch`.

        Raises:
            OwnershipLostError: the task was taken over since :meth:`prepare` (the query runs
                on the shared checkpoint only while we own the task).
        """
        assert self.ownership is not None
        verify_owner(self.zk, self.ownership)
        checkpoint = self._input.open_checkpoint()
        kafka_input = self._input.kafka_input(self.kafka_shuffle)
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
        return self._input.input_dir

    def is_running(self) -> bool:
        """True while the query is active and the task's state is sound (a committed batch's
        store write that could not be repaired fails the task at once)."""
        return self._store_writes.failed is None and self.query is not None and self.query.isActive

    def failure(self) -> str | None:
        """Why the task stopped running, if it failed."""
        failed = self._store_writes.failed
        if failed is not None:
            return f"{type(failed).__name__}: {failed}"[:1000]
        return query_failure(self.query) if self.query is not None else None

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
        self._input.close_ticks()

    def _close_state(self) -> None:
        try:
            self._store_writes.await_write()
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
            timer = BatchTimer(txid)
            # Step 1
            if self._already_committed(txid):
                self.stats.txid_in_flight = None
                return
            # Step 5's checkpoint reads, on the I/O thread while Spark computes the batch
            self._input.read_entries_ahead(txid, self._io)
            # Step 2, Spark's part (outside the commit lock: a stop need not wait for it)
            spark_started = time.perf_counter()
            batch = compute_in_spark(df, self.stage, sent_before=self._sent_before(txid))
            self.stats.spark_ms_total += (time.perf_counter() - spark_started) * 1000.0
            timer.mark("spark")
            with self._state_section(txid):
                rows_out = self._commit_batch(batch, txid, timer)
            self.stats.batch_done(batch.rows_in, rows_out, time.monotonic() - started, self.clock())
            self.stats.recent_batches.add(timer.finish(rows_in=batch.rows_in, rows_out=rows_out))

    def _commit_batch(self, batch: ComputedBatch, txid: int, timer: BatchTimer | None = None) -> int:
        """Steps 2 (the driver's part) to 6 for a batch Spark computed, under the commit lock;
        returns the number of output rows. ``timer`` is marked at the end of each step."""
        assert self.ownership is not None
        timer = timer or BatchTimer(txid)
        epoch = self.ownership.epoch
        # The previous batch's RocksDB write must be done before this one reads the state.
        self._store_writes.await_write()
        # Step 2, the part that reads and updates the task's state
        state_started = time.perf_counter()
        compute_on_state(
            batch,
            txid,
            stage=self.stage,
            map_update=self._map_update,
            state=self.state,
            processor=self.processor,
            state_reader=self._state_reader,
            clock=self.clock,
        )
        self.stats.state_ms_total += (time.perf_counter() - state_started) * 1000.0
        timer.mark("state")
        # Step 3
        rows_out = self._staging.stage_batch(batch, txid, epoch, outputs=self.outputs, user_state=self.user_state)
        timer.mark("stage")
        commit_started = time.perf_counter()
        # Step 4
        encoded = self._store_writes.append_changes(txid, epoch, self._map_update)
        timer.mark("state_topic")
        zookeeper_started = time.perf_counter()
        # Step 5. From here a state query waits until the store holds this batch (or the commit
        # failed), so it never reads the store behind a commit ZooKeeper already shows.
        visible = self._store_writes.commit_starts()
        try:
            self._commit_to_zookeeper(txid, batch.rows_in)
        except BaseException as e:
            self._store_writes.commit_failed(e, visible)
            raise
        publish_started = time.perf_counter()
        timer.mark("zookeeper")
        # Step 6: RocksDB on the I/O thread, the rest here
        self._store_writes.write_committed(txid, epoch, encoded, visible)
        self._publish_committed(txid, epoch, timer)
        if not self.stage.reads_source and self.kafka_shuffle is None:
            self._io.submit(self._input.retire_consumed, txid, self.ownership.epoch)
        done = time.perf_counter()
        steps = self.stats.commit_steps_ms
        steps["zookeeper"] += (publish_started - zookeeper_started) * 1000.0
        steps["publish"] += (done - publish_started) * 1000.0
        self.stats.commit_ms_total += (done - commit_started) * 1000.0
        appended = self._store_writes.appended
        if self._auto_snapshot is not None and appended is not None:
            self._auto_snapshot.appended(*appended)
        return rows_out

    def _sent_before(self, txid: int) -> dict[int, float | None] | None:
        """What this task sent each event-time window stage before ``txid`` (None: not known, or
        a task that sends no partials), from its committed record (:mod:`.event_times_sent`)."""
        if not self._keeps_event_times:
            return None
        assert self.ownership is not None
        return sent_before(self.ownership.committed, txid)

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
        it must plan exactly the input the commit recorded (:mod:`.replayed_input`).

        Raises:
            InputMismatchError: Spark's plan for ``txid`` differs from what was committed.
        """
        assert self.ownership is not None
        committed = self.ownership.committed
        if txid > committed.committed_txid:
            return False
        check_replayed_input(f"task {self.topology_id}/{self.task.task_id}", self._input.checkpoint_dir, txid, committed)
        if txid < committed.committed_txid:
            logger.warning(
                "task %s/%d: Spark replays txid %d with the same input as committed; skipping it",
                self.topology_id,
                self.task.task_id,
                txid,
            )
        else:
            self._publish(txid, committed.committed_epoch)
            self._user_states.finish_commit(self.user_state, txid, committed.committed_epoch)
            self._after_publish(txid)
        return True

    @contextmanager
    def _state_section(self, txid: int) -> Iterator[None]:
        """Hold the commit lock for a batch's work on the task's state; refuse once stopping."""
        with self._commit_lock:
            if self._stopping.is_set():
                raise TaskStoppingError(f"task {self.topology_id}/{self.task.task_id} is stopping; txid {txid} left for replay")
            yield

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
        offsets, fingerprint = self._input.batch_entries(txid)
        sent = sent_through(self._sent_before(txid), self.outputs.event_times_sent) if self._keeps_event_times else None
        commit(
            self.zk,
            self.ownership,
            txid,
            offsets=offsets,
            rows=rows,
            outputs=outputs,
            batch_input=fingerprint,
            event_times_sent=sent,
            clock=self.clock,
        )

    def _publish_committed(self, txid: int, epoch: int, timer: BatchTimer) -> None:
        """Step 6: commit the user State, publish the staged files, commit the map state, then
        deliver what the published batches owe."""
        self._user_states.commit(self.user_state, txid, epoch)
        self._publish(txid, epoch)
        state = self.state
        if state is not None and state.map_state is not None:
            state.map_state.commit(txid)
        timer.mark("publish")
        self._after_publish(txid)
        timer.mark("deliver")

    def _after_publish(self, committed_txid: int) -> None:
        """What the published batches owe (sinks, Kafka shuffles), delivered as this owner: a
        ``print`` sink logs nothing above ``committed_txid`` and only once ZooKeeper confirms we
        still own the task, and marks what it logged under our epoch."""
        assert self.ownership is not None
        ownership = self.ownership
        self.outputs.after_publish(committed_txid, epoch=ownership.epoch, verify_owner=lambda: verify_owner(self.zk, ownership))

    def _output_topics(self) -> list[StagedOutput]:
        return self.outputs.staged_outputs()

    def _publish(self, txid: int, epoch: int) -> None:
        """Publish committed batch ``txid``'s staged files, checked against its commit record."""
        assert self.ownership is not None
        recorded = self.ownership.committed.outputs
        for topic in self._output_topics():
            topic.publish_batch(self.task.task_id, txid, epoch, recorded.get(topic.output_id, {}))

    # --- reporting -------------------------------------------------------------------------

    def lag(self) -> SourceLag:
        """Input not read yet: files modified after the newest file the query consumed, and
        their records where they can be counted (a source's kind says how)."""
        return self._input.lag(self.kafka_shuffle)

    def lag_files(self) -> int:
        """Input files not read yet (0 for a source that is not files)."""
        return self.lag().files or 0

    def state_keys(self) -> int:
        state = self.state
        return state.store.count_keys() if state is not None else 0

    def lookup(self, keys: list[tuple[Any, ...]]) -> list[Any]:
        """Committed values of ``keys`` in this task's state (for state queries), never older
        than the task's committed txid (:meth:`.StateStoreWrites.lookup`).

        Raises:
            LookupError: the task keeps no state.
            StateNotReadyError: the store may be behind the committed txid. Retryable.
        """
        return self._store_writes.lookup(keys)
