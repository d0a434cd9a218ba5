"""The Kafka sink's batch delivered from memory: the same message bytes as from its file.

The writer keeps the batch it staged last, encoded as its messages; the batch just published
is delivered from there, any other from its file. A stand-in for Kafka (one progress record per
transactional id, a newer producer fencing the older) shows the two give the same messages
after a restart, a replay and with a zombie owner.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from stream_ops import FileTopic, Topology
from stream_ops.config import ClusterConfig
from stream_ops.dsl.build_plan import build_plan
from stream_ops.errors import KafkaSinkFencedError, TopicError
from stream_ops.kafka import sink as kafka_sink_module
from stream_ops.kafka.sink import KafkaSinkWriter
from stream_ops.kafka.sink_records import KafkaMessage, message_parts, staged_message_parts
from stream_ops.sinks.kafka import KafkaWriter
from stream_ops.topics.delivery_topic import DeliveryTopic
from stream_ops.topology.layout import TopologyLayout
from stream_ops.topology.plan import SinkSpec
from stream_ops.topology.sink_kinds import AfterPublish, SinkContext

AWKWARD: list[dict[str, Any]] = [
    {"word": "été", "count": 3, "user": {"id": 7, "name": "Zoë"}},
    {"word": '😀 \u2028 \u2029 \x00 \t \n \r " \\', "count": -0.0, "user": None},
    {"word": "floats", "count": 1 / 3, "user": {"id": 1e300, "name": [0.1, 5e-324, math.inf, -math.inf]}},
    {"word": "nan", "count": math.nan, "user": {"id": None}},
    {"word": None, "count": True, "user": {"id": False, "name": ""}},
    {"word": 12, "count": 2**70, "user": {"id": [1, {"deep": ["x"]}]}},
    {"word": "int keys", "count": 1, "user": {1: "one", 2.5: "two and a half", None: "none", False: "false"}},
    {"word": "key clash", "count": 2, "user": {"1": "text", 1: "int"}},
    {"word": "tuple", "count": (1, 2), "user": {"id": (3, "x")}},
    {"word": "dotted", "count": 0, "user.id": "a top-level field with a dot"},
    {},
]
"""Records a batch stages: unicode, nested, floats (NaN, -0.0, infinities), nulls, non-text keys
(two of which collide once written as JSON), tuples, a top-level name with a dot."""

FLAT: list[dict[str, Any]] = [
    {"word": "été", "count": 3},
    {"word": '😀 \u2028 \u2029 \x00 \t \n \r " \\', "count": -0.0},
    {"word": None, "count": math.nan},
    {"word": 12, "count": 2**70},
    {"word": True, "count": 1e300},
    {"word": 1.5, "count": -math.inf},
    {"user.id": "a top-level field with a dot", "word": ""},
    {},
]
"""Flat records only (encoded a column at a time): the same awkward scalars."""

OPTIONS = [(None, None), ("word", None), ("user.id", None), ("word", "user"), ("count", "user.name"), (None, "count")]
"""(key, value) options of the sink: none, a text field, a nested path, a value field."""


def _file_parts(records: list[dict[str, Any]], *, key: str | None, value: str | None) -> list[Any]:
    """The (key, value) bytes a batch file gives: each staged line read back, then encoded."""
    lines = [json.dumps(r, separators=(",", ":"), ensure_ascii=False) for r in records]
    return message_parts([json.loads(line) for line in lines], key=key, value=value)


def _old_parts(records: list[dict[str, Any]], *, key: str | None, value: str | None) -> list[Any]:
    """What the sink wrote before batches were kept in memory: json.dumps per record and value."""
    from stream_ops.helpers.field_paths import value_or_none
    from stream_ops.kafka.sink_records import encode_value

    def record_json(record: dict[str, Any]) -> bytes:
        return json.dumps(dict(record), separators=(",", ":"), ensure_ascii=False, default=str).encode("utf-8")

    loaded = [json.loads(json.dumps(r, separators=(",", ":"), ensure_ascii=False)) for r in records]
    return [
        (
            encode_value(value_or_none(r, key)) if key is not None else None,
            encode_value(value_or_none(r, value)) if value is not None else record_json(r),
        )
        for r in loaded
    ]


@pytest.mark.parametrize("records", [AWKWARD, FLAT], ids=["mixed", "flat"])
@pytest.mark.parametrize(("key", "value"), OPTIONS)
def test_staged_parts_are_the_bytes_the_file_gives_and_the_sink_gave_before(records, key, value):
    lines = [json.dumps(r, separators=(",", ":"), ensure_ascii=False) for r in records]
    staged = staged_message_parts(records, lines, key=key, value=value)
    assert staged == _file_parts(records, key=key, value=value) == _old_parts(records, key=key, value=value)


def test_a_flat_records_value_is_its_staged_line_and_a_nested_one_is_read_back_from_its_line():
    flat = {"word": "été", "count": 3}
    nested = {"word": "x", "n": {1: "a", "1": "b"}}  # its line holds "1" twice: read back, one is left
    lines = [json.dumps(r, separators=(",", ":"), ensure_ascii=False) for r in (flat, nested)]
    (_, flat_value), (_, nested_value) = staged_message_parts([flat, nested], lines, key="word", value=None)
    assert flat_value == lines[0].encode("utf-8")
    assert nested_value == b'{"word":"x","n":{"1":"b"}}' != lines[1].encode("utf-8")


# --- the writer, with a stand-in for Kafka ------------------------------------------------------


@dataclass
class FakeKafka:
    """What Kafka keeps of one task's sink: the committed messages per txid and the progress; a
    producer started later fences the ones before it."""

    progress: int = -1
    committed: dict[int, list[KafkaMessage]] = field(default_factory=dict)
    producers: int = 0
    transactions: list[tuple[int, int]] = field(default_factory=list)
    """(producer, txid) of every transaction attempted."""


def _fake_writer_class(kafka: FakeKafka) -> type[KafkaSinkWriter]:
    class FakeKafkaSinkWriter(KafkaSinkWriter):
        def start(self) -> int:
            kafka.producers += 1
            self._producer, self._delivered = kafka.producers, kafka.progress
            return kafka.progress

        def deliver_messages(self, txid: int, messages: Any, topic: str) -> bool:
            if self._producer is None:
                self.start()
            assert self._delivered is not None
            if txid <= self._delivered:
                return False
            kafka.transactions.append((self._producer, txid))
            if self._producer != kafka.producers:
                raise KafkaSinkFencedError(f"producer {self._producer} was fenced")
            kafka.committed[txid] = list(messages)
            kafka.progress = self._delivered = txid
            return True

        def close(self) -> None:
            self._producer = None

    return FakeKafkaSinkWriter


@dataclass
class Sink:
    """One task's Kafka sink files and its owners' writers, with Kafka stood in for."""

    layout: TopologyLayout
    context: SinkContext
    spec: SinkSpec
    kafka: FakeKafka = field(default_factory=FakeKafka)
    file_reads: list[int] = field(default_factory=list)
    """The txids read from their files."""

    @property
    def topic(self) -> DeliveryTopic:
        return self.context.delivery_topic(self.spec)

    def owner(self) -> KafkaWriter:
        """A new owner's writer (nothing in memory, as after a restart)."""
        return KafkaWriter(self.spec, self.context)

    def commit_and_publish(self, writer: KafkaWriter, txid: int, epoch: int, records: list[dict[str, Any]]) -> None:
        """Steps 3 to 6 before the delivery: stage, the commit's record, publish."""
        writer.stage_batch(txid, epoch, records)
        self.publish(txid, epoch)

    def publish(self, txid: int, epoch: int) -> None:
        task_id = self.context.task.task_id
        self.topic.publish_batch(task_id, txid, epoch, self.topic.staged_sizes(task_id, txid, epoch) or self._sizes(txid, epoch))

    def _sizes(self, txid: int, epoch: int) -> dict[str, int]:
        """The size a commit recorded, for a batch published already (a replay)."""
        name = f"t{self.context.task.task_id:05d}-x{txid:012d}-e{epoch:06d}.jsonl"
        path = self.topic.queue_path(self.context.task.queue) / name
        return {str(self.context.task.queue): path.stat().st_size} if path.exists() else {}

    def deliver(self, writer: KafkaWriter, txid: int, epoch: int) -> None:
        writer.after_publish(AfterPublish(committed_txid=txid, epoch=epoch, verify_owner=lambda: None))


