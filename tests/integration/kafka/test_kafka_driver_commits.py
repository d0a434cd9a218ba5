"""A Kafka source batch computed on the driver (its offset range read with confluent-kafka)
through the commit protocol: a replay after a crash and a re-delivered committed batch add
nothing, and a zombie owner's batch commits nothing.

Runners are driven by hand as in ``test_kafka_shuffle.py``: the shared in-process SparkSession
has no Kafka connector, so each batch's offsets are written into the task's checkpoint as
Spark's Kafka source logs them (``offsets/<n>``) and the batch is handed over the way the
stage's query does (:func:`~stream_ops.compute.batch_inputs.noting_input_bytes`) with an
empty DataFrame of the source's columns. Spark computing such a batch would find no record, so
exact output proves the records came from the driver's read of the logged range (and a
replay's from the same range again).
"""

from __future__ import annotations

import json
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kafka_input import MIXED, produce, stable_end, words
from paused_commit import SimulatedCrashError

from stream_ops import Topology
from stream_ops.compute.batch_inputs import noting_input_bytes
from stream_ops.config import ClusterConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import OwnershipLostError
from stream_ops.helpers.spark_ddl import schema_ddl
from stream_ops.kafka.embedded import EmbeddedKafka
from stream_ops.nimbus.submission import submit
from stream_ops.runtime import task_runner as task_runner_module
from stream_ops.runtime.task_runner import TaskRunner
from stream_ops.sources import KafkaTopic, source_kind

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from runners import make_runner, pause_commits, read_parquet


class DriverBatches:
    """A Kafka topic -> words -> Parquet topology submitted; its source task's runners, fed by hand."""

    def __init__(self, zk_config: Any, spark: Any, tmp_path: Path, kafka: EmbeddedKafka, topic: str) -> None:
        self.cluster = ClusterConfig(root=tmp_path / "cluster")
        self.zk_config, self.spark, self.topic = zk_config, spark, topic
        self.out = tmp_path / "words"
        kafka.ensure_topic(topic, partitions=1)
        t = Topology("kafka-driver")
        source = KafkaTopic(kafka.bootstrap_servers, topic, partitions=1, spark_options={"isolation.level": "read_committed"})
        sentences = t.source("sentences", source, schema={"sentence": "string"})
        sentences.select_expr("explode(split(sentence, ' ')) AS word").to_parquet(self.out, name="words")
        self.admin = ZkStore.connect(zk_config)
        self.stores: list[ZkStore] = []
        self.topology_id = submit(self.admin, self.cluster, t, workers=1)
        self.ends: dict[int, int] = {}

    def runner(self, worker_id: str) -> TaskRunner:
        store = ZkStore.connect(self.zk_config)
        self.stores.append(store)
        runner = make_runner(store, self.spark, self.cluster, self.topology_id, worker_id, stage=0)
        runner.prepare()
        return runner

    def log_offsets(self, runner: TaskRunner, batch: int, end: int) -> None:
        """Spark's offset-log entry of ``batch``: the partition's end offset for it."""
        directory = runner.layout.checkpoint_dir(runner.task.task_id) / "offsets"
        directory.mkdir(parents=True, exist_ok=True)
        meta = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": {}})
        (directory / str(batch)).write_text(f"v1\n{meta}\n{json.dumps({self.topic: {'0': end}})}\n", encoding="utf-8")
        self.ends[batch] = end

    def process(self, runner: TaskRunner, batch: int) -> None:
        """Batch ``batch`` handed to ``runner`` as its query's callback would (offsets noted)."""
        assert runner.stage.source is not None
        columns = source_kind(runner.stage.source.kind).columns(runner.stage.source)
        empty = self.spark.createDataFrame([], schema_ddl(columns))
        noting_input_bytes(runner.process_batch, runner.layout.checkpoint_dir(runner.task.task_id))(empty, batch)

    def written(self) -> Counter[str]:
        return Counter(word for (word,) in read_parquet(self.out, "word"))

    def crash(self, runner: TaskRunner) -> None:
        """What a SIGKILL leaves: the owner node gone with the session, nothing released."""
        self.admin.delete(ZkPaths.owner(self.topology_id, runner.task.task_id))
        runner._close_state()

    def close(self) -> None:
        for store in [*self.stores, self.admin]:
            store.close()


