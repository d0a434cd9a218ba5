"""The exactly-once Kafka sink at each crash point, on a real broker, real Spark and real ZooKeeper.

Runners are driven by hand as in ``tests/integration/runtime/test_sinks.py`` (the sink produces
from the driver, so the shared in-process SparkSession needs no Kafka connector). Runner A
"crashes" at one point of the commit path (its owner node deleted as a session expiry would,
its state closed), runner B takes the task over under a higher epoch, and the topic read
``read_committed`` must hold every record once. A SIGKILLed process inside a Kafka transaction
and a zombie producer fenced by the next owner are covered too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from stream_ops import FileTopic, Topology
from stream_ops.config import ClusterConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import KafkaSinkError, KafkaSinkFencedError
from stream_ops.kafka.embedded import EmbeddedKafka
from stream_ops.kafka.sink import KafkaSinkWriter
from stream_ops.kafka.sink_options import KafkaSinkSpec
from stream_ops.kafka.sink_records import HEADER_TXID
from stream_ops.nimbus.submission import submit
from stream_ops.runtime import task_runner as task_runner_module
from stream_ops.topics.delivery_topic import DeliveryTopic

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from paused_commit import PausedCommit, SimulatedCrashError, crash_before_kafka_commit
from runners import make_runner
from topic_reader import read_messages

SOURCE_SCHEMA = "word string, _corrupt_record string"
BATCHES = [["how", "are"], ["you", "how"], ["nice", "day"]]


def _topology(tmp_path: Path, kafka: EmbeddedKafka, topic: str) -> Topology:
    t = Topology("to-kafka")
    words = t.source("words", FileTopic(tmp_path / "in", 1), schema={"word": "string"})
    words.to_kafka(kafka.bootstrap_servers, topic, key="word", partitions=2, name="out")
    return t


def _batch(spark: Any, words: list[str]) -> Any:
    return spark.createDataFrame([(w, None) for w in words], SOURCE_SCHEMA)


def read_topic(kafka: EmbeddedKafka, topic: str, *, committed: bool = True) -> list[tuple[str, int]]:
    """(word, txid) of every message of ``topic``, sorted."""
    return sorted(
        (json.loads(m.value or b"")["word"], int(m.headers[HEADER_TXID]))
        for m in read_messages(kafka.bootstrap_servers, topic, committed=committed)
    )


def _expected(*batches: tuple[int, list[str]]) -> list[tuple[str, int]]:
    return sorted((w, txid) for txid, words in batches for w in words)


class Owners:
    """Submits the topology and hands out runners of its one task, each on its own session."""

    def __init__(self, zk_config: Any, spark: Any, tmp_path: Path, kafka: EmbeddedKafka, topic: str) -> None:
        self.cluster = ClusterConfig(root=tmp_path / "cluster")
        self.zk_config, self.spark = zk_config, spark
        self.admin = ZkStore.connect(zk_config)
        self.stores: list[ZkStore] = []
        self.topology_id = submit(self.admin, self.cluster, _topology(tmp_path, kafka, topic), workers=1)

    def runner(self, worker_id: str) -> Any:
        store = ZkStore.connect(self.zk_config)
        self.stores.append(store)
        runner = make_runner(store, self.spark, self.cluster, self.topology_id, worker_id, stage=0)
        runner.prepare()
        return runner

    def crash(self, runner: Any) -> None:
        """What a SIGKILL leaves: the owner node gone with the session, nothing released."""
        self.admin.delete(ZkPaths.owner(self.topology_id, runner.task.task_id))
        runner._close_state()

    def committed_txid(self, runner: Any) -> int:
        return int(self.admin.get_json(ZkPaths.transactional_task(self.topology_id, runner.task.task_id))[0]["committed_txid"])

    def close(self) -> None:
        for store in [*self.stores, self.admin]:
            store.close()


@pytest.fixture
def owners(zk_config, spark, tmp_path, kafka, topic_name):
    found = Owners(zk_config, spark, tmp_path, kafka, topic_name)
    try:
        yield found
    finally:
        found.close()


def test_a_crash_before_the_zookeeper_commit_is_replayed_and_delivered_once(owners, spark, kafka, topic_name, monkeypatch):
    a = owners.runner("host-a:1")
    a.process_batch(_batch(spark, BATCHES[0]), 0)
    real_commit = task_runner_module.commit

    def crashing_commit(store: Any, ownership: Any, txid: int, **kwargs: Any) -> Any:
        if ownership.worker_id == "host-a:1" and txid == 1:
            raise SimulatedCrashError("before the ZooKeeper commit")
        return real_commit(store, ownership, txid, **kwargs)

    monkeypatch.setattr(task_runner_module, "commit", crashing_commit)
    with pytest.raises(SimulatedCrashError):
        a.process_batch(_batch(spark, BATCHES[1]), 1)
    owners.crash(a)
    assert owners.committed_txid(a) == 0

    b = owners.runner("host-b:2")
    b.process_batch(_batch(spark, BATCHES[1]), 1)  # Spark replays the uncommitted batch
    b.process_batch(_batch(spark, BATCHES[2]), 2)
    b.stop()
    assert read_topic(kafka, topic_name) == _expected(*enumerate(BATCHES))


def test_a_crash_between_the_zookeeper_and_the_kafka_commit_is_delivered_once_by_the_next_owner(
    owners, spark, kafka, topic_name, monkeypatch
):
    a = owners.runner("host-a:1")
    a.process_batch(_batch(spark, BATCHES[0]), 0)
    undo_crash = crash_before_kafka_commit(monkeypatch, KafkaSinkWriter, txid=1)
    with pytest.raises(SimulatedCrashError):
        a.process_batch(_batch(spark, BATCHES[1]), 1)
    owners.crash(a)
    assert owners.committed_txid(a) == 1, "ZooKeeper committed txid 1 before the sink delivered it"
    assert ("you", 1) in read_topic(kafka, topic_name, committed=False), "txid 1 sits in an open transaction"

    undo_crash()
    b = owners.runner("host-b:2")  # publishes committed txid 1 and delivers it: the recovery rule
    b.process_batch(_batch(spark, BATCHES[1]), 1)  # Spark re-delivers the committed batch: nothing more
    b.process_batch(_batch(spark, BATCHES[2]), 2)
    b.stop()
    assert read_topic(kafka, topic_name) == _expected(*enumerate(BATCHES))
    uncommitted = Counter(read_topic(kafka, topic_name, committed=False))
    assert uncommitted[("you", 1)] == 2, "A's aborted copy is in the log, invisible to read_committed"


def test_a_crash_after_the_kafka_commit_before_the_delivered_marker_is_not_delivered_again(
    owners, spark, kafka, topic_name, monkeypatch, caplog
):
    a = owners.runner("host-a:1")
    a.process_batch(_batch(spark, BATCHES[0]), 0)
    real_mark = DeliveryTopic.mark_delivered

    def crash_before_marker(topic: DeliveryTopic, queue: int, task_id: int, txid: int, **kwargs: Any) -> bool:
        if txid == 1:
            raise SimulatedCrashError("after the Kafka commit, before the marker")
        return real_mark(topic, queue, task_id, txid, **kwargs)

    monkeypatch.setattr(DeliveryTopic, "mark_delivered", crash_before_marker)
    with pytest.raises(SimulatedCrashError):
        a.process_batch(_batch(spark, BATCHES[1]), 1)
    owners.crash(a)
    monkeypatch.setattr(DeliveryTopic, "mark_delivered", real_mark)
    assert read_topic(kafka, topic_name) == _expected(*enumerate(BATCHES[:2]))

    with caplog.at_level("INFO", "stream_ops.kafka.sink"):
        b = owners.runner("host-b:2")
    assert any("txid 1 of task" in m and "in Kafka already" in m for m in caplog.messages), caplog.messages
    b.process_batch(_batch(spark, BATCHES[1]), 1)
    b.process_batch(_batch(spark, BATCHES[2]), 2)
    b.stop()
    assert read_topic(kafka, topic_name) == _expected(*enumerate(BATCHES))
    delivery = b.layout.sink_delivery_topic(b.stage, "out")
    assert delivery.files(0) == [] and delivery.delivered_txid(0, b.task.task_id) == 2


def test_a_zombie_owners_kafka_transaction_is_fenced_and_never_visible(owners, spark, kafka, topic_name, monkeypatch):
    a = owners.runner("host-a:1")
    a.process_batch(_batch(spark, BATCHES[0]), 0)
    zombie = PausedCommit(monkeypatch, KafkaSinkWriter, lambda: a.process_batch(_batch(spark, BATCHES[1]), 1))
    zombie.start()
    # A committed txid 1 in ZooKeeper and holds an open Kafka transaction when it loses the task.
    owners.admin.delete(ZkPaths.owner(owners.topology_id, a.task.task_id))
    b = owners.runner("host-b:2")  # init_transactions fences A and aborts its transaction; B delivers txid 1
    b.process_batch(_batch(spark, BATCHES[2]), 2)
    errors = zombie.finish()
    assert len(errors) == 1 and isinstance(errors[0], KafkaSinkFencedError), errors
    b.stop()
    a._close_state()
    assert read_topic(kafka, topic_name) == _expected(*enumerate(BATCHES))
    assert Counter(read_topic(kafka, topic_name, committed=False))[("how", 1)] == 2


AWKWARD_BATCHES = [["été", "naïve"], ["😀 \u2028", "how", "été", '"quoted" \\ back'], ["nice"]]
"""Words whose JSON text is not plain ASCII: non-ASCII letters, an emoji, a line separator, quotes."""


def _copies_of(kafka: EmbeddedKafka, topic: str, txid: int, *, committed: bool) -> Counter[tuple[Any, ...]]:
    """Each message of batch ``txid`` as (key, value, headers) bytes, counted."""
    return Counter(
        (m.key, m.value, tuple(sorted(m.headers.items())))
        for m in read_messages(kafka.bootstrap_servers, topic, committed=committed)
        if int(m.headers[HEADER_TXID]) == txid
    )


def _count_file_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The txids the sink reads from their batch files from now on (the others are delivered from memory)."""
    reads: list[int] = []
    real_read = DeliveryTopic.read_batch

    def counting_read(batch: Any) -> Any:
        reads.append(batch.txid)
        return real_read(batch)

    monkeypatch.setattr(DeliveryTopic, "read_batch", staticmethod(counting_read))
    return reads


