"""A committed batch's RocksDB write that fails or lags: state queries never answer values older
than the committed txid (issue 31, item 1).

The store is written after the ZooKeeper commit, on the task's I/O thread. Each test here makes
that write fail or wait at the store's one write seam (``RocksDBBackingMap._write_batch``, as
RocksDB reports an I/O error) and then asks the task: it answers the committed values or
refuses with the retryable ``StateNotReadyError``, never the previous txid's values (the bug:
``[2, None]`` where the committed truth was ``[3, 1]``). A failed write is repaired from the
state topic at once; one that cannot be fails the task through the worker's failure handling
(``/errors``, backoff), and its next start catches the store up.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from runners import make_runner

from stream_ops.config import ClusterConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import StateError, StateNotReadyError
from stream_ops.examples.wordcount import build_wordcount
from stream_ops.hashing import encode_key
from stream_ops.local_stack import expected_word_counts, wait_for_counts
from stream_ops.nimbus.submission import submit
from stream_ops.runtime.task_failures import read_task_error
from stream_ops.runtime.task_runner import TaskRunner
from stream_ops.state.rocksdb_backing import RocksDBBackingMap
from stream_ops.topics.producer import produce
from stream_ops.topology.layout import TopologyLayout

PROBE = [("how",), ("you",)]


def _partials(spark: Any, counts: dict[str, int]) -> Any:
    return spark.createDataFrame([(encode_key([w]), n) for w, n in counts.items()], "key string, value long")


def _eio(db: Any) -> None:
    raise Exception("IO error: While appending to file: 000012.log: Input/output error")  # what rocksdict raises


class WriteFault:
    """The writes of one store, at its write seam: ``fail`` of the next ones fail as a disk
    error does, and while ``hold`` is clear each write waits (``held`` says one does)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, store: RocksDBBackingMap) -> None:
        self.store = store
        self.real = store._write_batch
        self.fail: float = 0
        self.failed: list[str] = []
        self.hold = threading.Event()
        self.hold.set()
        self.held = threading.Event()
        monkeypatch.setattr(store, "_write_batch", self._write)

    def _write(self, action: str, batch: Any) -> None:
        if not self.hold.is_set():
            self.held.set()
            assert self.hold.wait(60), "the test never released the held write"
        if len(self.failed) < self.fail:
            self.failed.append(action)
            self.store._call(action, _eio)
        self.real(action, batch)


