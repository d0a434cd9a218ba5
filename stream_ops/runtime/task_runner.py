"""One task of one topology running on this worker as a Spark streaming query.

``TaskRunner.process_batch`` is the commit protocol of DESIGN section 5, the same for every
stage kind (txid n, owner epoch e):

  1. if ZooKeeper already records n as committed (Spark re-delivers a batch after a crash
     between our commit and its own), change nothing: publish the files the committing owner
     staged for n, and return;
  2. compute the batch: a source stage runs its operations and partial aggregation in Spark;
     a keyed stage combines the shuffled partials per key (Spark) and applies them to its map
     state with Trident's txid rules; join / process / partition stages run their processor
     and operations on the collected rows;
  3. stage the output files (shuffle, dead letters) named (task, n, e) where no reader sees
     them, and update a partition_persist user State (``begin_commit``/``commit``);
  4. append the batch's state changes to the state topic as (task, n, e), then write them and
     the applied marker (n, e) to RocksDB in one write batch;
  5. ZooKeeper commit transaction (checks ownership; refused for a zombie);
  6. publish the staged files (rename into the queues), ``map_state.commit(n)``.

A crash before 5 leaves only files no reader accepts (staged, or state-topic entries of an
uncommitted txid / lower epoch); a crash after 5 is finished by step 1 of the replay.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from stream_ops.coordination.store import ZkStore
from stream_ops.hashing import encode_key, partition_for
from stream_ops.layout import TopologyLayout
from stream_ops.operators.aggregators import aggregator_from_spec
from stream_ops.operators.join_bolt import lookup as field_value
from stream_ops.operators.record_pipeline import needs_driver, run_batch
from stream_ops.operators.trident_state import Collector, State
from stream_ops.runtime.ownership import Ownership, acquire, commit, release
from stream_ops.runtime.stage_processors import TICK_STREAM, StageProcessor, make_processor
from stream_ops.runtime.state_reader import StateReader
from stream_ops.runtime.task_state import TaskState, open_task_state
from stream_ops.spark.checkpoint import batch_offsets, count_newer_files, latest_file_timestamp
from stream_ops.spark.compiler import keyed_batch, records_batch, source_batch, start_stage_query
from stream_ops.topics.file_topic import FileTopic
from stream_ops.topology.functions import resolve_object
from stream_ops.topology.plan import Plan, StageSpec, TaskSpec

logger = logging.getLogger(__name__)


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
    commit_ms_total: float = 0.0
    """Time spent in the commit path (state topic, RocksDB, ZooKeeper) over all batches."""
    started_at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class RunnerSettings:
    """How a worker runs its tasks' queries."""

    trigger_seconds: float = 1.0
    max_files_per_trigger: int = 100
    commit_wait_s: float = 10.0


