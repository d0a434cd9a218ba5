"""Waiting until a topology runs (issue 31, item 3): ``wait_until_running`` and the ``stream-ops
wait`` / ``submit --wait`` verbs over it, against a real ZooKeeper with fake workers (real
sessions registering, owning tasks and beating; no Spark). A topology submitted before any
worker has its tasks assigned to nobody: the wait says so, and what to do, step by step."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from stream_ops.cli import main
from stream_ops.config import ZooKeeperConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import ErrorRecord, OwnerRecord, TaskError, TransactionalRecord
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import TopologyNotRunningError
from stream_ops.nimbus.assignment import reassign
from stream_ops.nimbus.submission import deactivate
from stream_ops.nimbus.waiting import wait_until_running

SHORT_S = 0.5  # a wait that is meant to time out
LONG_S = 60.0  # a wait that is meant to succeed (returns as soon as it does)


def _own(worker: Any, topology_id: str) -> None:
    """The worker takes every task assigned to it, as a real one does when it starts them."""
    for task in worker.assigned(topology_id):
        record = OwnerRecord(worker_id=worker.worker_id, epoch=1, since=time.time())
        worker.store.create_json(ZkPaths.owner(topology_id, task), record.to_json_obj(), ephemeral=True)


def _refused(store: ZkStore, name: str = "wordcount", **kwargs: Any) -> str:
    with pytest.raises(TopologyNotRunningError) as refused:
        wait_until_running(store, name, timeout_s=kwargs.pop("timeout_s", SHORT_S), poll_s=0.05, **kwargs)
    return str(refused.value)


def test_the_wait_says_what_is_missing_until_the_topology_runs(
    zk_store: ZkStore, fake_worker: Callable[[int], Any], submit_wordcount: Callable[..., str]
) -> None:
    topology_id = submit_wordcount(workers=1)

    message = _refused(zk_store)
    assert topology_id in message and "4 unassigned" in message
    assert "no worker is registered" in message and "stream-ops worker" in message
    assert "no nimbus is running" in message and "stream-ops nimbus" in message and "stream-ops rebalance wordcount" in message

    worker = fake_worker(6700)  # registers after the submission: nothing assigns it the tasks
    message = _refused(zk_store)
    assert "no worker is registered" not in message
    assert "tasks 0, 1, 2, 3 are assigned to no live worker and no nimbus is running" in message

    reassign(zk_store, topology_id)  # what `stream-ops rebalance` or a nimbus does
    message = _refused(zk_store)
    assert f"tasks 0, 1, 2, 3 are assigned to {worker.worker_id} but not started there yet" in message

    _own(worker, topology_id)
    assert "heartbeat is missing" in _refused(zk_store)

    worker.beat(topology_id)
    running = wait_until_running(zk_store, "wordcount", timeout_s=LONG_S, poll_s=0.05)
    assert running.topology_id == topology_id and [t.owner for t in running.tasks] == [worker.worker_id] * 4

    message = _refused(zk_store, committed=True)
    assert "have not committed a batch yet" in message and "tasks 0, 1, 2, 3" in message
    for task in range(4):
        zk_store.set_json(ZkPaths.transactional_task(topology_id, task), TransactionalRecord(committed_txid=0).to_json_obj())
    assert wait_until_running(zk_store, topology_id, timeout_s=LONG_S, poll_s=0.05, committed=True).tasks


def test_the_wait_returns_as_soon_as_the_tasks_run(
    zk_store: ZkStore, fake_worker: Callable[[int], Any], submit_wordcount: Callable[..., str]
) -> None:
    topology_id = submit_wordcount(workers=1)
    outcome: list[object] = []
    waiter = threading.Thread(
        target=lambda: outcome.append(_result_or_error(lambda: wait_until_running(zk_store, "wordcount", timeout_s=LONG_S))),
        daemon=True,
    )
    waiter.start()
    worker = fake_worker(6700)
    reassign(zk_store, topology_id)
    _own(worker, topology_id)
    worker.beat(topology_id)
    waiter.join(LONG_S)
    assert not waiter.is_alive() and len(outcome) == 1
    assert not isinstance(outcome[0], Exception), outcome[0]


def _result_or_error(call: Callable[[], object]) -> object:
    try:
        return call()
    except Exception as e:  # noqa: BLE001 - handed to the test thread to report
        return e


def test_waiting_cannot_help_a_deactivated_topology_or_a_quarantined_task(
    zk_store: ZkStore, fake_worker: Callable[[int], Any], submit_wordcount: Callable[..., str]
) -> None:
    worker = fake_worker(6700)
    topology_id = submit_wordcount(workers=1)
    error = TaskError(time=time.time(), worker_id=worker.worker_id, reason="OperationalError: disk full", attempt=5)
    record = ErrorRecord(errors=[error], consecutive_failures=5, quarantined=True, worker_id=worker.worker_id)
    zk_store.create_json(ZkPaths.task_errors(topology_id, 3), record.to_json_obj())
    started = time.monotonic()
    message = _refused(zk_store, timeout_s=LONG_S)
    assert time.monotonic() - started < LONG_S / 2, "a quarantine is no reason to wait out the timeout"
    assert "task 3 of" in message and "quarantined" in message and "disk full" in message
    assert "stream-ops clear-errors wordcount TASK" in message

    deactivate(zk_store, "wordcount")
    started = time.monotonic()
    assert "stream-ops activate wordcount" in _refused(zk_store, timeout_s=LONG_S)
    assert time.monotonic() - started < LONG_S / 2


@pytest.fixture
def cli(zk_config: ZooKeeperConfig, tmp_path: Path) -> Callable[..., Result]:
    def run(*args: str) -> Result:
        base = ["--zookeeper", zk_config.hosts, "--chroot", zk_config.chroot, "--home", str(tmp_path / "home")]
        return CliRunner().invoke(main, [*base, *args], catch_exceptions=False)

    return run


def test_submit_wait_and_the_wait_verb(zk_store: ZkStore, fake_worker: Callable[[int], Any], cli: Callable[..., Result]) -> None:
    submitted = cli("submit", "stream_ops.examples.wordcount:topology", "--workers", "1", "--wait", str(SHORT_S))
    assert submitted.exit_code == 1
    topology_id = submitted.stdout.strip()
    assert topology_id.startswith("wordcount-"), "the id is printed before the wait, alone on stdout"
    assert "error: topology" in submitted.stderr and "no worker is registered" in submitted.stderr

    failed = cli("wait", "wordcount", "--timeout", str(SHORT_S))
    assert failed.exit_code == 1 and "no nimbus is running" in failed.stderr and "Traceback" not in failed.output

    worker = fake_worker(6700)
    reassign(zk_store, topology_id)
    _own(worker, topology_id)
    worker.beat(topology_id)
    done = cli("wait", "wordcount", "--timeout", str(LONG_S))
    assert done.exit_code == 0, done.output
    assert done.stdout.strip() == f"{topology_id} running: 4 tasks on 1 workers"
    assert cli("wait", "--help").exit_code == 0 and "--committed" in cli("wait", "--help").stdout
