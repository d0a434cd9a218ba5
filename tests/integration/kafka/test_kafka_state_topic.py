"""A keyed word count whose state topic is a Kafka topic, on a real broker, ZooKeeper and Spark.

Runners are driven by hand as in ``tests/integration/runtime/test_fencing.py`` (the state topic
is produced and read from the driver, so the shared in-process SparkSession needs no Kafka
connector). Each owner after the first runs on another worker, i.e. with no local RocksDB: it
rebuilds the counts from the Kafka partition (and a snapshot), and they must be exact.
"""

from __future__ import annotations

import logging
import shutil
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from stream_ops import OpaqueMapState, TransactionalMapState
from stream_ops.config import ClusterConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import ConfigError, OwnershipLostError, ReplayError
from stream_ops.examples.wordcount import build_wordcount
from stream_ops.hashing import encode_key
from stream_ops.kafka.client import ensure_topic
from stream_ops.kafka.embedded import EmbeddedKafka
from stream_ops.nimbus.compaction import compact_queue_locked
from stream_ops.nimbus.submission import submit
from stream_ops.runtime.standby import StandbyPool, StandbyTarget
from stream_ops.runtime.task_runner import TaskRunner
from stream_ops.state import RocksDBBackingMap, TransactionalValue
from stream_ops.state.kafka_state_topic import KafkaStateLog, KafkaStateTopic
from stream_ops.state.snapshot import latest_snapshot
from stream_ops.state.state_topic import StateTopicQueue, encode_items
from stream_ops.topology.layout import TopologyLayout

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from runners import make_runner, pause_commits

BATCHES = [["how", "are", "you", "how"], ["you", "you", "nice"], ["how", "day"], ["are", "nice", "nice"]]


def _partials(spark: Any, words: list[str]) -> Any:
    counts = Counter(words)
    return spark.createDataFrame([(encode_key([w]), n) for w, n in counts.items()], "key string, value long")


def _truth(batches: list[list[str]]) -> Counter[str]:
    return Counter(w for batch in batches for w in batch)


def _submit(admin: ZkStore, cluster: ClusterConfig, tmp_path: Path, kafka: EmbeddedKafka, state: Any = OpaqueMapState) -> str:
    topology = build_wordcount(tmp_path / "in", queues=1, state=state)
    return submit(admin, cluster, topology, workers=1, conf=KafkaStateTopic(bootstrap=kafka.bootstrap_servers).to_conf())


def _runner(store: ZkStore, spark: Any, cluster: ClusterConfig, topology_id: str, worker_id: str, **settings: Any) -> TaskRunner:
    return make_runner(store, spark, cluster, topology_id, worker_id, stage="count", **settings)


def _counts(runner: TaskRunner, words: Counter[str]) -> list[Any]:
    return runner.lookup([(w,) for w in sorted(words)])


def _log(runner: TaskRunner) -> KafkaStateLog:
    assert runner.state is not None and isinstance(runner.state.log, KafkaStateLog)
    return runner.state.log


@pytest.mark.parametrize("state", [OpaqueMapState, TransactionalMapState])
def test_counts_restore_exactly_from_kafka_with_a_zombies_writes_ignored(spark, zk_config, tmp_path, kafka, monkeypatch, state):
    cluster = ClusterConfig(root=tmp_path / "cluster")
    with ZkStore.connect(zk_config) as admin, ZkStore.connect(zk_config) as store_a, ZkStore.connect(zk_config) as store_b:
        topology_id = _submit(admin, cluster, tmp_path, kafka, state)
        a = _runner(store_a, spark, cluster, topology_id, "host-a:1")
        a.prepare()
        a.process_batch(_partials(spark, BATCHES[0]), 0)

        # A appends txid 1 to Kafka, then pauses right before its ZooKeeper commit.
        paused, resume = pause_commits(monkeypatch, "host-a:1", txid=1)
        errors: list[BaseException] = []

        def run_a() -> None:
            try:
                a.process_batch(_partials(spark, BATCHES[1]), 1)
            except BaseException as e:  # noqa: BLE001 - the test inspects it
                errors.append(e)

        thread = threading.Thread(target=run_a)
        thread.start()
        assert paused.wait(30)

        # A's session "expires"; B takes the task over on another worker (no local store: it
        # rebuilds from the partition, where A's uncommitted txid 1 lies) and redoes txid 1.
        admin.delete(ZkPaths.owner(topology_id, a.task.task_id))
        b = _runner(store_b, spark, cluster, topology_id, "host-b:2")
        b.prepare()
        assert b.state is not None and b.state.rebuilt and b.ownership.epoch == a.ownership.epoch + 1
        assert _counts(b, _truth(BATCHES[:1])) == [_truth(BATCHES[:1])[w] for w in sorted(_truth(BATCHES[:1]))]
        b.process_batch(_partials(spark, BATCHES[1]), 1)
        b.process_batch(_partials(spark, BATCHES[2]), 2)
        b.process_batch(_partials(spark, BATCHES[2]), 2)  # Spark re-delivers a committed batch: step 1 skips it

        resume.set()
        thread.join(30)
        assert len(errors) == 1 and isinstance(errors[0], OwnershipLostError)
        # The zombie produces late, after B's commits: its epoch's txid 2, and a txid nobody commits.
        bogus = encode_items([(("how",), TransactionalValue(2, 1000)), (("zombie",), TransactionalValue(2, 1))])
        _log(a).append_batch(a.task.task_id, 2, a.ownership.epoch, bogus)
        _log(a).append_batch(a.task.task_id, 3, a.ownership.epoch, bogus)

        truth = _truth(BATCHES[:3])
        assert _counts(b, truth) == [truth[w] for w in sorted(truth)]
        b.stop()
        a._close_state()

        layout = TopologyLayout(cluster, topology_id)
        assert layout.state_topic(b.stage).files(0) == []  # nothing went to the file state topic
        shutil.rmtree(layout.local_store_dir("host-b:2", b.task.task_id))  # the task moves on

        c = _runner(admin, spark, cluster, topology_id, "host-c:3")
        c.prepare()
        assert c.state is not None and c.state.rebuilt
        assert _counts(c, truth) == [truth[w] for w in sorted(truth)]
        assert c.lookup([("zombie",)]) == [None]
        c.stop()


