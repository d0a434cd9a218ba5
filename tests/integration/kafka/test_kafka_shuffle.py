"""The shuffle between stages on Kafka at each crash point, on a real broker, real Spark and real ZooKeeper.

Runners are driven by hand as in ``test_kafka_sink.py``: upstream runners A and B own the source
task in turn (A "crashes" at one point of its commit path, or turns zombie), and a downstream
runner D reads its partition of the shuffle topic as Spark's Kafka source would, ``read_committed``
(read here with a consumer, since the shared in-process SparkSession has no Kafka connector, and
parsed by the same :func:`~stream_ops.kafka.shuffle_reader.parse_shuffle_values`). The counts D
keeps must be exact: every upstream batch read once, none doubled, a zombie's never.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from paused_commit import PausedCommit, SimulatedCrashError, crash_before_kafka_commit
from topic_reader import Message, read_messages

from stream_ops import Count, FileTopic, OpaqueMapState, Topology, Tumbling
from stream_ops.config import ClusterConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import KafkaSinkFencedError
from stream_ops.hashing import partition_for
from stream_ops.kafka.embedded import EmbeddedKafka
from stream_ops.kafka.shuffle_options import KafkaShuffle
from stream_ops.kafka.shuffle_reader import parse_shuffle_values
from stream_ops.kafka.shuffle_writer import ShuffleWriter, ensure_shuffle_topic
from stream_ops.kafka.sink_records import HEADER_TXID
from stream_ops.nimbus.submission import submit
from stream_ops.runtime import task_runner as task_runner_module
from stream_ops.runtime.stage_processors import TICK_STREAM
from stream_ops.runtime.task_runner import TaskRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from runners import make_runner

SOURCE_SCHEMA = "word string, _corrupt_record string"
BATCHES = [["how", "are", "how"], ["you", "how"], ["nice", "day", "you"]]


def _batch(spark: Any, words: list[str]) -> Any:
    return spark.createDataFrame([(w, None) for w in words], SOURCE_SCHEMA)


class Shuffled:
    """A word count submitted with its shuffle on Kafka; hands out runners of its tasks."""

    def __init__(self, zk_config: Any, spark: Any, tmp_path: Path, kafka: EmbeddedKafka) -> None:
        self.cluster = ClusterConfig(root=tmp_path / "cluster")
        self.zk_config, self.spark, self.kafka = zk_config, spark, kafka
        self.admin = ZkStore.connect(zk_config)
        self.stores: list[ZkStore] = []
        t = Topology("kafka-shuffle")
        words = t.source("words", FileTopic(tmp_path / "in", 1), schema={"word": "string"})
        t.query("counts", words.group_by("word").persistent_aggregate(Count(), out="count", state=OpaqueMapState))
        self.shuffle = KafkaShuffle(bootstrap=kafka.bootstrap_servers, timeout_s=20.0)
        self.topology_id = submit(self.admin, self.cluster, t, workers=1, conf=self.shuffle.to_conf())

    def runner(self, worker_id: str, stage: int = 0) -> TaskRunner:
        store = ZkStore.connect(self.zk_config)
        self.stores.append(store)
        runner = make_runner(store, self.spark, self.cluster, self.topology_id, worker_id, stage=stage)
        runner.prepare()
        return runner

    def crash(self, runner: TaskRunner) -> None:
        """What a SIGKILL leaves: the owner node gone with the session, nothing released."""
        self.admin.delete(ZkPaths.owner(self.topology_id, runner.task.task_id))
        runner._close_state()

    def topic(self, runner: TaskRunner) -> str:
        keyed = runner.plan.stage(1)
        return self.shuffle.topic_name(self.topology_id, keyed.index, keyed.name)

    def messages(self, runner: TaskRunner, *, committed: bool = True) -> list[Message]:
        return read_messages(self.kafka.bootstrap_servers, self.topic(runner), committed=committed)

    def rows(self, runner: TaskRunner, *, committed: bool = True) -> Counter[tuple[str, int, int]]:
        """(word, partial count, upstream txid) of every shuffled row."""
        return Counter(
            (json.loads(json.loads(m.value or b"")["key"])[0], json.loads(m.value or b"")["value"], int(m.headers[HEADER_TXID]))
            for m in self.messages(runner, committed=committed)
        )

    def downstream_counts(self, upstream: TaskRunner) -> dict[str, int]:
        """What the downstream task of queue 0 counts from its partition, read in one batch (words of other queues: None)."""
        d = self.runner("host-d:9", stage=1)
        try:
            values = [(m.value,) for m in self.messages(upstream) if m.partition == d.task.queue]
            d.process_batch(parse_shuffle_values(self.spark.createDataFrame(values, "value binary"), d.stage.input_fields), 0)
            words = sorted({w for batch in BATCHES for w in batch if self.queue_of(d, w) == d.task.queue})
            return {w: c for w, c in zip(words, d.lookup([(w,) for w in words]), strict=True) if c is not None}
        finally:
            d.stop()

    @staticmethod
    def queue_of(downstream: TaskRunner, word: str) -> int:
        return partition_for([word], downstream.stage.queues)

    def close(self) -> None:
        for store in [*self.stores, self.admin]:
            store.close()


def _partials(*batches: tuple[int, list[str]]) -> Counter[tuple[str, int, int]]:
    return Counter((w, n, txid) for txid, words in batches for w, n in Counter(words).items())


def _truth(upstream: TaskRunner) -> dict[str, int]:
    queues = upstream.plan.stage(1).queues
    truth = dict(Counter(w for batch in BATCHES for w in batch if partition_for([w], queues) == 0))
    assert truth, "no word of the test goes to queue 0"
    return truth


@pytest.fixture
def shuffled(zk_config, spark, tmp_path, kafka):
    found = Shuffled(zk_config, spark, tmp_path, kafka)
    try:
        yield found
    finally:
        found.close()


def test_a_replayed_upstream_batch_and_a_crash_before_the_zookeeper_commit_are_read_once(shuffled, spark, monkeypatch):
    a = shuffled.runner("host-a:1")
    a.process_batch(_batch(spark, BATCHES[0]), 0)
    a.process_batch(_batch(spark, BATCHES[0]), 0)  # Spark re-delivers the committed batch: a no-op
    real_commit = task_runner_module.commit

    def crashing_commit(store: Any, ownership: Any, txid: int, **kwargs: Any) -> Any:
        if ownership.worker_id == "host-a:1" and txid == 1:
            raise SimulatedCrashError("before the ZooKeeper commit")
        return real_commit(store, ownership, txid, **kwargs)

    monkeypatch.setattr(task_runner_module, "commit", crashing_commit)
    with pytest.raises(SimulatedCrashError):
        a.process_batch(_batch(spark, BATCHES[1]), 1)
    shuffled.crash(a)
    assert shuffled.rows(a) == _partials((0, BATCHES[0])), "nothing of the uncommitted txid 1 reached Kafka"

    b = shuffled.runner("host-b:2")
    b.process_batch(_batch(spark, BATCHES[1]), 1)  # Spark replays the uncommitted batch
    b.process_batch(_batch(spark, BATCHES[1]), 1)  # and re-delivers it once more after its commit
    b.process_batch(_batch(spark, BATCHES[2]), 2)
    b.stop()
    assert shuffled.rows(b) == _partials(*enumerate(BATCHES))
    assert {m.partition for m in shuffled.messages(b)} <= set(range(b.plan.stage(1).queues))
    assert shuffled.downstream_counts(b) == _truth(b)


def test_a_crash_between_the_zookeeper_and_the_kafka_commit_loses_nothing(shuffled, spark, monkeypatch):
    a = shuffled.runner("host-a:1")
    a.process_batch(_batch(spark, BATCHES[0]), 0)
    undo_crash = crash_before_kafka_commit(monkeypatch, ShuffleWriter, txid=1)
    with pytest.raises(SimulatedCrashError):
        a.process_batch(_batch(spark, BATCHES[1]), 1)
    shuffled.crash(a)
    assert ("you", 1, 1) in shuffled.rows(a, committed=False), "txid 1 sits in an open transaction"

    undo_crash()
    b = shuffled.runner("host-b:2")  # publishes committed txid 1 and delivers it, once: the recovery rule
    b.process_batch(_batch(spark, BATCHES[1]), 1)  # Spark re-delivers the committed batch: nothing more
    b.process_batch(_batch(spark, BATCHES[2]), 2)
    b.stop()
    assert shuffled.rows(b) == _partials(*enumerate(BATCHES))
    assert shuffled.rows(b, committed=False)[("you", 1, 1)] == 2, "A's aborted copy is in the log, never read"
    assert shuffled.downstream_counts(b) == _truth(b)


def test_a_zombie_upstream_owners_shuffle_transaction_is_fenced_and_never_read(shuffled, spark, monkeypatch):
    a = shuffled.runner("host-a:1")
    a.process_batch(_batch(spark, BATCHES[0]), 0)
    zombie = PausedCommit(monkeypatch, ShuffleWriter, lambda: a.process_batch(_batch(spark, BATCHES[1]), 1))
    zombie.start()
    # A committed txid 1 in ZooKeeper and holds an open shuffle transaction when it loses the task.
    shuffled.admin.delete(ZkPaths.owner(shuffled.topology_id, a.task.task_id))
    b = shuffled.runner("host-b:2")  # init_transactions fences A and aborts its transaction; B delivers txid 1
    b.process_batch(_batch(spark, BATCHES[2]), 2)
    errors = zombie.finish()
    assert len(errors) == 1 and isinstance(errors[0], KafkaSinkFencedError), errors
    b.stop()
    a._close_state()
    assert shuffled.rows(b) == _partials(*enumerate(BATCHES))
    assert shuffled.rows(b, committed=False)[("you", 1, 1)] == 2, "the zombie's copy is in the log, never read"
    assert shuffled.downstream_counts(b) == _truth(b)


def test_a_processing_time_window_task_ticks_into_its_own_partition(zk_config, spark, tmp_path, kafka):
    cluster = ClusterConfig(root=tmp_path / "cluster")
    t = Topology("kafka-ticks")
    clicks = t.source("clicks", FileTopic(tmp_path / "in", 1), schema={"user": "string"})
    clicks.window(Tumbling(5)).group_by("user").aggregate(Count(), out="n").to_parquet(tmp_path / "counts", name="counts")
    shuffle = KafkaShuffle(bootstrap=kafka.bootstrap_servers)
    with ZkStore.connect(zk_config) as store:
        topology_id = submit(store, cluster, t, workers=1, conf=shuffle.to_conf())
        runner = make_runner(store, spark, cluster, topology_id, "host-w:1", stage=1)
        runner.prepare()
        try:
            topic = shuffle.topic_name(topology_id, runner.stage.index, runner.stage.name)
            ensure_shuffle_topic(shuffle, topic, runner.stage.queues, {})  # as start_query does
            assert runner.maybe_tick(1e12)
        finally:
            runner.stop()
    messages = read_messages(kafka.bootstrap_servers, topic)
    assert [(m.partition, json.loads(m.value or b"")["stream"]) for m in messages] == [(runner.task.queue, TICK_STREAM)]
