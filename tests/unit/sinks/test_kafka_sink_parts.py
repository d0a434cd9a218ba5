"""The pure parts of the Kafka sink: definition-time checks, names, serialisation, progress decisions."""

from __future__ import annotations

import json

import pytest

from stream_ops import Count, FileTopic, OpaqueMapState, Topology
from stream_ops.dsl.build_plan import build_plan
from stream_ops.errors import KafkaSinkError, TopologyDefinitionError
from stream_ops.kafka.progress import (
    NOTHING_DELIVERED,
    already_delivered,
    last_delivered,
    progress_partition,
    progress_record,
    progress_txid,
)
from stream_ops.kafka.sink_options import (
    DEFAULT_PROGRESS_TOPIC,
    check_topic_name,
    kafka_sink_spec,
    resolve_config,
    transactional_id,
)
from stream_ops.kafka.sink_records import HEADER_TASK, HEADER_TXID, batch_headers, batch_messages, encode_value
from stream_ops.topology.plan import Plan, SinkSpec

FIELDS = {"word": "string", "count": "long", "user": "struct<id:long,name:string>"}


def _words(tmp_path, name: str = "kafka-out") -> tuple[Topology, object]:
    t = Topology(name)
    words = t.source("words", FileTopic(tmp_path / "in", queues=2), schema={"word": "string"})
    return t, words


# --- definition time ---------------------------------------------------------------------------


def test_to_kafka_puts_a_kafka_sink_spec_in_the_plan_that_survives_json(tmp_path):
    t, words = _words(tmp_path)
    counts = words.group_by("word").persistent_aggregate(Count(), out="count", state=OpaqueMapState)
    counts.new_values().to_kafka(
        " b1:9092, b2:9092 ", "counts", key="word", partitions=3, config={"security.protocol": "SSL", "linger.ms": 10}
    )
    plan = build_plan(t)
    (sink,) = [s for stage in plan.stages for s in stage.outputs_of(SinkSpec)]
    assert sink.format == "kafka" and sink.name == "count-kafka"
    assert sink.kafka is not None
    assert sink.kafka.bootstrap == "b1:9092,b2:9092" and sink.kafka.topic == "counts" and sink.kafka.key == "word"
    assert sink.kafka.value is None and sink.kafka.partitions == 3
    assert sink.kafka.config == {"security.protocol": "SSL", "linger.ms": "10"}
    assert sink.kafka.progress_topic == DEFAULT_PROGRESS_TOPIC
    assert Plan.from_json(plan.to_json()) == plan


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"key": "nope"}, "unknown field 'nope'"),
        ({"value": "user.email"}, "has no member 'email'"),
        ({"topic": "bad topic"}, "'bad topic' is not a valid Kafka topic name"),
        ({"topic": ".."}, "not a valid Kafka topic name"),
        ({"topic": "x" * 250}, "not a valid Kafka topic name"),
        ({"bootstrap": ""}, "bootstrap must name the brokers"),
        ({"bootstrap": "b1:9092,"}, "bootstrap must name the brokers"),
        ({"partitions": 0}, "partitions must be a positive integer"),
        ({"replication_factor": True}, "replication_factor must be a positive integer"),
        ({"config": {"transactional.id": "mine"}}, "config may not set 'transactional.id'"),
        ({"config": {"isolation.level": "read_uncommitted"}}, "config may not set 'isolation.level'"),
        ({"config": {"linger.ms": [1]}}, "must be a string, number or bool"),
        ({"config": {"Bad Key": "1"}}, "is not a librdkafka setting name"),
        ({"progress_topic": "out"}, "progress_topic must differ from the output topic"),
        ({"progress_topic": "a/b"}, "progress_topic 'a/b' is not a valid Kafka topic name"),
        ({"transactional_id_prefix": "has space"}, "transactional_id_prefix"),
    ],
)
def test_bad_arguments_are_definition_errors_naming_the_problem(kwargs, message):
    arguments = {"bootstrap": "localhost:9092", "topic": "out", **kwargs}
    with pytest.raises(TopologyDefinitionError, match=message.replace("(", r"\(").replace(".", r"\.")) as raised:
        kafka_sink_spec(fields=FIELDS, what="to_kafka() on stage 'words'", **arguments)
    assert str(raised.value).startswith("to_kafka() on stage 'words'")


def test_a_nested_key_field_and_a_value_field_are_accepted():
    spec = kafka_sink_spec("k:9092", "out", fields=FIELDS, what="w", key="user.id", value="word")
    assert (spec.key, spec.value) == ("user.id", "word")


def test_the_dsl_refuses_an_unknown_key_and_a_grouped_stream(tmp_path):
    _, words = _words(tmp_path)
    with pytest.raises(TopologyDefinitionError, match=r"to_kafka\(\) on stage 'words'.*unknown field 'count'"):
        words.to_kafka("localhost:9092", "out", key="count")
    with pytest.raises(TopologyDefinitionError, match="a grouped stream only feeds persistent_aggregate"):
        words.group_by("word").to_kafka("localhost:9092", "out")


def test_two_kafka_sinks_of_one_stage_need_their_own_names(tmp_path):
    _, words = _words(tmp_path)
    words.to_kafka("localhost:9092", "a")
    with pytest.raises(TopologyDefinitionError, match="already has a sink named 'words-kafka'"):
        words.to_kafka("localhost:9092", "b")
    words.to_kafka("localhost:9092", "b", name="second")