def test_a_batch_from_memory_and_the_same_batch_from_its_file_after_a_restart_are_the_same_messages(
    owners, spark, kafka, topic_name, monkeypatch
):
    reads = _count_file_reads(monkeypatch)
    a = owners.runner("host-a:1")
    a.process_batch(_batch(spark, AWKWARD_BATCHES[0]), 0)
    undo_crash = crash_before_kafka_commit(monkeypatch, KafkaSinkWriter, txid=1)
    with pytest.raises(SimulatedCrashError):
        a.process_batch(_batch(spark, AWKWARD_BATCHES[1]), 1)  # produced from memory, never committed
    owners.crash(a)
    assert reads == [], "A delivered both batches from memory"

    undo_crash()
    b = owners.runner("host-b:2")  # a restart: txid 1 delivered from its file
    assert reads == [1]
    b.process_batch(_batch(spark, AWKWARD_BATCHES[1]), 1)  # Spark replays the committed batch: nothing more
    b.process_batch(_batch(spark, AWKWARD_BATCHES[2]), 2)
    b.stop()
    assert reads == [1]
    assert read_topic(kafka, topic_name) == _expected(*enumerate(AWKWARD_BATCHES))
    from_file = _copies_of(kafka, topic_name, 1, committed=True)
    both = _copies_of(kafka, topic_name, 1, committed=False)
    assert sum(from_file.values()) == 4 and both == from_file + from_file, "A's aborted copy, from memory, is B's byte for byte"


