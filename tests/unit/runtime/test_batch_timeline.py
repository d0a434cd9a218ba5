"""Per-batch step times (``runtime/batch_timeline.py``) and the task runner's marks of them
(no Spark, no ZooKeeper: the runner's collaborators are stubs that advance a fake clock)."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from stream_ops.runtime import batch_timeline, task_runner
from stream_ops.runtime.batch_timeline import BATCH_STEPS, BatchTimer, BatchTimes, RecentBatches
from stream_ops.runtime.computed_batch import ComputedBatch
from stream_ops.runtime.task_runner import TaskRunner
from stream_ops.runtime.task_stats import TaskStats


class FakeClock:
    """A monotonic clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, ms: float) -> None:
        self.now += ms / 1000.0

    def taking(self, ms: float, result: Any = None) -> Any:
        """A stub that takes ``ms`` of this clock and returns ``result``."""

        def stub(*args: Any, **kwargs: Any) -> Any:
            self.advance(ms)
            return result

        return stub


def test_a_timer_records_consecutive_steps_from_the_wall_clock_start() -> None:
    clock = FakeClock()
    timer = BatchTimer(4, clock=clock, wall=lambda: 1_700_000_000.0)
    clock.advance(120)
    timer.mark("spark")
    clock.advance(5)
    timer.mark("zookeeper")
    times = timer.finish(rows_in=9, rows_out=2)
    assert (times.txid, times.rows_in, times.rows_out) == (4, 9, 2)
    assert times.steps_ms == pytest.approx({"spark": 120.0, "zookeeper": 5.0})
    assert times.ends() == pytest.approx({"spark": 1_700_000_000.12, "zookeeper": 1_700_000_000.125})
    assert times.ended_at == pytest.approx(1_700_000_000.125)


def test_steps_come_out_in_protocol_order_and_a_repeated_mark_adds_up() -> None:
    clock = FakeClock()
    timer = BatchTimer(0, clock=clock, wall=lambda: 0.0)
    for step in reversed(BATCH_STEPS):
        clock.advance(1)
        timer.mark(step)
    clock.advance(2)
    timer.mark("spark")
    times = timer.finish(rows_in=0, rows_out=0)
    assert tuple(times.steps_ms) == BATCH_STEPS
    assert times.steps_ms["spark"] == pytest.approx(3.0)


def test_an_unknown_step_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown batch step"):
        BatchTimer(0).mark("shuffle")


def test_recent_batches_keep_the_newest_ones_oldest_first() -> None:
    recent = RecentBatches(keep=3)
    for txid in range(5):
        recent.add(BatchTimes(txid=txid, started_at=float(txid), steps_ms={}))
    assert [b.txid for b in recent.snapshot()] == [2, 3, 4]
    assert len(recent) == 3
    with pytest.raises(ValueError):
        RecentBatches(keep=0)


class FakeStoreWrites:
    """The runner's state-store writes (steps 4 and 6's RocksDB part), timed by the fake clock."""

    appended = None

    def __init__(self, clock: FakeClock) -> None:
        self._clock = clock

    def await_write(self) -> None:
        return None

    def append_changes(self, txid: int, epoch: int, map_update: Any) -> None:
        self._clock.advance(4)
        return None

    def commit_starts(self) -> Any:
        return None

    def commit_failed(self, error: BaseException, visible: Any) -> None:
        return None

    def write_committed(self, txid: int, epoch: int, encoded: Any, visible: Any) -> None:
        return None


def _runner(clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> TaskRunner:
    """A TaskRunner whose every step but the marks is a stub taking a known time."""
    runner = TaskRunner.__new__(TaskRunner)
    runner.layout = SimpleNamespace(topology_id="t-1")  # type: ignore[assignment]
    runner.task = SimpleNamespace(task_id=3)  # type: ignore[assignment]
    runner.stage = SimpleNamespace(reads_source=True)  # type: ignore[assignment]
    runner.ownership = SimpleNamespace(epoch=1, committed=SimpleNamespace(committed_txid=-1))  # type: ignore[assignment]
    runner.stats = TaskStats()
    runner.state = runner.processor = runner.user_state = runner._state_reader = None
    runner._auto_snapshot = None
    runner._keeps_event_times = False
    runner._batch_lock = threading.Lock()
    runner._commit_lock = threading.RLock()
    runner._stopping = threading.Event()
    runner._map_update = None  # type: ignore[assignment]
    runner.clock = lambda: 0.0
    runner._input = SimpleNamespace(read_entries_ahead=lambda txid, io: None)  # type: ignore[assignment]
    runner._io = None  # type: ignore[assignment]
    runner._store_writes = FakeStoreWrites(clock)  # type: ignore[assignment]
    runner._staging = SimpleNamespace(stage_batch=clock.taking(3, 7))  # type: ignore[assignment]
    runner._user_states = SimpleNamespace(commit=lambda *a: None)  # type: ignore[assignment]
    runner.outputs = None  # type: ignore[assignment]
    monkeypatch.setattr(runner, "_commit_to_zookeeper", clock.taking(5))
    monkeypatch.setattr(runner, "_publish", clock.taking(2))
    monkeypatch.setattr(runner, "_after_publish", clock.taking(30))
    monkeypatch.setattr(task_runner, "compute_in_spark", clock.taking(100, ComputedBatch(rows_in=11)))
    monkeypatch.setattr(task_runner, "compute_on_state", clock.taking(20))
    monkeypatch.setattr(batch_timeline, "time", SimpleNamespace(perf_counter=clock, time=lambda: 1_700_000_000.0))
    return runner


def test_a_batch_of_the_task_runner_records_each_step_of_the_commit_protocol(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    runner = _runner(clock, monkeypatch)
    runner.process_batch(None, 8)  # type: ignore[arg-type]
    [times] = runner.stats.recent_batches.snapshot()
    assert (times.txid, times.rows_in, times.rows_out, times.started_at) == (8, 11, 7, 1_700_000_000.0)
    expected = {"spark": 100, "state": 20, "stage": 3, "state_topic": 4, "zookeeper": 5, "publish": 2, "deliver": 30}
    assert times.steps_ms == pytest.approx(expected)
    assert tuple(times.steps_ms) == BATCH_STEPS
    assert runner.stats.batches == 1


def test_a_batch_already_committed_is_not_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = _runner(FakeClock(), monkeypatch)
    monkeypatch.setattr(runner, "_already_committed", lambda txid: True)
    runner.process_batch(None, 8)  # type: ignore[arg-type]
    assert runner.stats.recent_batches.snapshot() == []
