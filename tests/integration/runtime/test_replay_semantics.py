"""A partition_persist batch replayed after a crash around the user State's commit.

The State's updates stay uncommitted until the batch is committed in ZooKeeper, and the
batch's tuples stay staged until the State committed them. A crash before the State's commit
(after or before the ZooKeeper commit) loses nothing and doubles nothing for every kind: the
next owner applies the staged tuples of the committed batch. A crash right after the State's
commit, before the staged tuples are deleted, is the window where Trident's three state kinds
differ: the transactional and opaque WordCountDB recognise the txid they already applied and
end exact; the non-transactional one applies the batch twice and over-counts, which is what
at-least-once allows.
"""

from __future__ import annotations

import json

import pytest
from runners import make_runner

from stream_ops.config import ClusterConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import OwnershipLostError
from stream_ops.examples.wordcount_db import WordCountDB, build_wordcount_db
from stream_ops.hashing import encode_key
from stream_ops.nimbus.submission import submit
from stream_ops.runtime import task_runner as task_runner_module

WORDS = ["how", "are", "you", "how"]


def _runner(store, spark, cluster, topology_id, worker_id, stage_name="words"):
    return make_runner(store, spark, cluster, topology_id, worker_id, stage=stage_name)


@pytest.mark.parametrize(
    ("kind", "crash", "expected_how"),
    [
        ("transactional", "before-zookeeper-commit", 2),
        ("non-transactional", "before-zookeeper-commit", 2),
        ("transactional", "before-state-commit", 2),
        ("opaque", "before-state-commit", 2),
        ("non-transactional", "before-state-commit", 2),
        ("transactional", "after-state-commit", 2),
        ("opaque", "after-state-commit", 2),
        ("non-transactional", "after-state-commit", 4),
    ],
)
def test_replay_around_the_user_state_commit(spark, zk_config, tmp_path, monkeypatch, kind, crash, expected_how):
    cluster = ClusterConfig(root=tmp_path / "cluster")
    topology = build_wordcount_db(tmp_path / "in", kind=kind, queues=1)
    rows = [("sentences", encode_key([w]), json.dumps({"sentence": "x", "word": w})) for w in WORDS]
    with ZkStore.connect(zk_config) as admin:
        topology_id = submit(admin, cluster, topology, workers=1)
        first = _runner(admin, spark, cluster, topology_id, "host-a:1")
        first.prepare()
        state_class = type(first.user_state)
        real_state_commit = state_class.commit

        def crash_now(*args, **kwargs):
            raise OwnershipLostError(f"simulated crash {crash}")

        def commit_then_crash(self, txid):
            real_state_commit(self, txid)
            crash_now()

        if crash == "before-zookeeper-commit":
            monkeypatch.setattr(task_runner_module, "commit", crash_now)
        else:
            monkeypatch.setattr(state_class, "commit", crash_now if crash == "before-state-commit" else commit_then_crash)
        batch = spark.createDataFrame(rows, "stream string, key string, record string")
        with pytest.raises(OwnershipLostError):
            first.process_batch(batch, 0)
        first.stop()
        monkeypatch.undo()
        committed = admin.get_json(ZkPaths.transactional_task(topology_id, first.task.task_id))[0]
        assert committed["committed_txid"] == (-1 if crash == "before-zookeeper-commit" else 0)

        # The task restarts under a new owner; Spark re-delivers batch 0 with the same rows.
        assert not admin.exists(ZkPaths.owner(topology_id, first.task.task_id)), "stop() released the task"
        second = _runner(admin, spark, cluster, topology_id, "host-b:2")
        second.prepare()
        second.process_batch(batch, 0)
        second.stop()

        db = WordCountDB(str(tmp_path / "in" / "db"), kind).make_state(0, 1)
        try:
            assert db.get(["how", "are", "you"]) == [expected_how, expected_how // 2, expected_how // 2]
        finally:
            db.close()


def test_a_state_query_never_sees_a_batch_before_its_zookeeper_commit(spark, zk_config, tmp_path, monkeypatch):
    cluster = ClusterConfig(root=tmp_path / "cluster")
    topology = build_wordcount_db(tmp_path / "in", kind="transactional", queues=1)
    rows = [("sentences", encode_key([w]), json.dumps({"sentence": "x", "word": w})) for w in WORDS]
    with ZkStore.connect(zk_config) as admin:
        topology_id = submit(admin, cluster, topology, workers=1)
        runner = _runner(admin, spark, cluster, topology_id, "host-a:1")
        runner.prepare()
        reader = WordCountDB(str(tmp_path / "in" / "db"), "transactional").make_state(0, 1)
        seen_before_commit: list[list[int | None]] = []
        real_commit = task_runner_module.commit

        def reading_commit(store, ownership, txid, **kwargs):
            seen_before_commit.append(reader.get(["how"]))  # what a state query reads in the window
            return real_commit(store, ownership, txid, **kwargs)

        monkeypatch.setattr(task_runner_module, "commit", reading_commit)
        runner.process_batch(spark.createDataFrame(rows, "stream string, key string, record string"), 0)
        runner.stop()
        try:
            assert seen_before_commit == [[None]]
            assert reader.get(["how"]) == [2]
        finally:
            reader.close()