def test_restore_from_a_snapshots_offset_plus_the_tail_and_a_standby_tails_the_partition(
    spark, zk_config, tmp_path, kafka, caplog
):
    cluster = ClusterConfig(root=tmp_path / "cluster")
    with ZkStore.connect(zk_config) as admin:
        topology_id = _submit(admin, cluster, tmp_path, kafka)
        layout = TopologyLayout(cluster, topology_id)
        a = _runner(admin, spark, cluster, topology_id, "host-a:1")
        a.prepare()
        stage, task_id = a.stage, a.task.task_id
        snapshot_dir = layout.snapshot_dir(stage, 0)
        standby = StandbyPool(admin, "host-s:9")
        standby.update(
            {
                (topology_id, task_id): StandbyTarget(
                    store_dir=layout.local_store_dir("host-s:9", task_id),
                    queue=StateTopicQueue(layout.state_topic(stage), 0),
                    snapshot_dir=snapshot_dir,
                )
            }
        )
        a.process_batch(_partials(spark, BATCHES[0]), 0)
        standby.sync_all()  # rebuilt from the partition (no snapshot yet)
        a.process_batch(_partials(spark, BATCHES[1]), 1)
        standby.sync_all()  # txid 1 only, read from where the last poll stopped

        done = compact_queue_locked(admin, layout, a.plan, stage, 0)
        snapshot = latest_snapshot(snapshot_dir)
        assert done.result is not None and snapshot is not None and (snapshot.txid, snapshot.epoch) == (1, 1)
        low, high = _log(a).partition.watermarks()
        assert snapshot.offset == low > 0 and done.result.deleted_files == low  # the covered records are gone

        a.process_batch(_partials(spark, BATCHES[2]), 2)
        a.process_batch(_partials(spark, BATCHES[3]), 3)
        with caplog.at_level(logging.INFO, "stream_ops.state.kafka_state_topic"):
            standby.sync_all()  # the tail since its last poll, above the truncation: no rebuild
        assert "applied the state-topic tail txid 2..3 from kafka:" in caplog.text
        a.stop()
        standby.close()

        truth = _truth(BATCHES)
        b = _runner(admin, spark, cluster, topology_id, "host-b:2")
        b.prepare()  # snapshot at txid 1 + the partition from its offset: txids 2 and 3
        assert b.state is not None and b.state.rebuilt
        assert _counts(b, truth) == [truth[w] for w in sorted(truth)]
        b.stop()

        s = _runner(admin, spark, cluster, topology_id, "host-s:9")
        s.prepare()  # the standby's warm store is current: no rebuild, no tail
        assert s.state is not None and not s.state.rebuilt and s.state.tail_keys is None
        assert _counts(s, truth) == [truth[w] for w in sorted(truth)]
        s.stop()


def _direct_log(kafka: EmbeddedKafka, topic: str) -> KafkaStateLog:
    return KafkaStateTopic(bootstrap=kafka.bootstrap_servers, timeout_s=20).log(topic, 0, partitions=1)


def test_a_topic_that_could_drop_state_entries_is_refused(kafka, topic_name):
    ensure_topic(kafka.bootstrap_servers, topic_name, partitions=1, topic_config={"cleanup.policy": "compact"})
    log = _direct_log(kafka, topic_name)
    try:
        with pytest.raises(ConfigError, match="cleanup.policy"):
            log.append_batch(0, 0, 1, encode_items([(("a",), TransactionalValue(0, 1))]))
    finally:
        log.close()


def test_a_partition_truncated_past_every_snapshot_is_an_error_not_an_empty_state(kafka, topic_name, tmp_path):
    log = _direct_log(kafka, topic_name)
    try:
        for txid in range(3):
            log.append_batch(0, txid, 1, encode_items([(("a",), TransactionalValue(txid, txid))]))
        with RocksDBBackingMap(tmp_path / "db") as store:
            assert log.rebuild(store, 2, 1, snapshot_dir=tmp_path / "snapshots") == 1
            assert store.applied_marker() == (2, 1)
        log.partition.truncate(2)  # by hand: no snapshot covers it
        with RocksDBBackingMap(tmp_path / "db2") as store, pytest.raises(ReplayError, match="truncated to offset 2"):
            log.rebuild(store, 2, 1, snapshot_dir=tmp_path / "snapshots")
    finally:
        log.close()
