"""Fixtures for the nimbus tests: fake workers (real ZooKeeper sessions, no Spark).

A :class:`FakeWorker` registers ``/workers/{host:port}`` as an ephemeral node from its own
ZooKeeper session and writes task heartbeats the way ``runtime.heartbeat.beat`` does.
Closing it ends the session, so its nodes vanish like those of a dead worker.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stream_ops.config import ClusterConfig, ZooKeeperConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import HeartbeatRecord, WorkerRecord
from stream_ops.coordination.store import ZkStore
from stream_ops.examples.wordcount import build_wordcount
from stream_ops.nimbus.assignment import read_assignment
from stream_ops.nimbus.submission import submit

HOST = "127.0.0.1"


def wait_for(predicate: Callable[[], object], timeout_s: float = 10.0, interval_s: float = 0.02) -> None:
    """Poll ``predicate`` until it is truthy; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        time.sleep(interval_s)


class FakeWorker:
    """A worker slot without Spark: a registration node and heartbeats, in its own session."""

    def __init__(self, zk_config: ZooKeeperConfig, port: int) -> None:
        self.worker_id = f"{HOST}:{port}"
        self.store = ZkStore.connect(zk_config)
        self._beats = 0
        record = WorkerRecord(
            worker_id=self.worker_id, host=HOST, port=port, pid=os.getpid(), capacity=64, started_at=time.time(), tls=False
        )
        self.store.create_json(ZkPaths.worker(self.worker_id), record.to_json_obj(), ephemeral=True)
        self.closed = False

    def assigned(self, topology_id: str) -> list[int]:
        """Tasks the current assignment gives this worker."""
        found = read_assignment(self.store, topology_id)
        if found is None:
            return []
        return sorted(t for t, w in found[0].tasks.items() if w == self.worker_id)

    def beat(self, topology_id: str, tasks: list[int] | None = None, *, skew_s: float = 0.0) -> None:
        """Rewrite the heartbeat of ``tasks`` (default: every task assigned here), stamped by a
        clock ``skew_s`` seconds off."""
        for task_id in self.assigned(topology_id) if tasks is None else tasks:
            self._beats += 1
            path = ZkPaths.heartbeat(topology_id, task_id)
            data = HeartbeatRecord(worker_id=self.worker_id, time=time.time() + skew_s, epoch=1, batches=self._beats)
            if self.store.exists(path):
                self.store.set_json(path, data.to_json_obj())
            else:
                self.store.create_json(path, data.to_json_obj(), ephemeral=True)

    def close(self) -> None:
        """End the session: the worker node and its heartbeats vanish."""
        if not self.closed:
            self.closed = True
            self.store.close()

    def die(self, observer: ZkStore) -> None:
        """Close the session and wait until ``observer`` no longer sees the worker node."""
        self.close()
        wait_for(lambda: not observer.exists(ZkPaths.worker(self.worker_id)))


@pytest.fixture
def fake_worker(zk_config: ZooKeeperConfig, zk_store: ZkStore) -> Iterator[Callable[[int], FakeWorker]]:
    """Factory ``fake_worker(port) -> FakeWorker``; all are closed after the test."""
    made: list[FakeWorker] = []

    def make(port: int) -> FakeWorker:
        worker = FakeWorker(zk_config, port)
        made.append(worker)
        wait_for(lambda: zk_store.exists(ZkPaths.worker(worker.worker_id)))
        return worker

    yield make
    for worker in made:
        worker.close()


@pytest.fixture
def submit_wordcount(zk_store: ZkStore, tmp_path: Path) -> Callable[..., str]:
    """``submit_wordcount(workers=2) -> topology id``: the example word count (4 tasks)."""

    def _submit(workers: int = 2, name: str = "wordcount") -> str:
        return submit(
            zk_store,
            ClusterConfig(root=tmp_path / "cluster"),
            build_wordcount(tmp_path / "in", name=name),
            workers=workers,
        )

    return _submit


class FakeClock:
    """A monotonic clock moved by hand."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


@pytest.fixture
def fake_clock() -> FakeClock:
    """A hand-moved monotonic clock for the monitor."""
    return FakeClock()


@pytest.fixture
def poll() -> Callable[..., None]:
    """``poll(predicate, timeout_s=10)``: bounded polling instead of sleeps."""
    return wait_for