class TaskRunner:
    """Owns one task and runs its streaming query.

    Args:
        store: ZooKeeper access (shared by the worker's runners; kazoo is thread-safe).
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
        store: ZkStore,
        spark: SparkSession,
        layout: TopologyLayout,
        plan: Plan,
        task: TaskSpec,
        worker_id: str,
        settings: RunnerSettings,
        connected: threading.Event,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
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
        # Values a batch overwrote, served to state queries until its ZooKeeper commit succeeds
        # (read-committed: a query never sees a batch that may still be replayed).
        self._committed_overlay: dict[tuple[Any, ...], Any] = {}
        self._overlay_lock = threading.Lock()
        self.query: StreamingQuery | None = None
        self._batch_lock = threading.Lock()
        self._stopping = threading.Event()
        self._last_input_ms = 0
        spec = self.stage.state.aggregator if self.stage.state else self.stage.shuffle.aggregator if self.stage.shuffle else None
        self._aggregator = aggregator_from_spec(spec) if spec else None

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
            release(self.store, self.ownership)
            raise

    def prepare(self) -> None:
        """Take ownership under a new epoch and open (or rebuild) the task's state."""
        self.ownership = acquire(self.store, self.topology_id, self.task.task_id, self.worker_id, clock=self.clock)
        try:
            self._prepare_state()
        except BaseException:
            self._close_state()
            release(self.store, self.ownership)
            raise

    def _prepare_state(self) -> None:
        assert self.ownership is not None
        committed = self.ownership.committed
        # Staged files of this task that no commit will ever publish (a dead owner's, or ours
        # from before a crash) are dropped; the committed batch's are kept for step 1.
        keep = (committed.committed_txid, committed.committed_epoch) if committed.committed_txid >= 0 else None
        for topic in self._output_topics():
            topic.discard_staged(self.task.task_id, keep=keep)
        stage = self.stage
        if stage.keeps_state:
            started = time.monotonic()
            self.state = open_task_state(
                store_dir=self.layout.local_store_dir(self.worker_id, self.task.task_id),
                state_topic=self.layout.state_topic(stage),
                queue=self.task.queue,
                kind=stage.state.kind if stage.state is not None else None,
                committed_txid=committed.committed_txid,
                committed_epoch=committed.committed_epoch,
                snapshot_dir=self.layout.snapshot_dir(stage, self.task.queue),
            )
            if self.state.rebuilt:
                logger.info(
                    "task %s/%d: state rebuilt from the state topic, %d keys in %.3f s",
                    self.topology_id, self.task.task_id, self.state.restored_keys, time.monotonic() - started,
                )
        if stage.kind in ("join", "process", "partition"):
            self.processor = make_processor(stage, self.state.store if self.state else None)
        if stage.persist is not None:
            factory = resolve_object(stage.persist.factory)
            self.user_state = factory.make_state(self.task.queue, stage.queues)
        if any(op.kind == "state_query" for op in stage.operations):
            self._state_reader = StateReader(self.store, self.topology_id, self.plan)

    def maybe_tick(self, now: float) -> bool:
        """Write a tick record into this task's input when its time-based windows or triggers
        need a batch although no data arrives; returns whether one was written."""
        interval = getattr(self.processor, "tick_interval_s", None)
        if interval is None or now - self._last_tick < interval:
            return False
        self._last_tick = now
        tick = {"stream": TICK_STREAM, "key": None, "record": "{}"}
        topic = self.layout.input_topic(self.plan, self.stage)
        topic.write_file(self.task.queue, f"tick-t{self.task.task_id:05d}-{time.time_ns()}.jsonl", [tick])
        return True

    def start_query(self) -> None:
        """Start the task's Spark streaming query; its batches call :meth:`process_batch`."""
        assert self.ownership is not None
        checkpoint = self.layout.checkpoint_dir(self.task.task_id)
        self._last_input_ms = latest_file_timestamp(checkpoint)
        self.query = start_stage_query(
            self.spark,
            stage=self.stage,
            input_dir=self.input_dir,
            checkpoint_dir=checkpoint,
            query_name=f"{self.topology_id}-task{self.task.task_id}-e{self.ownership.epoch}",
            on_batch=self.process_batch,
            trigger_seconds=self.settings.trigger_seconds,
            max_files_per_trigger=self.settings.max_files_per_trigger,
        )

    @property
    def input_dir(self):  # noqa: ANN201 - Path
        return self.layout.input_topic(self.plan, self.stage).queue_path(self.task.queue)

    def is_running(self) -> bool:
        """True while the query is active."""
        return self.query is not None and self.query.isActive

    def failure(self) -> str | None:
        """Why the query stopped, if it failed."""
        if self.query is None:
            return None
        exc = self.query.exception()
        return None if exc is None else str(exc).splitlines()[0][:500]

    def stop(self, *, release_ownership: bool = True) -> None:
        """Stop the query, close the state and (if we still can) release the task."""
        self._stopping.set()
        if self.query is not None:
            try:
                self.query.stop()
            except Exception as e:  # noqa: BLE001 - a failed query still has to be cleaned up
                logger.warning("task %s/%d: stopping query: %s", self.topology_id, self.task.task_id, e)
        # wait for a batch callback that may still be running in its Python thread
        if self._batch_lock.acquire(timeout=30):
            self._batch_lock.release()
        self._close_state()
        if release_ownership and self.ownership is not None:
            release(self.store, self.ownership)
        logger.info("task %s/%d stopped on %s", self.topology_id, self.task.task_id, self.worker_id)

    def _close_state(self) -> None:
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
        """``foreachBatch`` callback: run and commit batch ``batch_id`` (the txid)."""
        with self._batch_lock:
            if self._stopping.is_set():
                raise RuntimeError(f"task {self.topology_id}/{self.task.task_id} is stopping; batch {batch_id} left for replay")
            assert self.ownership is not None
            txid = int(batch_id)
            self.stats.txid_in_flight = txid
            started = time.monotonic()
            if self._already_committed(txid):
                if txid == self.ownership.committed_txid:
                    self._publish(txid, self.ownership.committed.committed_epoch)
                self.stats.txid_in_flight = None
                return
            if self.stage.kind == "keyed":
                rows_in, rows_out = self._keyed_batch(df, txid)
            else:
                rows_in, rows_out = self._record_batch(df, txid)
            self._record_stats(rows_in, rows_out, time.monotonic() - started)

    def _wait_connected(self) -> None:
        # SUSPENDED: pause before committing; the worker stops us if the session is LOST.
        if not self.connected.wait(self.settings.commit_wait_s):
            raise RuntimeError(f"task {self.topology_id}/{self.task.task_id}: ZooKeeper not connected; batch left for replay")

    def _already_committed(self, txid: int) -> bool:
        assert self.ownership is not None
        committed = self.ownership.committed_txid
        if txid < committed:
            logger.warning(
                "task %s/%d: Spark replays txid %d but %d is committed; the checkpoint is behind ZooKeeper, skipping",
                self.topology_id, self.task.task_id, txid, committed,
            )
        return txid <= committed

    def _commit(self, txid: int, rows: int) -> None:
        """Steps 4-6: state topic + RocksDB, ZooKeeper commit, publish."""
        assert self.ownership is not None
        commit_started = time.perf_counter()
        epoch = self.ownership.epoch
        state = self.state
        if state is not None:
            changed = state.store.pending_items()
            if changed:
                state.changelog.append(self.task.task_id, txid, epoch, changed)
                keys = [key for key, _ in changed]
                before = state.store.multi_get(keys, include_pending=False)
                with self._overlay_lock:
                    self._committed_overlay = dict(zip(keys, before, strict=True))
            state.store.flush(txid, epoch)
        self._wait_connected()
        offsets = batch_offsets(self.layout.checkpoint_dir(self.task.task_id), txid)
        commit(self.store, self.ownership, txid, offsets=offsets, rows=rows, clock=self.clock)
        with self._overlay_lock:
            self._committed_overlay = {}
        self._publish(txid, epoch)
        if state is not None and state.map_state is not None:
            state.map_state.commit(txid)
        self.stats.commit_ms_total += (time.perf_counter() - commit_started) * 1000.0

    def _output_topics(self) -> list[FileTopic]:
        topics = [self.layout.dead_letter_topic()]
        if self.stage.shuffle is not None:
            topics.append(self.layout.shuffle_topic(self.plan.stage(self.stage.shuffle.to_stage)))
        if self.stage.records is not None:
            topics.append(self.layout.shuffle_topic(self.plan.stage(self.stage.records.to_stage)))
        return topics

    def _publish(self, txid: int, epoch: int) -> None:
        for topic in self._output_topics():
            topic.publish_batch(self.task.task_id, txid, epoch)

    def _keyed_batch(self, df: DataFrame, txid: int) -> tuple[int, int]:
        assert self.state is not None and self.state.map_state is not None
        partials, rows_in = keyed_batch(df, self.stage)
        keys = [tuple(json.loads(k)) for k, _ in partials]
        map_state = self.state.map_state
        map_state.begin_commit(txid)
        map_state.multi_update(keys, [_combiner(self._aggregator, value) for _, value in partials])
        self._commit(txid, rows_in)
        return rows_in, len(keys)

    def _record_batch(self, df: DataFrame, txid: int) -> tuple[int, int]:
        """Source, join, process and partition stages: compute, stage outputs, commit."""
        assert self.ownership is not None
        dead: list[dict[str, Any]] = []
        partials: list[tuple[str, Any]] = []
        if self.stage.kind == "source":
            result = source_batch(df, self.stage)
            rows_in, partials, dead = result.input_rows, result.partials, list(result.dead_letters)
            records = [record for _, record in result.records]
            driver_ops = needs_driver(self.stage.operations)
        else:
            assert self.processor is not None
            rows = records_batch(df)
            rows_in = len(rows)
            records, dead = self.processor.process(rows, self.clock())
            driver_ops = True
        if driver_ops and self.stage.operations:
            records, letters = run_batch(records, self.stage.operations, self._state_reader)
            dead.extend({"record": d.record, "error": d.error} for d in letters)
        epoch = self.ownership.epoch
        rows_out = self._stage_outputs(txid, epoch, records, partials)
        if dead:
            letters = [{**d, "topology": self.topology_id, "task": self.task.task_id, "txid": txid, "epoch": epoch} for d in dead]
            self.layout.dead_letter_topic().stage_batch(0, self.task.task_id, txid, epoch, letters)
            self.stats.dead_letters += len(letters)
            logger.warning("task %s/%d txid %d: %d records to the dead-letter topic", self.topology_id, self.task.task_id, txid, len(letters))
        self._commit(txid, rows_in)
        return rows_in, rows_out

    def _stage_outputs(self, txid: int, epoch: int, records: list[dict[str, Any]], partials: list[tuple[str, Any]]) -> int:
        """Step 3: write the batch's output files (unpublished) or update the user State."""
        stage = self.stage
        by_queue: dict[int, list[dict[str, Any]]] = defaultdict(list)
        if stage.shuffle is not None:
            if not partials and records:
                partials = _partials_of(records, stage.shuffle.key_fields, self._aggregator)
            for key, value in partials:
                by_queue[partition_for(json.loads(key), stage.shuffle.queues)].append({"key": key, "value": value})
            topic = self.layout.shuffle_topic(self.plan.stage(stage.shuffle.to_stage))
        elif stage.records is not None:
            spec = stage.records
            for record in records:
                key = [field_value(record, f.split(".")) for f in spec.key_fields]
                by_queue[partition_for(key, spec.queues)].append(
                    {"stream": spec.stream, "key": encode_key(key), "record": json.dumps(record, default=str)}
                )
            topic = self.layout.shuffle_topic(self.plan.stage(spec.to_stage))
        else:
            assert stage.persist is not None and self.user_state is not None
            tuples = [{f: record.get(f) for f in stage.persist.fields} for record in records]
            self.user_state.begin_commit(txid)
            resolve_object(stage.persist.updater).update_state(self.user_state, tuples, Collector())
            self.user_state.commit(txid)
            return len(tuples)
        for queue, lines in sorted(by_queue.items()):
            topic.stage_batch(queue, self.task.task_id, txid, epoch, lines)
        return sum(len(lines) for lines in by_queue.values())

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

    def lag_files(self) -> int:
        """Input files not yet read (modified after the newest file the query consumed)."""
        checkpoint = self.layout.checkpoint_dir(self.task.task_id)
        self._last_input_ms = max(self._last_input_ms, latest_file_timestamp(checkpoint))
        return count_newer_files(self.input_dir, self._last_input_ms)

    def state_keys(self) -> int:
        state = self.state
        return state.store.count_keys() if state is not None else 0

    def lookup(self, keys: list[tuple[Any, ...]]) -> list[Any]:
        """Committed values of ``keys`` in this task's state (for state queries)."""
        state = self.state
        if state is None:
            raise LookupError(f"task {self.task.task_id} keeps no state")
        with self._overlay_lock:
            overlay = self._committed_overlay
            values = state.store.multi_get(keys, include_pending=False)
        return [_unwrap(overlay[k] if k in overlay else v) for k, v in zip(keys, values, strict=True)]


def _partials_of(records: list[dict[str, Any]], key_fields: tuple[str, ...], aggregator: Any) -> list[tuple[str, Any]]:
    """Partial aggregates per key of records computed in the driver."""
    partial: dict[str, Any] = {}
    for record in records:
        key = encode_key([record.get(f) for f in key_fields])
        value = aggregator.init(record)
        partial[key] = value if key not in partial else aggregator.combine(partial[key], value)
    return list(partial.items())


def _combiner(aggregator: Any, partial: Any) -> Callable[[Any], Any]:
    def combine(current: Any) -> Any:
        return aggregator.combine(aggregator.zero() if current is None else current, partial)

    return combine


def _unwrap(stored: Any) -> Any:
    if stored is None:
        return None
    if hasattr(stored, "curr"):
        return stored.curr
    if hasattr(stored, "val"):
        return stored.val
    return stored
