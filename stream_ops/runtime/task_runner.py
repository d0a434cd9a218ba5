"""One task of one topology running on this worker as a Spark streaming query.

``TaskRunner.process_batch`` is the commit protocol of DESIGN section 5. Its order is what
makes batches exactly-once for transactional and opaque state:

Keyed stage (txid n, owner epoch e):
  1. combine the batch's shuffled partials per key (Spark);
  2. ``map_state.begin_commit(n)``, ``multi_update`` (Trident's txid rules);
  3. append the changed values to the state topic as (task, n, e);
  4. write them and the applied marker (n, e) to RocksDB in one write batch;
  5. ZooKeeper commit transaction (checks ownership);
  6. ``map_state.commit(n)``.
Source stage:
  1. operations and partial aggregation per key (Spark);
  2. ZooKeeper commit transaction;
  3. publish the shuffle files and dead letters named (task, n, e).

A batch that ZooKeeper already records as committed (Spark re-delivers it after a crash
between our commit and Spark's) changes no state; a source stage re-publishes its files under
the epoch that committed it, which keeps the first copy if it was already written.
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
from stream_ops.hashing import partition_for
from stream_ops.layout import TopologyLayout
from stream_ops.operators.aggregators import aggregator_from_spec
from stream_ops.runtime.ownership import Ownership, acquire, commit, release
from stream_ops.runtime.task_state import TaskState, open_task_state
from stream_ops.spark.checkpoint import batch_offsets, count_newer_files, latest_file_timestamp
from stream_ops.spark.compiler import keyed_batch, source_batch, start_stage_query
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
        self.query: StreamingQuery | None = None
        self._batch_lock = threading.Lock()
        self._stopping = threading.Event()
        self._last_input_ms = 0
        self._aggregator = aggregator_from_spec(
            self.stage.state.aggregator if self.stage.state else self.stage.shuffle.aggregator  # type: ignore[union-attr]
        )

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
        if self.stage.kind != "keyed":
            return
        assert self.stage.state is not None
        started = time.monotonic()
        try:
            self.state = open_task_state(
                store_dir=self.layout.local_store_dir(self.worker_id, self.task.task_id),
                state_topic=self.layout.state_topic(self.stage),
                queue=self.task.queue,
                kind=self.stage.state.kind,
                committed_txid=self.ownership.committed.committed_txid,
                committed_epoch=self.ownership.committed.committed_epoch,
            )
        except BaseException:
            release(self.store, self.ownership)
            raise
        if self.state.rebuilt:
            logger.info(
                "task %s/%d: state rebuilt from the state topic, %d keys in %.3f s",
                self.topology_id, self.task.task_id, self.state.restored_keys, time.monotonic() - started,
            )

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

    # --- per batch -------------------------------------------------------------------------

    def process_batch(self, df: DataFrame, batch_id: int) -> None:
        """``foreachBatch`` callback: run and commit batch ``batch_id`` (the txid)."""
        with self._batch_lock:
            if self._stopping.is_set():
                raise RuntimeError(f"task {self.topology_id}/{self.task.task_id} is stopping; batch {batch_id} left for replay")
            txid = int(batch_id)
            self.stats.txid_in_flight = txid
            started = time.monotonic()
            if self.stage.kind == "keyed":
                rows_in, rows_out = self._keyed_batch(df, txid)
            else:
                rows_in, rows_out = self._source_batch(df, txid)
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
        assert self.ownership is not None
        self._wait_connected()
        offsets = batch_offsets(self.layout.checkpoint_dir(self.task.task_id), txid)
        commit(self.store, self.ownership, txid, offsets=offsets, rows=rows, clock=self.clock)

    def _keyed_batch(self, df: DataFrame, txid: int) -> tuple[int, int]:
        assert self.state is not None and self.ownership is not None
        partials, rows_in = keyed_batch(df, self.stage)
        if self._already_committed(txid):
            return rows_in, 0
        commit_started = time.perf_counter()
        keys = [tuple(json.loads(k)) for k, _ in partials]
        aggregator = self._aggregator
        fns = [_combiner(aggregator, value) for _, value in partials]
        state = self.state
        state.map_state.begin_commit(txid)
        state.map_state.multi_update(keys, fns)
        changed = state.store.pending_items()
        state.changelog.append(self.task.task_id, txid, self.ownership.epoch, changed)
        state.store.flush(txid, self.ownership.epoch)
        self._commit(txid, rows_in)
        state.map_state.commit(txid)
        self.stats.commit_ms_total += (time.perf_counter() - commit_started) * 1000.0
        return rows_in, len(changed)

    def _source_batch(self, df: DataFrame, txid: int) -> tuple[int, int]:
        assert self.ownership is not None and self.stage.shuffle is not None
        result = source_batch(df, self.stage)
        if self._already_committed(txid):
            if txid != self.ownership.committed_txid:
                return result.input_rows, 0
            epoch = self.ownership.committed.committed_epoch
        else:
            commit_started = time.perf_counter()
            self._commit(txid, result.input_rows)
            self.stats.commit_ms_total += (time.perf_counter() - commit_started) * 1000.0
            epoch = self.ownership.epoch
        by_queue: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for key, value in result.partials:
            by_queue[partition_for(json.loads(key), self.stage.shuffle.queues)].append({"key": key, "value": value})
        keyed_stage = self.plan.stage(self.stage.shuffle.to_stage)
        shuffle = self.layout.shuffle_topic(keyed_stage)
        for queue, records in sorted(by_queue.items()):
            shuffle.write_batch(queue, self.task.task_id, txid, epoch, records)
        if result.dead_letters:
            letters = [
                {**letter, "topology": self.topology_id, "task": self.task.task_id, "txid": txid, "epoch": epoch}
                for letter in result.dead_letters
            ]
            self.layout.dead_letter_topic().write_batch(0, self.task.task_id, txid, epoch, letters)
            self.stats.dead_letters += len(letters)
            logger.warning("task %s/%d txid %d: %d records to the dead-letter topic", self.topology_id, self.task.task_id, txid, len(letters))
        return result.input_rows, len(result.partials)

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
        """Current values of ``keys`` in this task's state (for state queries)."""
        state = self.state
        if state is None:
            raise LookupError(f"task {self.task.task_id} keeps no state")
        return [_unwrap(v) for v in state.store.multi_get(keys, include_pending=False)]


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