def test_a_zombie_owners_batch_from_memory_and_the_new_owners_from_its_file_are_the_same_messages(
    owners, spark, kafka, topic_name, monkeypatch
):
    reads = _count_file_reads(monkeypatch)
    a = owners.runner("host-a:1")
    a.process_batch(_batch(spark, AWKWARD_BATCHES[0]), 0)
    zombie = PausedCommit(monkeypatch, KafkaSinkWriter, lambda: a.process_batch(_batch(spark, AWKWARD_BATCHES[1]), 1))
    zombie.start()  # A's transaction of txid 1, produced from memory, is open when A loses the task
    owners.admin.delete(ZkPaths.owner(owners.topology_id, a.task.task_id))
    b = owners.runner("host-b:2")  # fences A, delivers txid 1 from its file
    b.process_batch(_batch(spark, AWKWARD_BATCHES[2]), 2)
    errors = zombie.finish()
    assert len(errors) == 1 and isinstance(errors[0], KafkaSinkFencedError), errors
    b.stop()
    a._close_state()
    assert reads == [1]
    assert read_topic(kafka, topic_name) == _expected(*enumerate(AWKWARD_BATCHES))
    from_file = _copies_of(kafka, topic_name, 1, committed=True)
    assert _copies_of(kafka, topic_name, 1, committed=False) == from_file + from_file


