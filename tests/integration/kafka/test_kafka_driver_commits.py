"""A Kafka source batch computed on the driver (its offset range read with confluent-kafka)
through the commit protocol: a replay after a crash and a re-delivered committed batch add
nothing, and a zombie owner's batch commits nothing; batch 0 too (its range starts at the
starting offsets Spark keeps in ``sources/0/0``). A driver read that fails leaves the batch,
and the partition's batches of the next 60 s, to Spark, with exact output.

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
import logging
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from kafka_input import MIXED, Sent, produce, sentence, stable_end, words
from paused_commit import SimulatedCrashError

from stream_ops import Topology
from stream_ops.compute.batch_inputs import noting_input_bytes
from stream_ops.compute.decision import Reason
from stream_ops.config import ClusterConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import OwnershipLostError
from stream_ops.helpers.spark_ddl import schema_ddl
from stream_ops.kafka.client import client_config
from stream_ops.kafka.embedded import EmbeddedKafka
from stream_ops.kafka.range_reader import RangeReader
from stream_ops.nimbus.submission import submit
from stream_ops.runtime import task_runner as task_runner_module
from stream_ops.runtime.task_runner import TaskRunner
from stream_ops.sources import KafkaTopic, source_kind
from stream_ops.sources.base import CORRUPT_COLUMN
from stream_ops.sources.kafka_source import KIND

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from runners import make_runner, pause_commits, read_parquet


class DriverBatches:
    """A Kafka topic -> words -> Parquet topology submitted; its source task's runners, fed by hand."""

    def __init__(
        self, zk_config: Any, spark: Any, tmp_path: Path, kafka: EmbeddedKafka, topic: str, *, fail_on_data_loss: bool = True
    ) -> None:
        self.cluster = ClusterConfig(root=tmp_path / "cluster")
        self.zk_config, self.spark, self.topic = zk_config, spark, topic
        self.out = tmp_path / "words"
        kafka.ensure_topic(topic, partitions=1)
        t = Topology("kafka-driver")
        source = KafkaTopic(
            kafka.bootstrap_servers,
            topic,
            partitions=1,
            spark_options={"isolation.level": "read_committed"},
            fail_on_data_loss=fail_on_data_loss,
        )
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

    def log_starting(self, runner: TaskRunner, start: int) -> None:
        """The query's starting offsets as Spark's Kafka source keeps them (``sources/0/0``)."""
        directory = runner.layout.checkpoint_dir(runner.task.task_id) / "sources" / "0"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "0").write_bytes(b"\0v1\n" + json.dumps({self.topic: {"0": start}}).encode())

    def process(self, runner: TaskRunner, batch: int, rows: list[dict[str, Any]] | None = None) -> None:
        """Batch ``batch`` handed to ``runner`` as its query's callback would (offsets noted),
        as a DataFrame of ``rows`` (Spark's rows of the batch; none by default)."""
        assert runner.stage.source is not None
        columns = source_kind(runner.stage.source.kind).columns(runner.stage.source)
        frame = self.spark.createDataFrame(rows or [], schema_ddl(columns))
        noting_input_bytes(runner.process_batch, runner.layout.checkpoint_dir(runner.task.task_id))(frame, batch)

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


@pytest.fixture
def lossy_batches(zk_config, spark, tmp_path, kafka, topic_name):
    found = DriverBatches(zk_config, spark, tmp_path, kafka, topic_name, fail_on_data_loss=False)
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


