"""The local stack's waits (``stream-ops demo`` / ``dev``) wake on the ZooKeeper event they wait
for, not on a timer: a worker's registration, a stateful task's commit.

The timer between checks is made far longer than the test, so only the watch can end a wait.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from stream_ops import local_stack
from stream_ops.config import ClusterConfig, ZooKeeperConfig
from stream_ops.coordination.cluster_state import read_storm
from stream_ops.coordination.embedded import EmbeddedZooKeeper
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import TransactionalRecord, WorkerRecord
from stream_ops.coordination.store import ZkStore
from stream_ops.examples.wordcount import build_wordcount
from stream_ops.local_stack import LocalStack, wait_for_counts
from stream_ops.nimbus import submit

TIMER_S = 60.0
"""The check interval during these tests: longer than any of them may take."""


@pytest.fixture(autouse=True)
def long_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_stack, "WORKER_CHECK_S", TIMER_S)


def _later(seconds: float, action: Any) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(seconds), action()), daemon=True)
    thread.start()
    return thread


def test_waiting_for_workers_wakes_when_one_registers(
    zookeeper: EmbeddedZooKeeper, zk_config: ZooKeeperConfig, zk_store: ZkStore, tmp_path: Path
) -> None:
    stack = LocalStack(home=tmp_path, chroot=zk_config.chroot, zookeeper=zookeeper)
    record = WorkerRecord(worker_id="127.0.0.1:1", host="127.0.0.1", port=1, pid=1, capacity=1, started_at=0.0, tls=False)

    def register() -> None:
        zk_store.ensure_path(ZkPaths.WORKERS)
        zk_store.create_json(ZkPaths.worker(record.worker_id), record.to_json_obj(), ephemeral=True)

    started = time.monotonic()
    _later(0.3, register)
    assert stack.wait_for_workers(1, timeout_s=TIMER_S / 2) == [record.worker_id]
    assert time.monotonic() - started < 10


def test_waiting_for_counts_asks_again_when_a_stateful_task_commits(
    zk_store: ZkStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topology = build_wordcount(tmp_path / "input", queues=2)
    topology_id = submit(zk_store, ClusterConfig(root=tmp_path / "cluster"), topology, workers=1)
    keyed_task = read_storm(zk_store, topology_id).stateful_tasks[0]
    answers = iter([{"how": 1}, {"how": 2}])
    asked: list[float] = []

    def query_state(store: ZkStore, name: str, query: str, keys: Any, query_config: Any = None) -> dict[str, Any]:
        asked.append(time.monotonic())
        return next(answers)

    def commit() -> None:
        path = ZkPaths.transactional_task(topology_id, keyed_task)
        zk_store.set_json(path, TransactionalRecord(committed_txid=0).to_json_obj())

    monkeypatch.setattr(local_stack, "query_state", query_state)
    started = time.monotonic()
    _later(0.3, commit)
    assert wait_for_counts(zk_store, topology.name, "words", {"how": 2}, timeout_s=TIMER_S / 2) == {"how": 2}
    assert len(asked) == 2 and asked[1] - started < 10