_KILLED_WRITER = """
import json, os, signal, sys
from stream_ops.kafka.sink import KafkaSinkWriter
from stream_ops.kafka.sink_options import KafkaSinkSpec

spec = KafkaSinkSpec.model_validate_json(sys.argv[1])
writer = KafkaSinkWriter(spec, topology_id="killed-1-1", sink="out", task_id=0)
writer.deliver(0, [{"word": "first"}])

def die_before_commit():
    writer._producer.flush(10)
    os.kill(os.getpid(), signal.SIGKILL)

writer._commit = die_before_commit
writer.deliver(1, [{"word": "second"}, {"word": "third"}])
"""


def test_a_process_killed_inside_a_kafka_transaction_leaves_nothing_visible_and_is_redelivered_once(kafka, topic_name):
    spec = KafkaSinkSpec(bootstrap=kafka.bootstrap_servers, topic=topic_name, key="word", partitions=2)
    killed = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_KILLED_WRITER), spec.model_dump_json()],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert sorted(read_topic(kafka, topic_name, committed=False)) == [("first", 0), ("second", 1), ("third", 1)]

    # The task's next owner: fences the dead producer (aborting its transaction), reads that
    # txid 0 is delivered, and writes txid 1 once; read_committed consumers are not held up.
    writer = KafkaSinkWriter(spec, topology_id="killed-1-1", sink="out", task_id=0)
    assert writer.start() == 0
    assert writer.deliver(0, [{"word": "first"}]) is False
    assert writer.deliver(1, [{"word": "second"}, {"word": "third"}]) is True
    writer.close()
    assert read_topic(kafka, topic_name) == [("first", 0), ("second", 1), ("third", 1)]


def test_a_missing_topic_without_partitions_stops_the_delivery_with_a_clear_error(kafka, topic_name):
    spec = KafkaSinkSpec(bootstrap=kafka.bootstrap_servers, topic=topic_name)
    writer = KafkaSinkWriter(spec, topology_id="missing-1-1", sink="out", task_id=0)
    with pytest.raises(KafkaSinkError, match=f"topic '{topic_name}' does not exist.*pass partitions="):
        writer.deliver(0, [{"word": "lost?"}])
    assert writer.delivered_txid is None