@pytest.fixture
def sink(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Sink:
    t = Topology("kafka-memory")
    counts = t.source("words", FileTopic(tmp_path / "in", 1), schema={"word": "string"})
    counts.to_kafka("k:9092", "out", key="word", partitions=2, name="out")
    plan = build_plan(t)
    stage = plan.stage(0)
    (spec,) = stage.outputs_of(SinkSpec)
    layout = TopologyLayout(ClusterConfig(root=tmp_path / "cluster"), "kafka-memory-1-1")
    found = Sink(layout, SinkContext(layout=layout, stage=stage, task=plan.task_for(0, 0)), spec)
    monkeypatch.setattr(kafka_sink_module, "KafkaSinkWriter", _fake_writer_class(found.kafka))
    real_read = DeliveryTopic.read_batch

    def counting_read(batch: Any) -> Any:
        found.file_reads.append(batch.txid)
        return real_read(batch)

    monkeypatch.setattr(DeliveryTopic, "read_batch", staticmethod(counting_read))
    return found


def _as_bytes(messages: list[KafkaMessage]) -> list[tuple[bytes | None, bytes | None, Any]]:
    return [(m.key, m.value, m.headers) for m in messages]


def test_the_batch_just_published_is_delivered_from_memory_as_a_restart_delivers_it_from_its_file(sink: Sink):
    a = sink.owner()
    sink.commit_and_publish(a, 0, 1, AWKWARD)
    sink.deliver(a, 0, 1)
    assert sink.file_reads == [] and sink.kafka.progress == 0
    # The same records as the next batch, staged and published; the owner dies before delivering
    # it, and the next owner, with nothing in memory, delivers it from its file.
    sink.commit_and_publish(a, 1, 1, AWKWARD)
    b = sink.owner()
    sink.deliver(b, 1, 2)
    assert sink.file_reads == [1] and sink.kafka.progress == 1
    from_memory, from_file = sink.kafka.committed[0], sink.kafka.committed[1]
    assert [(m.key, m.value) for m in from_memory] == [(m.key, m.value) for m in from_file]
    assert [(m.key, m.value) for m in from_file] == _file_parts(AWKWARD, key="word", value=None)
    assert {m.headers for m in from_memory} != {m.headers for m in from_file}, "each names its own txid"
    assert sink.topic.files(0) == [] and sink.topic.delivered_txid(0, 0) == 1


def test_a_replayed_batch_is_delivered_once_from_memory_or_its_file(sink: Sink):
    a = sink.owner()
    sink.commit_and_publish(a, 0, 1, AWKWARD[:3])
    sink.deliver(a, 0, 1)
    sink.publish(0, 1)  # Spark replays the committed batch: published and delivered already
    sink.deliver(a, 0, 1)
    assert sink.kafka.transactions == [(1, 0)] and sink.file_reads == []

    # A batch whose delivery failed stays in memory: the retry is the same messages, once.
    sink.commit_and_publish(a, 1, 1, AWKWARD[3:6])
    real = KafkaSinkWriter.deliver_parts
    calls = []

    def failing_once(writer: Any, txid: int, parts: Any) -> bool:
        calls.append(txid)
        if len(calls) == 1:
            raise KafkaSinkFencedError("stands for a refused transaction")
        return real(writer, txid, parts)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(KafkaSinkWriter, "deliver_parts", failing_once)
        with pytest.raises(KafkaSinkFencedError):
            sink.deliver(a, 1, 1)
        sink.deliver(a, 1, 1)
    assert calls == [1, 1] and sink.file_reads == []
    assert _as_bytes(sink.kafka.committed[1])[0][:2] == tuple(_file_parts(AWKWARD[3:6], key="word", value=None)[0])
    assert sink.topic.delivered_txid(0, 0) == 1 and sink.topic.files(0) == []


def test_a_zombie_owners_batch_in_memory_is_fenced_and_the_new_owner_delivers_the_same_bytes_from_the_file(sink: Sink):
    a = sink.owner()
    sink.commit_and_publish(a, 0, 1, AWKWARD)
    a.start_delivery()  # A's producer, then A loses the task before its transaction
    b = sink.owner()
    sink.deliver(b, 0, 2)  # the new owner's producer fences A's; it delivers the file's batch
    assert sink.file_reads == [0]
    with pytest.raises(KafkaSinkFencedError):
        a.deliver_published(next(iter(_published_again(sink, 0))))  # A's batch in memory: refused
    sink.deliver(a, 0, 1)  # and A's pass finds nothing left: B marked it
    assert sink.kafka.transactions == [(2, 0), (1, 0)]
    lines = [json.dumps(r, separators=(",", ":"), ensure_ascii=False) for r in AWKWARD]
    memory = staged_message_parts(AWKWARD, lines, key="word", value=None)
    assert [(m.key, m.value) for m in sink.kafka.committed[0]] == memory
    assert sink.topic.delivered_txid(0, 0) == 0


def _published_again(sink: Sink, txid: int) -> list[Any]:
    from stream_ops.topics.delivery_topic import PublishedBatch

    name = f"t00000-x{txid:012d}-e000001.jsonl"
    return [PublishedBatch(txid, 1, sink.topic.queue_path(0) / name)]


def test_a_record_json_cannot_encode_fails_the_staging_and_keeps_nothing(sink: Sink):
    a = sink.owner()
    with pytest.raises(TopicError, match="not JSON-serialisable"):
        a.stage_batch(0, 1, [{"word": "x", "raw": b"bytes"}])
    assert sink.topic.staged_sizes(0, 0, 1) == {}
    sink.commit_and_publish(a, 0, 1, [{"word": "ok"}])
    sink.deliver(a, 0, 1)
    assert [(m.key, m.value) for m in sink.kafka.committed[0]] == [(b"ok", b'{"word":"ok"}')]
