"""A TaskRunner for one task of a submitted topology, driven by hand in the runtime tests."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import duckdb

from stream_ops.config import ClusterConfig
from stream_ops.coordination.store import ZkStore
from stream_ops.nimbus.submission import read_storm
from stream_ops.runtime.task_runner import RunnerSettings, TaskRunner
from stream_ops.runtime.user_code import load_user_code
from stream_ops.topology.layout import TopologyLayout


def make_runner(
    store: ZkStore, spark: Any, cluster: ClusterConfig, topology_id: str, worker_id: str, *, stage: int | str, **settings: Any
) -> TaskRunner:
    """The runner of queue 0 of ``stage`` (an index or a stage name), always connected; its
    plan is bound to the submission's verified code archive, as a worker's is."""
    plan = load_user_code(cluster, read_storm(store, topology_id), spark)
    index = stage if isinstance(stage, int) else next(s.index for s in plan.stages if s.name == stage)
    connected = threading.Event()
    connected.set()
    return TaskRunner(
        zk=store,
        spark=spark,
        layout=TopologyLayout(cluster, topology_id),
        plan=plan,
        task=plan.task_for(index, 0),
        worker_id=worker_id,
        settings=RunnerSettings(commit_wait_s=2, **settings),
        connected=connected,
    )


def pause_commits(monkeypatch: Any, worker_id: str, *, txid: int | None = None) -> tuple[threading.Event, threading.Event]:
    """Make ``worker_id``'s runners stop right before their ZooKeeper commit (of ``txid``, or
    any): returns (paused, resume) events; the commit goes on once ``resume`` is set."""
    from stream_ops.runtime import task_runner as task_runner_module

    paused, resume = threading.Event(), threading.Event()
    real_commit = task_runner_module.commit

    def pausing_commit(store: Any, ownership: Any, committing: int, **kwargs: Any) -> Any:
        if ownership.worker_id == worker_id and txid in (None, committing):
            paused.set()
            resume.wait(30)
        return real_commit(store, ownership, committing, **kwargs)

    monkeypatch.setattr(task_runner_module, "commit", pausing_commit)
    return paused, resume


def crash_after_publish(monkeypatch: Any, txid: int, error: BaseException) -> None:
    """Make the first publish of ``txid`` raise ``error`` right after it published: a task
    that "crashes" after its ZooKeeper commit, before Spark logs the batch done."""
    crashed = threading.Event()
    real_publish = TaskRunner._publish

    def publish_then_crash(self: TaskRunner, committed: int, epoch: int) -> None:
        real_publish(self, committed, epoch)
        if committed == txid and not crashed.is_set():
            crashed.set()
            raise error

    monkeypatch.setattr(TaskRunner, "_publish", publish_then_crash)


def read_parquet(path: Path, columns: str) -> list[tuple]:
    """The sorted rows of ``columns`` of every Parquet file under ``path`` (a sink), or []."""
    if not path.exists() or not list(path.rglob("*.parquet")):
        return []
    return sorted(duckdb.sql(f"select {columns} from read_parquet('{path}/**/*.parquet')").fetchall())
