"""``print`` of a committed batch reaches the log exactly once through a crash between the
ZooKeeper commit and the log lines, a replay and a superseded owner (issue 31, item 4).

The old ``print`` sink kept a batch's records in memory until after the publish: a process that
died after its commit lost them, and neither the next owner's start nor Spark's replay of the
committed batch printed them. Here runner A "dies" right after committing txid 1 (SystemExit,
then its ZooKeeper session closes, so its owner node goes as a killed process's does) and
runner B takes the task over.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
from runners import make_runner

from stream_ops import FileTopic, Topology
from stream_ops.config import ClusterConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import OwnershipLostError
from stream_ops.nimbus.submission import submit
from stream_ops.runtime.ownership import acquire, release
from stream_ops.runtime.stage_outputs import StageOutputs
from stream_ops.runtime.task_runner import TaskRunner

SOURCE_SCHEMA = "sentence string, _corrupt_record string"
SENTENCES = {0: "how are you", 1: "fine thanks", 2: "bye now"}


def _topology(tmp_path) -> Topology:
    t = Topology("printing")
    t.source("sentences", FileTopic(tmp_path / "in", 1), schema={"sentence": "string"}).print(name="log")
    return t


def _batch(spark: Any, txid: int) -> Any:
    return spark.createDataFrame([(SENTENCES[txid], None)], SOURCE_SCHEMA)


def _printed(caplog: pytest.LogCaptureFixture) -> Counter[str]:
    """How often each print line was logged."""
    return Counter(r.getMessage() for r in caplog.records if r.name == "stream_ops.print")


def _line(txid: int) -> str:
    return f'log task 0 txid {txid}: {{"sentence": "{SENTENCES[txid]}"}}'


def _crash_before_publish(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first publish of txid 1 (A's, right after its commit) dies: nothing of it published."""
    real, crashed = TaskRunner._publish, threading.Event()

    def publish(self: TaskRunner, txid: int, epoch: int) -> None:
        if txid == 1 and not crashed.is_set():
            crashed.set()
            raise SystemExit("simulated: the worker dies right after its ZooKeeper commit")
        real(self, txid, epoch)

    monkeypatch.setattr(TaskRunner, "_publish", publish)


def _crash_before_print(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first delivery pass after txid 1's publish (A's) dies before any line is logged."""
    real, crashed = StageOutputs.after_publish, threading.Event()

    def after_publish(self: StageOutputs, committed_txid: int, **kwargs: Any) -> None:
        if committed_txid == 1 and not crashed.is_set():
            crashed.set()
            raise SystemExit("simulated: the worker dies between its publish and its print")
        real(self, committed_txid, **kwargs)

    monkeypatch.setattr(StageOutputs, "after_publish", after_publish)


@pytest.mark.parametrize("crash", [_crash_before_publish, _crash_before_print], ids=["before-publish", "before-print"])
def test_a_batch_committed_by_an_owner_that_died_is_printed_once_by_the_next(
    spark, zk_config, tmp_path, caplog, monkeypatch, crash
):
    caplog.set_level("INFO", "stream_ops.print")
    cluster = ClusterConfig(root=tmp_path / "cluster")
    with ZkStore.connect(zk_config) as admin:
        topology_id = submit(admin, cluster, _topology(tmp_path), workers=1)
        store_a = ZkStore.connect(zk_config)
        a = make_runner(store_a, spark, cluster, topology_id, "host-a:1", stage=0)
        a.prepare()
        a.process_batch(_batch(spark, 0), 0)
        crash(monkeypatch)
        with pytest.raises(SystemExit):
            a.process_batch(_batch(spark, 1), 1)
        assert admin.get_json(ZkPaths.transactional_task(topology_id, 0))[0]["committed_txid"] == 1
        assert _printed(caplog)[_line(1)] == 0
        store_a.close()  # A's process is gone: its session, and with it its owner node

        b = make_runner(admin, spark, cluster, topology_id, "host-b:2", stage=0)
        b.prepare()  # publishes A's committed batch and prints it (the old code printed nothing)
        assert _printed(caplog)[_line(1)] == 1
        b.process_batch(_batch(spark, 1), 1)  # Spark re-delivers the committed batch: not printed again
        b.process_batch(_batch(spark, 2), 2)
        b.stop()
        a._close_state()
    assert _printed(caplog) == Counter({_line(0): 1, _line(1): 1, _line(2): 1})
    delivery = b.layout.sink_delivery_topic(b.stage, "log")
    assert delivery.files(0) == [] and list(delivery.pending_path(0).iterdir()) == [], "printed batches are removed"


def test_a_superseded_owner_prints_nothing(spark, zk_config, tmp_path, caplog, monkeypatch):
    caplog.set_level("INFO", "stream_ops.print")
    cluster = ClusterConfig(root=tmp_path / "cluster")
    with ZkStore.connect(zk_config) as admin, ZkStore.connect(zk_config) as store_a:
        topology_id = submit(admin, cluster, _topology(tmp_path), workers=1)
        a = make_runner(store_a, spark, cluster, topology_id, "host-a:1", stage=0)
        a.prepare()
        # A pauses after committing and publishing txid 1, before it prints (a GC pause, SIGSTOP).
        paused, resume = threading.Event(), threading.Event()
        real = StageOutputs.after_publish

        def pausing(self: StageOutputs, committed_txid: int, **kwargs: Any) -> None:
            if self is a.outputs and committed_txid == 1:
                paused.set()
                assert resume.wait(60)
            real(self, committed_txid, **kwargs)

        monkeypatch.setattr(StageOutputs, "after_publish", pausing)
        errors: list[BaseException] = []

        def run_a() -> None:
            try:
                a.process_batch(_batch(spark, 1), 1)
            except BaseException as e:  # noqa: BLE001 - the test inspects it
                errors.append(e)

        thread = threading.Thread(target=run_a)
        thread.start()
        assert paused.wait(60)
        # A's session "expires"; another worker takes the task (a newer epoch) while A is paused.
        admin.delete(ZkPaths.owner(topology_id, 0))
        taker = acquire(admin, topology_id, 0, "host-b:2")
        resume.set()
        thread.join(60)
        assert len(errors) == 1 and isinstance(errors[0], OwnershipLostError), errors
        assert _printed(caplog)[_line(1)] == 0, "the superseded owner logged nothing"
        # Nor does an owner ever print a batch above the txid it committed (a newer owner's).
        a.outputs.after_publish(0)
        assert _printed(caplog)[_line(1)] == 0
        release(admin, taker)

        b = make_runner(admin, spark, cluster, topology_id, "host-b:2", stage=0)
        b.prepare()  # the owner after that prints A's committed batch, once
        b.process_batch(_batch(spark, 1), 1)  # and Spark's replay of it prints nothing more
        b.stop()
        a._close_state()
    assert _printed(caplog) == Counter({_line(1): 1})