def _answer(runner: TaskRunner, timeout_s: float = 30.0) -> list[Any]:
    """The runner's answer to PROBE once it gives one; each refusal must be StateNotReadyError."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return runner.lookup(PROBE)
        except StateNotReadyError:
            if time.monotonic() > deadline:
                raise


def _wait(predicate: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def cluster(tmp_path) -> ClusterConfig:
    return ClusterConfig(root=tmp_path / "cluster")


def test_a_write_that_fails_once_is_re_applied_from_the_state_topic_and_never_read_stale(
    spark, zk_config, cluster, tmp_path, monkeypatch
):
    with ZkStore.connect(zk_config) as admin:
        topology_id = submit(admin, cluster, build_wordcount(tmp_path / "in", queues=1), workers=1)
        a = make_runner(admin, spark, cluster, topology_id, "host-a:1", stage=1)
        a.prepare()
        a.process_batch(_partials(spark, {"how": 2}), 0)
        assert a.lookup(PROBE) == [2, None]  # also waits for txid 0's store write, before the fault
        assert a.state is not None and a.ownership is not None
        fault = WriteFault(monkeypatch, a.state.store)
        fault.fail = 1
        a.process_batch(_partials(spark, {"how": 1, "you": 1}), 1)  # committed; its store write fails once

        assert a.lookup(PROBE) == [3, 1]  # the old code answered [2, None] here
        assert fault.failed == ["write"], "the batch's own write failed, the catch-up from the state topic did not"
        assert a.failure() is None and a.state.store.applied_marker() == (1, a.ownership.epoch)
        a.process_batch(_partials(spark, {"how": 1, "you": 1}), 1)  # Spark re-delivers the committed batch
        assert a.lookup(PROBE) == [3, 1]
        a.process_batch(_partials(spark, {"you": 5}), 2)
        assert a.lookup(PROBE) == [3, 6]
        a.stop()

        again = make_runner(admin, spark, cluster, topology_id, "host-a:1", stage=1)
        again.prepare()  # the repaired store is exactly the committed state: reused as it is
        assert again.state is not None and not again.state.rebuilt and again.state.tail_keys is None
        assert again.lookup(PROBE) == [3, 6]
        again.stop()


def test_a_write_slower_than_the_commit_wait_is_refused_not_read_stale(spark, zk_config, cluster, tmp_path, monkeypatch):
    with ZkStore.connect(zk_config) as admin:
        topology_id = submit(admin, cluster, build_wordcount(tmp_path / "in", queues=1), workers=1)
        a = make_runner(admin, spark, cluster, topology_id, "host-a:1", stage=1)
        a.settings = dataclasses.replace(a.settings, commit_wait_s=0.3)
        a.prepare()
        a.process_batch(_partials(spark, {"how": 2}), 0)
        assert a.lookup(PROBE) == [2, None]  # also waits for txid 0's store write, before the fault
        assert a.state is not None
        fault = WriteFault(monkeypatch, a.state.store)
        fault.hold.clear()
        a.process_batch(_partials(spark, {"how": 1, "you": 1}), 1)  # committed; its store write waits
        assert fault.held.wait(30)

        with pytest.raises(StateNotReadyError, match="txid 1 is still being written"):
            a.lookup(PROBE)  # the old code answered [2, None] after the wait
        fault.hold.set()
        assert _answer(a) == [3, 1]
        assert a.failure() is None
        a.stop()


def test_a_write_that_keeps_failing_fails_the_task_and_is_never_read(spark, zk_config, cluster, tmp_path, monkeypatch):
    with ZkStore.connect(zk_config) as admin:
        topology_id = submit(admin, cluster, build_wordcount(tmp_path / "in", queues=1), workers=1)
        a = make_runner(admin, spark, cluster, topology_id, "host-a:1", stage=1)
        a.prepare()
        a.process_batch(_partials(spark, {"how": 2}), 0)
        assert a.lookup(PROBE) == [2, None]  # also waits for txid 0's store write, before the fault
        assert a.state is not None
        fault = WriteFault(monkeypatch, a.state.store)
        fault.fail = math.inf
        a.process_batch(_partials(spark, {"how": 1, "you": 1}), 1)

        _wait(lambda: a.failure() is not None, "the task to fail")
        failure = a.failure() or ""
        assert failure.startswith("StateStoreBehindError: ") and "could not be brought to committed txid 1" in failure
        assert "Input/output error" in failure
        assert fault.failed == ["write", "apply a tail", "apply a tail", "apply a tail"]
        assert not a.is_running()
        with pytest.raises(StateNotReadyError, match="the task is failing"):
            a.lookup(PROBE)
        with pytest.raises(StateError, match="catches the store up"):
            a.process_batch(_partials(spark, {"you": 5}), 2)
        a.stop()


def test_a_superseded_owner_whose_write_failed_answers_nothing(spark, zk_config, cluster, tmp_path, monkeypatch):
    with ZkStore.connect(zk_config) as admin, ZkStore.connect(zk_config) as store_a:
        topology_id = submit(admin, cluster, build_wordcount(tmp_path / "in", queues=1), workers=1)
        a = make_runner(store_a, spark, cluster, topology_id, "host-a:1", stage=1)
        a.prepare()
        a.process_batch(_partials(spark, {"how": 2}), 0)
        assert a.lookup(PROBE) == [2, None]  # also waits for txid 0's store write, before the fault
        assert a.state is not None
        fault = WriteFault(monkeypatch, a.state.store)
        fault.hold.clear()
        fault.fail = 1
        a.process_batch(_partials(spark, {"how": 1, "you": 1}), 1)  # committed; its store write waits, then fails
        assert fault.held.wait(30)

        # A's session "expires"; B takes the task over, rebuilds txid 1 and commits txid 2.
        admin.delete(ZkPaths.owner(topology_id, a.task.task_id))
        b = make_runner(admin, spark, cluster, topology_id, "host-b:2", stage=1)
        b.prepare()
        b.process_batch(_partials(spark, {"you": 5}), 2)
        assert b.lookup(PROBE) == [3, 6]

        fault.hold.set()  # A's write fails; its catch-up from the state topic works, but A no longer owns the task
        _wait(lambda: a.failure() is not None, "the superseded owner's task to fail")
        assert (a.failure() or "").startswith("OwnershipLostError: ")
        with pytest.raises(StateNotReadyError):
            a.lookup(PROBE)  # neither [2, None] (behind its own commit) nor [3, 1] (behind B's)
        b.stop()
        a.stop(release_ownership=False)


def test_a_worker_fails_the_task_at_once_and_its_next_start_counts_exactly(
    worker_pool, zk_store, tmp_path, monkeypatch, wait_until
):
    """The worker's failure handling sees the task fail without waiting for another batch
    (``/errors`` names the cause); its next start catches the store up and counts exactly."""
    first, second = ["how are you"], ["you you"]
    worker = worker_pool.start()
    wordcount = build_wordcount(tmp_path / "in", queues=1)
    topology_id = submit(zk_store, worker_pool.cluster, wordcount, workers=1)
    produce(wordcount.chains[0].source.topic, ({"sentence": s} for s in first))
    wait_for_counts(zk_store, "wordcount", "words", expected_word_counts(first), timeout_s=120)

    keyed_store = TopologyLayout(worker_pool.cluster, topology_id).local_store_dir(worker.worker_id, 1)
    real_write = RocksDBBackingMap._write_batch
    broken = threading.Event()
    broken.set()

    def write(store: RocksDBBackingMap, action: str, batch: Any) -> None:
        if broken.is_set() and store.path == keyed_store:
            store._call(action, _eio)
        real_write(store, action, batch)

    monkeypatch.setattr(RocksDBBackingMap, "_write_batch", write)
    produce(wordcount.chains[0].source.topic, ({"sentence": s} for s in second))  # the last input there is

    def failed_reason() -> str:
        record = read_task_error(zk_store, (topology_id, 1))
        return record.last.reason if record is not None and record.last is not None else ""

    wait_until(lambda: "StateStoreBehindError" in failed_reason(), 120, "the worker to record the task's failure")
    assert "could not be brought to committed txid" in failed_reason() and "Input/output error" in failed_reason()
    broken.clear()  # the disk is back: the worker starts the task again after its backoff
    wait_for_counts(zk_store, "wordcount", "words", expected_word_counts(first + second), timeout_s=120)