@pytest.fixture
def batches(zk_config, spark, tmp_path, kafka, topic_name):
    found = DriverBatches(zk_config, spark, tmp_path, kafka, topic_name)
    try:
        yield found
    finally:
        found.close()


def _halves(batches: DriverBatches, kafka: EmbeddedKafka) -> tuple[int, int]:
    """MIXED produced in two halves; returns the end offsets after each (markers included)."""
    first = produce(kafka.bootstrap_servers, batches.topic, MIXED[:2])
    assert first
    middle = _end(kafka, batches.topic)
    produce(kafka.bootstrap_servers, batches.topic, MIXED[2:])
    return middle, _end(kafka, batches.topic)


def _end(kafka: EmbeddedKafka, topic: str) -> int:
    return stable_end(kafka.bootstrap_servers, topic)


def test_a_replay_after_a_crash_and_a_redelivered_batch_add_nothing(batches, kafka, monkeypatch):
    middle, end = _halves(batches, kafka)
    a = batches.runner("host-a:1")
    batches.log_offsets(a, 0, 0)  # batch 0: the starting offsets, no record
    batches.process(a, 0)
    batches.log_offsets(a, 1, middle)
    batches.process(a, 1)
    assert batches.written() == Counter(words(MIXED[:2], committed_only=True)), "batch 1 read on the driver"
    batches.process(a, 1)  # Spark re-delivers the committed batch: a no-op
    batches.log_offsets(a, 2, end)
    real_commit = task_runner_module.commit

    def crashing_commit(store: Any, ownership: Any, txid: int, **kwargs: Any) -> Any:
        if ownership.worker_id == "host-a:1" and txid == 2:
            raise SimulatedCrashError("before the ZooKeeper commit")
        return real_commit(store, ownership, txid, **kwargs)

    monkeypatch.setattr(task_runner_module, "commit", crashing_commit)
    with pytest.raises(SimulatedCrashError):
        batches.process(a, 2)
    batches.crash(a)
    monkeypatch.undo()
    assert batches.written() == Counter(words(MIXED[:2], committed_only=True)), "nothing of the uncommitted batch 2"

    b = batches.runner("host-b:2")
    batches.process(b, 1)  # re-delivered, committed: nothing recomputed
    batches.process(b, 2)  # Spark replays the uncommitted batch: the same range, the same records
    batches.process(b, 2)  # and re-delivers it once more after its commit
    b.stop()
    expected = Counter(words(MIXED, committed_only=True))
    assert batches.written() == expected
    assert "never" not in expected and "seen" not in expected, "the aborted transaction is not read (read_committed)"


def test_a_zombie_owners_driver_batch_commits_nothing(batches, kafka, monkeypatch):
    middle, end = _halves(batches, kafka)
    a = batches.runner("host-a:1")
    batches.log_offsets(a, 0, 0)
    batches.process(a, 0)
    batches.log_offsets(a, 1, middle)
    paused, resume = pause_commits(monkeypatch, "host-a:1", txid=1)
    errors: list[BaseException] = []

    def zombie() -> None:
        try:
            batches.process(a, 1)
        except BaseException as e:  # noqa: BLE001 - what the zombie's batch ends with
            errors.append(e)

    thread = threading.Thread(target=zombie)
    thread.start()
    assert paused.wait(60), "A computed batch 1 on the driver and reached its commit"
    # A loses the task (its session expired); B takes over and replays batch 1, then runs 2.
    batches.admin.delete(ZkPaths.owner(batches.topology_id, a.task.task_id))
    b = batches.runner("host-b:2")
    batches.process(b, 1)
    batches.log_offsets(b, 2, end)
    batches.process(b, 2)
    resume.set()
    thread.join(60)
    assert len(errors) == 1 and isinstance(errors[0], OwnershipLostError), errors
    b.stop()
    a._close_state()
    assert batches.written() == Counter(words(MIXED, committed_only=True)), "the zombie's batch 1 was never published"
