"""When each step of a task's recent batches ran: a bounded record of per-batch step times.

:class:`~stream_ops.runtime.task_stats.TaskStats` sums the steps of the commit protocol over all
batches; a latency breakdown needs them per batch, with wall-clock times that can be lined up
with a record's Kafka timestamp, Spark's progress reports (their ``timestamp`` is the trigger's
start) and another task's batches. :class:`BatchTimer` times one batch of
:meth:`~stream_ops.runtime.task_runner.TaskRunner.process_batch` as consecutive steps
(:data:`BATCH_STEPS`); :class:`RecentBatches` keeps the last few of a task's
:class:`BatchTimes`. Recording changes nothing in the commit protocol: a batch replayed as
already committed (step 1) is not recorded, and a batch that fails is not recorded either.

Example:
    >>> timer = BatchTimer(7)
    >>> for step in BATCH_STEPS:
    ...     timer.mark(step)
    >>> recent = RecentBatches(keep=2)
    >>> recent.add(timer.finish(rows_in=10, rows_out=3))
    >>> [(b.txid, b.rows_in, tuple(b.steps_ms)) == (7, 10, BATCH_STEPS) for b in recent.snapshot()]
    [True]
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

BATCH_STEPS = ("spark", "state", "stage", "state_topic", "zookeeper", "publish", "deliver")
"""The consecutive steps of one batch as :class:`BatchTimes` records them (commit protocol steps
of :mod:`stream_ops.runtime.task_runner`):

* ``spark``: from the ``foreachBatch`` call to the end of step 2's Spark part (the batch's input
  read and computed, in Spark or on the driver; step 1's check included);
* ``state``: step 2's part on the task's state (the commit lock, the wait for the previous
  batch's RocksDB write, applying the batch to the state or processor);
* ``stage``: step 3, the output files staged (shuffle files, sink batches, dead letters);
* ``state_topic``: step 4, the state-topic append;
* ``zookeeper``: step 5, the ZooKeeper commit;
* ``publish``: step 6 up to the deliveries (user State commit, staged files published, map state
  committed): a file shuffle is visible to the next stage at its end;
* ``deliver``: step 6's deliveries of the published batches (Kafka sink and Kafka shuffle
  transactions, function sinks, ``print``): a Kafka sink's records are visible to
  ``read_committed`` consumers at its end.
"""

DEFAULT_KEEP = 256
"""How many batches :class:`RecentBatches` keeps by default (a few hundred bytes each)."""


@dataclass(frozen=True)
class BatchTimes:
    """The step times of one batch of one task.

    Attributes:
        txid: the batch (Spark's batch id).
        started_at: wall-clock time (``time.time()``) at the ``foreachBatch`` call.
        steps_ms: milliseconds per step, consecutive, in :data:`BATCH_STEPS` order (a step the
            batch did not reach is absent).
        rows_in: input rows of the batch.
        rows_out: output rows it staged.
    """

    txid: int
    started_at: float
    steps_ms: Mapping[str, float]
    rows_in: int = 0
    rows_out: int = 0

    def ends(self) -> dict[str, float]:
        """Wall-clock time at the end of each recorded step."""
        out: dict[str, float] = {}
        at = self.started_at
        for step, ms in self.steps_ms.items():
            at += ms / 1000.0
            out[step] = at
        return out

    @property
    def ended_at(self) -> float:
        """Wall-clock time at the end of the last recorded step."""
        return self.started_at + sum(self.steps_ms.values()) / 1000.0


class BatchTimer:
    """Times one batch as consecutive steps: :meth:`mark` ends the current step.

    Args:
        txid: the batch.
        clock: a monotonic clock for the durations, in seconds (default ``time.perf_counter``).
        wall: the wall clock read once at the start, for :attr:`BatchTimes.started_at`
            (default ``time.time``).
    """

    def __init__(self, txid: int, *, clock: Callable[[], float] | None = None, wall: Callable[[], float] | None = None) -> None:
        self.txid = txid
        self._clock = clock or time.perf_counter
        self._started_at = (wall or time.time)()
        self._last = self._clock()
        self._steps: dict[str, float] = {}

    def mark(self, step: str) -> None:
        """End ``step`` now: it lasted since the previous mark (or the start).

        Raises:
            ValueError: ``step`` is not one of :data:`BATCH_STEPS`.
        """
        if step not in BATCH_STEPS:
            raise ValueError(f"unknown batch step {step!r}; expected one of {BATCH_STEPS}")
        now = self._clock()
        self._steps[step] = self._steps.get(step, 0.0) + (now - self._last) * 1000.0
        self._last = now

    def finish(self, *, rows_in: int, rows_out: int) -> BatchTimes:
        """The batch's record, its steps in :data:`BATCH_STEPS` order."""
        steps = {step: self._steps[step] for step in BATCH_STEPS if step in self._steps}
        return BatchTimes(txid=self.txid, started_at=self._started_at, steps_ms=steps, rows_in=rows_in, rows_out=rows_out)


class RecentBatches:
    """The last ``keep`` :class:`BatchTimes` of a task, oldest first; safe to read from another
    thread while the batch thread adds.

    Raises:
        ValueError: ``keep`` is below 1.
    """

    def __init__(self, keep: int = DEFAULT_KEEP) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self._batches: deque[BatchTimes] = deque(maxlen=keep)
        self._lock = threading.Lock()

    def add(self, times: BatchTimes) -> None:
        """Record a finished batch (the oldest one drops out once ``keep`` are held)."""
        with self._lock:
            self._batches.append(times)

    def snapshot(self) -> list[BatchTimes]:
        """The batches held now, oldest first."""
        with self._lock:
            return list(self._batches)

    def __len__(self) -> int:
        with self._lock:
            return len(self._batches)
