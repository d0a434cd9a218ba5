"""Two runners that both believe they own a task: the zombie can write nothing that counts.

Runner A is paused in the middle of a batch (after its state-topic write, before its
ZooKeeper commit). Its ownership is lost as a session expiry would lose it, runner B takes
the task over under a higher epoch and processes the same batches; then A resumes. A's commit
is refused, A answers no state query any more, B's counts are exact, and a third owner that rebuilds from the state topic gets
the same counts although A's files for the same txid are still there.
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from runners import make_runner, pause_commits

from stream_ops import OpaqueMapState, TransactionalMapState
from stream_ops.config import ClusterConfig, ZooKeeperConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import OwnershipLostError, StateNotReadyError
from stream_ops.examples.wordcount import build_wordcount
from stream_ops.hashing import encode_key
from stream_ops.nimbus.dist_store import load_submission
from stream_ops.nimbus.submission import read_storm, submit
from stream_ops.runtime.task_runner import RunnerSettings, TaskRunner
from stream_ops.topology.layout import TopologyLayout

BATCHES = [["how", "are", "you", "how"], ["you", "you", "nice"], ["how", "day"]]


def _shuffle_df(spark, words):
    counts = Counter(words)
    return spark.createDataFrame([(encode_key([w]), n) for w, n in counts.items()], "key string, value long")


def _runner(store, spark, cluster, topology_id, worker_id):
    return make_runner(store, spark, cluster, topology_id, worker_id, stage=1)


@pytest.mark.parametrize("state", [OpaqueMapState, TransactionalMapState])
def test_paused_zombie_cannot_corrupt_state(spark, zk_config: ZooKeeperConfig, tmp_path, monkeypatch, state):
    cluster = ClusterConfig(root=tmp_path / "cluster")
    topology = build_wordcount(tmp_path / "in", queues=1, state=state)
    with ZkStore.connect(zk_config) as admin, ZkStore.connect(zk_config) as store_a, ZkStore.connect(zk_config) as store_b:
        topology_id = submit(admin, cluster, topology, workers=1)
        a = _runner(store_a, spark, cluster, topology_id, "host-a:1")
        a.prepare()
        a.process_batch(_shuffle_df(spark, BATCHES[0]), 0)

        # A pauses inside batch 1, right before its ZooKeeper commit.
        paused, resume = pause_commits(monkeypatch, "host-a:1", txid=1)
        errors: list[BaseException] = []

        def run_a():
            try:
                a.process_batch(_shuffle_df(spark, BATCHES[1]), 1)
            except BaseException as e:  # noqa: BLE001 - the test inspects it
                errors.append(e)

        thread = threading.Thread(target=run_a)
        thread.start()
        assert paused.wait(30)
        # Batch 1 is not committed and not in A's RocksDB; its commit is in flight, so a state
        # query cannot know whether ZooKeeper shows it already: after the commit wait it is
        # refused (retryable), never answered from a store that may be behind the commit.
        probe = [("how",), ("you",), ("nice",)]
        with pytest.raises(StateNotReadyError, match="still being written"):
            a.lookup(probe)

        # A's session "expires": its ephemeral owner node goes. B takes over and redoes batch 1.
        admin.delete(ZkPaths.owner(topology_id, a.task.task_id))
        b = _runner(store_b, spark, cluster, topology_id, "host-b:2")
        b.prepare()
        assert b.ownership.epoch == a.ownership.epoch + 1
        b.process_batch(_shuffle_df(spark, BATCHES[1]), 1)
        b.process_batch(_shuffle_df(spark, BATCHES[2]), 2)

        resume.set()
        thread.join(30)
        assert len(errors) == 1 and isinstance(errors[0], OwnershipLostError)
        with pytest.raises(StateNotReadyError, match="lost the task to a newer owner"):
            a.lookup(probe)  # batch 0's counts are behind B's commits: the zombie answers nothing

        truth = Counter(w for batch in BATCHES for w in batch)
        keys = [(w,) for w in sorted(truth)]
        assert b.lookup(keys) == [truth[w] for w in sorted(truth)]
        b.stop()
        a._close_state()

        # A third owner rebuilds from the state topic, where A's uncommitted (1, epoch 1) file lies too.
        state_files = sorted(p.name for p in TopologyLayout(cluster, topology_id).state_topic(b.stage).files(0))
        assert any("-x000000000001-e000001" in name for name in state_files), state_files
        c = _runner(admin, spark, cluster, topology_id, "host-c:3")
        c.prepare()
        assert c.state is not None and c.state.rebuilt
        assert c.lookup(keys) == [truth[w] for w in sorted(truth)]
        c.stop()


def test_source_stage_zombie_publishes_nothing(spark, zk_config: ZooKeeperConfig, tmp_path, monkeypatch):
    cluster = ClusterConfig(root=tmp_path / "cluster")
    topology = build_wordcount(tmp_path / "in", queues=1)
    with ZkStore.connect(zk_config) as admin, ZkStore.connect(zk_config) as store_a:
        topology_id = submit(admin, cluster, topology, workers=1)
        storm = read_storm(admin, topology_id)
        plan = load_submission(cluster.resolved_dist_dir(), storm).plan
        source_task = next(t for t in plan.tasks if t.stage == 0)
        connected = threading.Event()
        connected.set()
        a = TaskRunner(
            zk=store_a,
            spark=spark,
            layout=TopologyLayout(cluster, topology_id),
            plan=plan,
            task=source_task,
            worker_id="host-a:1",
            settings=RunnerSettings(),
            connected=connected,
        )
        a.prepare()
        admin.delete(ZkPaths.owner(topology_id, source_task.task_id))  # ownership lost before the commit
        df = spark.createDataFrame([("how are you", None)], "sentence string, _corrupt_record string")
        with pytest.raises(OwnershipLostError):
            a.process_batch(df, 0)
        shuffle = TopologyLayout(cluster, topology_id).shuffle_topic(plan.stage(1))
        assert shuffle.files(0) == []
