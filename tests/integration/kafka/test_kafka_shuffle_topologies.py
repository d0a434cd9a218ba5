"""Topologies whose shuffle between stages goes through Kafka, run by a real worker process (Spark
reading each task's partition ``read_committed`` with its Kafka connector), a real broker and a
real ZooKeeper: a word count counts exactly, and an event-time window (a records shuffle with
watermark progress rows) emits each window once with exact counts."""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient
from topic_reader import read_messages

from stream_ops import Count, FileTopic, OpaqueMapState, Topology, Tumbling
from stream_ops.kafka.embedded import EmbeddedKafka
from stream_ops.kafka.shuffle_options import KafkaShuffle
from stream_ops.local_stack import wait_for_counts
from stream_ops.nimbus import submit
from stream_ops.topology.layout import TopologyLayout

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from runners import read_parquet

TIMEOUT_S = 120


def _wait(predicate: Any, what: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.3)


def _conf(kafka: EmbeddedKafka) -> dict[str, Any]:
    return KafkaShuffle(bootstrap=kafka.bootstrap_servers).to_conf()


def test_a_word_count_with_its_shuffle_on_kafka_counts_exactly(kafka, kafka_workers, kafka_store, tmp_path) -> None:
    source = FileTopic(tmp_path / "words", 2)
    source.create()
    topology = Topology("kafka-shuffle-count")
    words = topology.source("words", source, schema={"word": "string"})
    topology.query("counts", words.group_by("word").persistent_aggregate(Count(), out="count", state=OpaqueMapState))
    topology_id = submit(kafka_store, kafka_workers.cluster, topology, workers=1, conf=_conf(kafka))

    first = ["how", "are", "you", "how", "how", "you"]
    source.write_file(0, "a.jsonl", [{"word": w} for w in first[:3]])
    source.write_file(1, "b.jsonl", [{"word": w} for w in first[3:]])
    wait_for_counts(kafka_store, topology.name, "counts", dict(Counter(first)), timeout_s=TIMEOUT_S)
    second = ["how", "nice", "nice", "day"]
    source.write_file(0, "c.jsonl", [{"word": w} for w in second])
    wait_for_counts(kafka_store, topology.name, "counts", dict(Counter(first + second)), timeout_s=TIMEOUT_S)

    # The partials went through the stage's shuffle topic, none through shuffle files.
    topics_dir = TopologyLayout(kafka_workers.cluster, topology_id).topics_dir
    assert not [p for p in topics_dir.glob("shuffle-*/queue-*/*") if not p.name.startswith(".")], "the file shuffle was used"
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    topics = [t for t in admin.list_topics(timeout=10).topics if t.startswith(f"stream_ops-shuffle.{topology_id}.")]
    assert len(topics) == 1, topics
    messages = read_messages(kafka.bootstrap_servers, topics[0])
    assert messages and all(m.key is None for m in messages)


def test_an_event_time_window_over_a_kafka_shuffle_emits_each_window_once(kafka, kafka_workers, kafka_store, tmp_path) -> None:
    source = FileTopic(tmp_path / "clicks", 1)
    source.create()
    topology = Topology("kafka-shuffle-windows")
    clicks = topology.source("clicks", source, schema={"user": "string", "ts": "double"})
    windows = clicks.window(Tumbling(10), time="event", timestamp_field="ts", lag=0, idle_timeout=None)
    windows.group_by("user").aggregate(Count(), out="n").to_parquet(tmp_path / "counts", name="counts")
    submit(kafka_store, kafka_workers.cluster, topology, workers=1, conf=_conf(kafka))

    source.write_file(0, "a.jsonl", [{"user": "ann", "ts": 1.0}, {"user": "bob", "ts": 3.0}, {"user": "ann", "ts": 8.5}])
    source.write_file(0, "b.jsonl", [{"user": "ann", "ts": 12.0}, {"user": "bob", "ts": 25.0}])  # closes [0, 10), [10, 20)
    found: list[tuple] = []

    def two_windows() -> bool:
        found[:] = read_parquet(tmp_path / "counts", "user, n, window_start")
        return len(found) >= 3

    _wait(two_windows, "the windows [0, 10) and [10, 20) to close")
    time.sleep(2)  # a window emitted twice would show up meanwhile
    assert sorted(read_parquet(tmp_path / "counts", "user, n, window_start")) == [
        ("ann", 1, 10.0),
        ("ann", 2, 0.0),
        ("bob", 1, 0.0),
    ]