def test_batch_0_on_the_driver_under_a_replay_and_a_zombie_owner(batches, kafka, monkeypatch):
    middle, end = _halves(batches, kafka)
    a = batches.runner("host-a:1")
    batches.log_starting(a, 0)
    batches.log_offsets(a, 0, middle)  # batch 0 holds the first half: read on the driver from offset 0
    paused, resume = pause_commits(monkeypatch, "host-a:1", txid=0)
    errors: list[BaseException] = []

    def zombie() -> None:
        try:
            batches.process(a, 0)
        except BaseException as e:  # noqa: BLE001 - what the zombie's batch ends with
            errors.append(e)

    thread = threading.Thread(target=zombie)
    thread.start()
    assert paused.wait(60), "A computed batch 0 on the driver and reached its commit"
    batches.admin.delete(ZkPaths.owner(batches.topology_id, a.task.task_id))
    b = batches.runner("host-b:2")
    real_commit = task_runner_module.commit

    def crashing_commit(store: Any, ownership: Any, txid: int, **kwargs: Any) -> Any:
        if ownership.worker_id == "host-b:2" and txid == 0:
            raise SimulatedCrashError("before the ZooKeeper commit")
        return real_commit(store, ownership, txid, **kwargs)

    monkeypatch.setattr(task_runner_module, "commit", crashing_commit)
    with pytest.raises(SimulatedCrashError):
        batches.process(b, 0)  # B replays batch 0 and crashes before its commit
    batches.crash(b)
    monkeypatch.setattr(task_runner_module, "commit", real_commit)
    resume.set()
    thread.join(60)
    assert len(errors) == 1 and isinstance(errors[0], OwnershipLostError), errors
    a._close_state()
    assert batches.written() == Counter(), "neither the zombie's nor the crashed owner's batch 0 was published"

    c = batches.runner("host-c:3")
    batches.process(c, 0)  # replayed again: the same range from the same starting offsets
    assert batches.written() == Counter(words(MIXED[:2], committed_only=True)), "batch 0 read on the driver"
    batches.process(c, 0)  # re-delivered after its commit: a no-op
    batches.log_offsets(c, 1, end)
    batches.process(c, 1)
    c.stop()
    assert batches.written() == Counter(words(MIXED, committed_only=True))


def test_a_failed_driver_read_leaves_the_partition_to_spark_for_60_s(lossy_batches, kafka, monkeypatch, caplog):
    batches = lossy_batches
    """The read of batch 1 fails for real (its first records were deleted from the partition):
    Spark computes it, and batch 2 (readable) too while the refusal lasts; after 60 s by the
    reader's clock the driver reads again. Spark's batches are handed over as the rows its
    source gives (``failOnDataLoss=false``: what is left of the range)."""
    now = [1_000.0]
    kind = source_kind(KIND)
    monkeypatch.setattr(kind, "_ranges", RangeReader(clock=lambda: now[0]))
    produce(kafka.bootstrap_servers, batches.topic, [("plain", [Sent(None, sentence("lost word")), Sent(None, sentence("a b"))])])
    produce(kafka.bootstrap_servers, batches.topic, [("plain", [Sent(None, sentence("c d e"))])])
    produce(kafka.bootstrap_servers, batches.topic, [("plain", [Sent(None, sentence("f g"))])])
    admin = AdminClient(client_config(kafka.bootstrap_servers))
    for future in admin.delete_records([TopicPartition(batches.topic, 0, 1)]).values():
        future.result(30)  # the partition now starts at offset 1: a range from 0 cannot be read exactly

    a = batches.runner("host-a:1")
    batches.log_offsets(a, 0, 0)
    batches.process(a, 0)
    caplog.set_level(logging.DEBUG, logger="stream_ops.compute.decision")
    batches.log_offsets(a, 1, 2)
    batches.process(a, 1, [_row("a b", 1)])  # Spark's rows: offset 0 is gone
    assert Reason.DRIVER_READ_REFUSED.value in caplog.text
    assert batches.written() == Counter(["a", "b"])

    caplog.clear()
    now[0] += 30.0  # within the refusal: the readable batch 2 is Spark's too
    batches.log_offsets(a, 2, 3)
    batches.process(a, 2, [_row("c d e", 2)])
    assert Reason.DRIVER_READ_REFUSED.value in caplog.text
    assert batches.written() == Counter(["a", "b", "c", "d", "e"])

    caplog.clear()
    now[0] += 31.0  # the refusal is over: batch 3 is read on the driver (Spark is handed no row)
    batches.log_offsets(a, 3, 4)
    batches.process(a, 3)
    assert Reason.WITHIN_DRIVER_RECORDS.value in caplog.text and Reason.DRIVER_READ_REFUSED.value not in caplog.text
    a.stop()
    assert batches.written() == Counter(["a", "b", "c", "d", "e", "f", "g"])


def _row(text: str, offset: int) -> dict[str, Any]:
    """A row of the source's columns as Spark's Kafka source gives it for ``sentence(text)``."""
    return {
        "sentence": text,
        "kafka_key": None,
        "kafka_partition": 0,
        "kafka_offset": offset,
        "kafka_timestamp": 0,
        "kafka_headers": [{"key": "h", "value": "\0v"}, {"key": "h", "value": None}],
        CORRUPT_COLUMN: None,
    }