def test_topic_names():
    assert check_topic_name("orders.v1_x-y", "w") == "orders.v1_x-y"
    for bad in ("", ".", "a b", "ä", None, 3):
        with pytest.raises(TopologyDefinitionError):
            check_topic_name(bad, "w")


# --- names and config ---------------------------------------------------------------------------


def test_the_transactional_id_is_stable_per_topology_sink_and_task():
    one = transactional_id("stream-ops", "counts-3-1700000000", "out", 7)
    assert one == "stream-ops.counts-3-1700000000.out.t00007"
    assert one == transactional_id("stream-ops", "counts-3-1700000000", "out", 7)
    others = {
        transactional_id("stream-ops", "counts-4-1700000100", "out", 7),  # a new submission starts at txid 0 again
        transactional_id("stream-ops", "counts-3-1700000000", "other", 7),
        transactional_id("stream-ops", "counts-3-1700000000", "out", 8),
        transactional_id("team-a", "counts-3-1700000000", "out", 7),
    }
    assert one not in others and len(others) == 4


def test_env_values_are_read_from_the_workers_environment():
    config = {"sasl.username": "app", "sasl.password": "env:KAFKA_PASSWORD"}
    assert resolve_config(config, {"KAFKA_PASSWORD": "s3cret"}) == {"sasl.username": "app", "sasl.password": "s3cret"}
    with pytest.raises(KafkaSinkError, match="'KAFKA_PASSWORD', which is not set"):
        resolve_config(config, {})


# --- serialisation -----------------------------------------------------------------------------


def test_values_become_bytes_by_type():
    assert encode_value("héllo") == "héllo".encode()
    assert encode_value(b"\x00\xff") == b"\x00\xff"
    assert encode_value(None) is None
    assert encode_value(5) == b"5"
    assert encode_value(True) == b"true"
    assert encode_value({"a": [1, 2.5]}) == b'{"a":[1,2.5]}'


def test_a_batch_becomes_keyed_messages_with_json_values_and_batch_headers():
    records = [{"word": "how", "count": 2, "user": {"id": 1, "name": "ann"}}, {"word": None, "count": 1, "user": None}]
    headers = batch_headers("counts-1-1", 4, 12)
    messages = batch_messages(records, key="word", value=None, headers=headers)
    assert [m.key for m in messages] == [b"how", None]
    assert [json.loads(m.value or b"") for m in messages] == records
    assert dict(messages[0].headers)[HEADER_TASK] == b"4" and dict(messages[0].headers)[HEADER_TXID] == b"12"
    nested = batch_messages(records, key="user.id", value="count", headers=headers)
    assert [(m.key, m.value) for m in nested] == [(b"1", b"2"), (None, b"1")]
    unkeyed = batch_messages(records[:1], key=None, value="word", headers=())
    assert (unkeyed[0].key, unkeyed[0].value, unkeyed[0].headers) == (None, b"how", ())


# --- progress ----------------------------------------------------------------------------------


def test_a_progress_record_round_trips_and_lands_in_a_stable_partition():
    key, value = progress_record("stream-ops.t-1-1.out.t00002", topology_id="t-1-1", sink="out", task_id=2, txid=41)
    assert key == b"stream-ops.t-1-1.out.t00002"
    assert progress_txid(value) == 41
    assert json.loads(value) == {"txid": 41, "topology": "t-1-1", "sink": "out", "task": 2}
    assert progress_txid(None) is None and progress_txid(b"not json") is None and progress_txid(b'{"txid": true}') is None
    partitions = {progress_partition(f"id-{i}", 8) for i in range(64)}
    assert partitions <= set(range(8)) and len(partitions) > 1
    assert progress_partition("id-1", 8) == progress_partition("id-1", 8)
    assert progress_partition("id-1", 1) == 0


def test_the_last_progress_record_of_the_own_id_counts():
    mine, other = "stream-ops.t.out.t00001", "stream-ops.t.out.t00002"

    def record(tid: str, txid: int) -> tuple[bytes, bytes]:
        return progress_record(tid, topology_id="t", sink="out", task_id=0, txid=txid)

    log = [record(mine, 0), record(other, 9), (mine.encode(), b"garbage"), record(mine, 1), record(other, 10)]
    assert last_delivered(log, mine) == 1
    assert last_delivered(log, other) == 10
    assert last_delivered(log, "stream-ops.t.out.t00003") == NOTHING_DELIVERED
    assert last_delivered([], mine, before=5) == 5  # read in pieces: what earlier pieces said stays


@pytest.mark.parametrize(("txid", "delivered", "skip"), [(0, -1, False), (3, 2, False), (2, 2, True), (1, 2, True)])
def test_a_batch_is_skipped_iff_kafka_has_its_txid(txid, delivered, skip):
    assert already_delivered(txid, delivered) is skip


# --- the delivery topic both delivery sinks use ---------------------------------------------------


def test_the_delivered_marker_never_moves_back(tmp_path):
    from stream_ops.topics.delivery_topic import DeliveryTopic

    topic = DeliveryTopic(tmp_path / "sink", 1, durable=False)
    topic.create()
    topic.mark_delivered(0, 3, 5)
    topic.mark_delivered(0, 3, 4)  # a stale owner finishing an older batch
    assert topic.delivered_txid(0, 3) == 5
    assert topic.delivered_txid(0, 4) == -1
