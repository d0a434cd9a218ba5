"""One topology's failing tasks cost its worker nothing but those tasks (issue 17, item 7).

A real worker (real ZooKeeper, real Spark) runs a healthy word count beside two broken
topologies: one whose State factory raises ``sqlite3.OperationalError`` when the task starts,
one whose updater raises it in every batch (the task's query fails). The worker keeps running,
the word count stays exact, each failure is in ``/errors/{id}/{task}``, ``stream-ops status``
and the Dagster observations, the worker backs off and quarantines each broken task after N
tries, and clearing the record makes it try again.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from click.testing import CliRunner
from failing_state import CountingLockedUpdater, LockedDB, UnopenableDB, build_failing

from stream_ops.cli import main
from stream_ops.config import ClusterConfig, ZooKeeperConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.examples.wordcount import build_wordcount
from stream_ops.local_stack import expected_word_counts, wait_for_counts
from stream_ops.nimbus import describe_topology, submit
from stream_ops.orchestration.observations import observe_topology
from stream_ops.ports import free_port
from stream_ops.runtime.task_failures import FailurePolicy, clear_task_errors, read_task_error
from stream_ops.runtime.worker import Worker, WorkerSettings
from stream_ops.topics.producer import produce

QUARANTINE_AFTER = 3
PERSIST_TASK = 1  # task 0 reads the sentences, task 1 is the partition_persist stage
SENTENCES = ["how are you", "nice to meet you", "what a good day"]


@pytest.fixture
def worker(zk_config: ZooKeeperConfig, zk_store: ZkStore, tmp_path: Path, spark: Any, wait_until: Any) -> Iterator[Worker]:
    """One in-process worker with a short backoff, registered."""
    settings = WorkerSettings(
        host="127.0.0.1",
        port=free_port(),
        trigger_seconds=0.2,
        heartbeat_interval_s=0.5,
        failures=FailurePolicy(initial_backoff_s=0.5, max_backoff_s=2.0, quarantine_after=QUARANTINE_AFTER),
    )
    w = Worker(zk_config, ClusterConfig(root=tmp_path / "cluster"), settings, spark_factory=lambda: spark)
    stop = threading.Event()
    thread = threading.Thread(target=w.run, args=(stop,), daemon=True)
    thread.start()
    w.thread = thread  # type: ignore[attr-defined]
    wait_until(lambda: w.worker_id in zk_store.children(ZkPaths.WORKERS), 60, "the worker to register")
    try:
        yield w
    finally:
        stop.set()
        thread.join(60)


def _attempts(db: Path) -> int:
    path = db / "attempts"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _quarantined(store: ZkStore, topology_id: str) -> bool:
    record = read_task_error(store, (topology_id, PERSIST_TASK))
    return record is not None and record.quarantined


def test_failing_state_beside_a_healthy_topology(
    worker: Worker,
    zk_config: ZooKeeperConfig,
    zk_store: ZkStore,
    tmp_path: Path,
    wait_until: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="stream_ops.runtime.worker")
    caplog.set_level(logging.INFO, logger="stream_ops.runtime.failed_tasks")
    healthy = build_wordcount(tmp_path / "wordcount", queues=2)
    unopenable_db, locked_db = tmp_path / "unopenable-db", tmp_path / "locked-db"
    unopenable = build_failing(
        tmp_path / "unopenable",
        name="unopenable",
        factory=UnopenableDB(str(unopenable_db)),
        updater=CountingLockedUpdater(str(unopenable_db)),
    )
    locked = build_failing(
        tmp_path / "locked", name="locked", factory=LockedDB(str(locked_db)), updater=CountingLockedUpdater(str(locked_db))
    )
    ids = {t.name: submit(zk_store, worker.cluster, t, workers=1) for t in (healthy, unopenable, locked)}
    for topology in (healthy, unopenable, locked):
        produce(topology.chains[0].source.topic, ({"sentence": s} for s in SENTENCES))

    # The healthy topology counts exactly while the broken ones fail beside it on the same worker.
    wait_for_counts(zk_store, "wordcount", "words", expected_word_counts(SENTENCES), timeout_s=90)

    # Each broken task is tried N times with a growing wait, then quarantined.
    for name in ("unopenable", "locked"):
        wait_until(lambda name=name: _quarantined(zk_store, ids[name]), 120, f"{name}'s task to be quarantined")
    assert worker.thread.is_alive()  # type: ignore[attr-defined]
    assert _attempts(unopenable_db) == QUARANTINE_AFTER
    assert _attempts(locked_db) >= QUARANTINE_AFTER  # Spark may retry a failed batch inside one query run
    tried = _attempts(locked_db)
    time.sleep(3.0)  # longer than the largest backoff: a quarantined task is not tried again
    assert (_attempts(unopenable_db), _attempts(locked_db)) == (QUARANTINE_AFTER, tried)

    record = read_task_error(zk_store, (ids["unopenable"], PERSIST_TASK))
    assert record is not None and record.consecutive_failures == QUARANTINE_AFTER
    assert [e.attempt for e in record.errors] == list(range(1, QUARANTINE_AFTER + 1))
    assert all(e.worker_id == worker.worker_id for e in record.errors)
    assert record.last is not None
    assert record.last.reason.startswith("start failed: OperationalError: unable to open database file")
    times = [e.time for e in record.errors]
    assert times[1] - times[0] >= 0.5 and times[2] - times[1] >= 1.0, times  # 0.5 s, then doubled
    locked_record = read_task_error(zk_store, (ids["locked"], PERSIST_TASK))
    assert locked_record is not None and locked_record.last is not None
    assert "query failed" in locked_record.last.reason and "database is locked" in locked_record.last.reason

    # Each failure is logged in one line, without a traceback; the quarantine once.
    lines = [r.getMessage() for r in caplog.records if r.name == "stream_ops.runtime.failed_tasks"]
    assert sum(f"task {ids['unopenable']}/1 failed" in line for line in lines) == QUARANTINE_AFTER
    assert sum("quarantined" in line and ids["unopenable"] in line for line in lines) == 1
    assert not any(r.exc_info for r in caplog.records if r.name.startswith("stream_ops") and r.levelno >= logging.INFO)

    # status (library and CLI) and the Dagster observation show it.
    status = describe_topology(zk_store, ids["unopenable"])
    broken_task = next(t for t in status.tasks if t.task_id == PERSIST_TASK)
    assert broken_task.quarantined and broken_task.failures == QUARANTINE_AFTER
    assert "OperationalError" in (broken_task.last_error or "")
    assert [line.startswith(f"task 1 (words) quarantined after {QUARANTINE_AFTER} failures") for line in status.problems()] == [
        True
    ]
    result = CliRunner().invoke(
        main,
        [
            "--zookeeper",
            zk_config.hosts,
            "--chroot",
            zk_config.chroot,
            "--home",
            str(worker.cluster.root),
            "status",
            "unopenable",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    shown = {t["task_id"]: t for t in json.loads(result.output)["tasks"]}
    assert shown[PERSIST_TASK]["quarantined"] is True and "unable to open database file" in shown[PERSIST_TASK]["last_error"]
    observed = {o.asset_key: o.metadata for o in observe_topology(status)}
    words = observed[dg.AssetKey(["stream_ops", "unopenable", "words"])]
    assert words["quarantined_tasks"].value == [PERSIST_TASK]
    assert words["failing_tasks"].value[str(PERSIST_TASK)]["quarantined"] is True
    assert "**quarantined** start failed: OperationalError" in words["tasks"].value
    assert observed[dg.AssetKey(["stream_ops", "unopenable", "sentences"])]["failing_tasks"].value == {}
    assert describe_topology(zk_store, ids["wordcount"]).problems() == []

    # The worker still serves everything else: more sentences are counted exactly.
    more = ["how do you do"] * 3
    produce(healthy.chains[0].source.topic, ({"sentence": s} for s in more))
    wait_for_counts(zk_store, "wordcount", "words", expected_word_counts(SENTENCES + more), timeout_s=60)

    # An operator clears the quarantine (deletes the record): the worker tries the task again.
    assert clear_task_errors(zk_store, (ids["unopenable"], PERSIST_TASK))
    wait_until(lambda: _attempts(unopenable_db) > QUARANTINE_AFTER, 30, "a new try after the quarantine is cleared")
    wait_until(lambda: zk_store.exists(ZkPaths.task_errors(ids["unopenable"], PERSIST_TASK)), 30, "the new failure")
    again = read_task_error(zk_store, (ids["unopenable"], PERSIST_TASK))
    assert again is not None and not again.quarantined and again.errors[0].attempt == 1
    assert worker.thread.is_alive()  # type: ignore[attr-defined]
