"""A Kafka topic given without ``partitions=`` is asked for its partition count when the plan is
built (at submit), not when the topology is defined (issue 31, item 6): defining (importing) a
topology needs no broker, every stage whose count follows the source's gets it then, and a
broker that cannot be reached is a clear error of the build."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from stream_ops import Count, OpaqueMapState, Topology
from stream_ops.dsl.build_plan import build_plan
from stream_ops.errors import KafkaServerError, SourceError, TopologyDefinitionError
from stream_ops.sources import KafkaTopic, kafka_source
from stream_ops.topics.file_topic import FileTopic
from stream_ops.topology.queue_counts import LaterCount
from stream_ops.topology.windows import Tumbling

BOOTSTRAP = "127.0.0.1:9092"


@pytest.fixture
def brokers(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """topic -> partitions the (stubbed) brokers report; a topic not in it is missing."""
    topics: dict[str, int] = {}

    def partition_count(bootstrap: str, topic: str, **kwargs: Any) -> int:
        if topic not in topics:
            raise KafkaServerError(f"Kafka at {bootstrap} has no topic {topic!r}")
        return topics[topic]

    monkeypatch.setattr(kafka_source, "partition_count", partition_count)
    return topics


def user_and_time(record: dict[str, Any]) -> dict[str, Any]:
    return {"user": record["user"], "ts": record["ts"]}


def write(txid: int, records: list[dict[str, Any]]) -> None:
    raise AssertionError("never called here")


def _word_count(name: str = "kafka-words", bootstrap: str = BOOTSTRAP, topic: str = "words") -> Topology:
    topology = Topology(name)
    words = topology.source("words", KafkaTopic(bootstrap, topic), schema={"word": "string"})
    words.group_by("word").persistent_aggregate(Count(), out="count", state=OpaqueMapState)
    return topology


def test_defining_needs_no_broker_and_the_count_follows_downstream(monkeypatch: pytest.MonkeyPatch) -> None:
    def contacted(*args: object, **kwargs: object) -> int:
        raise AssertionError("the brokers were asked while the topology was defined")

    monkeypatch.setattr(kafka_source, "partition_count", contacted)
    topology = _word_count()
    source, keyed = topology.segments
    assert source.source is not None and source.source.spec.queues is None
    assert source.queues == LaterCount.of_source("words") and keyed.queues == LaterCount.of_source("words")


def test_the_plan_has_one_task_per_partition_read_when_it_is_built(brokers: dict[str, int], tmp_path: Path) -> None:
    brokers["words"] = 3
    plan = build_plan(_word_count())
    assert [s.queues for s in plan.stages] == [3, 3] and len(plan.tasks) == 6
    assert plan.stages[0].source is not None and plan.stages[0].source.queues == 3
    assert plan.stages[0].outputs[0].queues == 3  # type: ignore[union-attr]  # the shuffle into the keyed stage

    brokers["words"] = 5  # partitions added: the same definition, submitted again, reads them all
    assert [s.queues for s in build_plan(_word_count()).stages] == [5, 5]

    # Joined with a FileTopic of 4 queues: the larger count; a window stage waits for every source task.
    topology = Topology("mixed")
    clicks = topology.source("clicks", KafkaTopic(BOOTSTRAP, "words"), schema={"user": "string", "ts": "double"})
    views = topology.source("views", FileTopic(tmp_path / "views", 4), schema={"user": "string", "ts": "double"})
    fields = {"user": "string", "ts": "double"}
    merged = topology.merge(clicks.map(user_and_time, out=fields), views.map(user_and_time, out=fields))
    merged.group_by("user").persistent_aggregate(Count(), out="n", state=OpaqueMapState)
    per_user = clicks.window(Tumbling(10), time="event", timestamp_field="ts")
    per_user.group_by("user").aggregate(Count(), out="clicks", name="clicks-per-user").print()
    plan = build_plan(topology)
    by_name = {s.name: s for s in plan.stages}
    assert by_name["clicks"].queues == 5 and by_name["views"].queues == 4 and by_name["n"].queues == 5
    assert by_name["clicks-per-user"].progress_channels == tuple(f"0/{q}" for q in range(5))


def test_a_broker_that_cannot_be_reached_is_a_clear_error_of_the_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka_source, "PARTITIONS_TIMEOUT_S", 1.0)
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    topology = _word_count(bootstrap=f"127.0.0.1:{port}")  # defined: nothing asked yet
    with pytest.raises(SourceError) as refused:
        build_plan(topology)
    message = str(refused.value)
    assert f"source 'words': cannot read the partition count of Kafka topic 'words' at 127.0.0.1:{port}" in message
    assert "did not answer" in message and "start the brokers or create the topic" in message
    assert "KafkaTopic(partitions=N)" in message


def test_a_txid_only_sink_on_several_partitions_is_refused_when_the_count_is_known(brokers: dict[str, int]) -> None:
    topology = Topology("kafka-sink")
    topology.source("words", KafkaTopic(BOOTSTRAP, "words"), schema={"word": "string"}).sink(write)  # accepted for now
    brokers["words"] = 1
    assert build_plan(topology).stages[0].queues == 1
    brokers["words"] = 2
    with pytest.raises(TopologyDefinitionError, match="takes \\(txid, records\\), but stage 'words' runs 2 tasks"):
        build_plan(topology)


def test_a_missing_topic_is_named(brokers: dict[str, int]) -> None:
    with pytest.raises(SourceError, match="has no topic 'words'.*create the topic"):
        build_plan(_word_count())
