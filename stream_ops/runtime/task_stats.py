"""What a task counts about its batches and reports in its heartbeats."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from stream_ops.runtime.batch_timeline import RecentBatches

COMMIT_STEPS = ("state_topic", "zookeeper", "publish", "rocksdb")
"""The parts of the commit path :attr:`TaskStats.commit_steps_ms` times; the RocksDB write runs
on the task's I/O thread after the ZooKeeper commit (:mod:`stream_ops.runtime.task_runner`)."""


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
    recent_batches: RecentBatches = field(default_factory=RecentBatches)
    """The step times of the task's last batches, each on its own
    (:mod:`stream_ops.runtime.batch_timeline`): what a latency breakdown lines up per record."""

    def batch_done(self, rows_in: int, rows_out: int, seconds: float, now: float) -> None:
        """Count a finished batch of ``rows_in`` input and ``rows_out`` output rows that took
        ``seconds``; the rates are over the time since the previous batch ended."""
        elapsed = max(now - (self.last_batch_at or self.started_at), 1e-3)
        self.rows_per_s = rows_in / elapsed
        self.rows_out_per_s = rows_out / elapsed
        self.rows_in += rows_in
        self.rows_out += rows_out
        self.batches += 1
        self.last_batch_at = now
        self.last_batch_ms = seconds * 1000.0
        self.txid_in_flight = None
