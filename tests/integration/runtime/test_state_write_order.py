"""The order of a keyed batch's state writes: state topic, ZooKeeper commit, then RocksDB.

A failure of either write must leave a local store the next start can use: never ahead of the
state topic or of the commit, at worst behind the commit (caught up from the state-topic tail).
"""

from __future__ import annotations

import pytest
from runners import make_runner

from stream_ops.config import ClusterConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import StateError
from stream_ops.examples.wordcount import build_wordcount
from stream_ops.hashing import encode_key
from stream_ops.nimbus.submission import submit
from stream_ops.state.rocksdb_backing import RocksDBBackingMap
from stream_ops.state.state_log import FileStateLog


def _partials(spark, counts: dict[str, int]):
    return spark.createDataFrame([(encode_key([w]), n) for w, n in counts.items()], "key string, value long")


def _committed_txid(store: ZkStore, topology_id: str, task_id: int) -> int:
    return store.get_json(ZkPaths.transactional_task(topology_id, task_id))[0]["committed_txid"]


def test_a_rocksdb_write_that_keeps_failing_after_the_commit_is_caught_up_at_the_next_start(
    spark, zk_config, tmp_path, monkeypatch, wait_until
):
    cluster = ClusterConfig(root=tmp_path / "cluster")
    real_write = RocksDBBackingMap._write_batch

    def write_failing(store, action, batch):
        raise StateError(f"state store {store.path}: could not {action}: simulated: the disk is gone")

    with ZkStore.connect(zk_config) as admin:
        topology_id = submit(admin, cluster, build_wordcount(tmp_path / "in", queues=1), workers=1)
        a = make_runner(admin, spark, cluster, topology_id, "host-a:1", stage=1)
        a.prepare()
        a.process_batch(_partials(spark, {"how": 2}), 0)
        assert a.lookup([("how",)]) == [2]  # also waits for txid 0's store write, before the fault
        monkeypatch.setattr(RocksDBBackingMap, "_write_batch", write_failing)  # the write and every catch-up
        a.process_batch(_partials(spark, {"how": 1, "you": 1}), 1)  # committed; RocksDB write fails after
        assert _committed_txid(admin, topology_id, a.task.task_id) == 1
        wait_until(lambda: a.failure() is not None, 30, "the task to fail")
        with pytest.raises(StateError, match="catches the store up"):  # and so does its next batch
            a.process_batch(_partials(spark, {"you": 5}), 2)
        monkeypatch.setattr(RocksDBBackingMap, "_write_batch", real_write)
        a.stop()
        assert _committed_txid(admin, topology_id, a.task.task_id) == 1

        again = make_runner(admin, spark, cluster, topology_id, "host-a:1", stage=1)  # same worker: same store
        again.prepare()
        assert again.state is not None and not again.state.rebuilt and again.state.tail_keys == 2
        assert again.state.store.applied_marker() == (1, again.ownership.epoch - 1)
        assert again.lookup([("how",), ("you",)]) == [3, 1]
        again.stop()


def test_a_failed_state_topic_append_leaves_rocksdb_at_the_committed_batch(spark, zk_config, tmp_path, monkeypatch):
    cluster = ClusterConfig(root=tmp_path / "cluster")
    real_append = FileStateLog.append_batch

    def append_failing_txid_1(log, task_id, txid, epoch, encoded):
        if txid == 1:
            raise OSError("simulated: no space left on the state topic's disk")
        return real_append(log, task_id, txid, epoch, encoded)

    with ZkStore.connect(zk_config) as admin:
        topology_id = submit(admin, cluster, build_wordcount(tmp_path / "in", queues=1), workers=1)
        a = make_runner(admin, spark, cluster, topology_id, "host-a:1", stage=1)
        a.prepare()
        a.process_batch(_partials(spark, {"how": 2}), 0)
        monkeypatch.setattr(FileStateLog, "append_batch", append_failing_txid_1)
        with pytest.raises(OSError, match="no space left"):
            a.process_batch(_partials(spark, {"how": 1, "you": 1}), 1)
        monkeypatch.undo()
        assert _committed_txid(admin, topology_id, a.task.task_id) == 0
        assert a.state is not None and a.state.store.applied_marker() == (0, a.ownership.epoch)
        assert a.lookup([("how",), ("you",)]) == [2, None]
        a.stop()

        again = make_runner(admin, spark, cluster, topology_id, "host-a:1", stage=1)
        again.prepare()  # the store is exactly the committed state: reused, nothing replayed
        assert again.state is not None and not again.state.rebuilt and again.state.tail_keys is None
        again.process_batch(_partials(spark, {"how": 1, "you": 1}), 1)
        assert again.lookup([("how",), ("you",)]) == [3, 1]
        again.stop()
