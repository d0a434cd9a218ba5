"""The Kafka source's spec from ``KafkaTopic`` (no broker is needed to define it): its fields and
options, the definition errors, and what the kind says without Spark. Without ``partitions=``
the count is read when the plan is built: ``test_kafka_partitions_at_submit.py``."""

from __future__ import annotations

import pytest

from stream_ops import Count, OpaqueMapState, Topology
from stream_ops.errors import SourceError, TopologyDefinitionError
from stream_ops.sources import CORRUPT_COLUMN, KAFKA_METADATA_FIELDS, KafkaTopic, SourceLag, SourceSpec, source_kind, source_spec

BOOTSTRAP = "127.0.0.1:9092"
METADATA = {
    "kafka_key": "string",
    "kafka_partition": "int",
    "kafka_offset": "long",
    "kafka_timestamp": "long",
    "kafka_headers": "array<struct<key:string,value:string>>",
}


def test_a_json_topic_has_its_fields_then_the_kafka_metadata_and_one_queue_per_partition() -> None:
    spec = source_spec(KafkaTopic(BOOTSTRAP, "words", partitions=3), {"word": "string", "n": "long"})
    assert spec.kind == "kafka_topic" and spec.path is None and spec.queues == 3
    assert spec.fields == {"word": "string", "n": "long", **METADATA}
    assert list(spec.fields)[2:] == list(KAFKA_METADATA_FIELDS) == list(METADATA)
    assert spec.options == {
        "bootstrap": BOOTSTRAP,
        "topic": "words",
        "format": "json",
        "starting_offsets": "earliest",
        "encoding": "utf8",
        "fail_on_data_loss": True,
    }
    assert SourceSpec.model_validate_json(spec.model_dump_json()) == spec  # plain JSON in the plan
    assert source_kind("kafka_topic").columns(spec) == {**spec.fields, CORRUPT_COLUMN: "string"}


def test_a_raw_topic_has_a_string_value_and_no_corrupt_column() -> None:
    spec = source_spec(KafkaTopic(BOOTSTRAP, "bytes", format="raw", encoding="base64", partitions=1))
    assert spec.fields == {"value": "string", **METADATA}
    assert spec.options["encoding"] == "base64"
    assert source_kind("kafka_topic").columns(spec) == spec.fields
    with pytest.raises(TopologyDefinitionError, match="format='raw' has fixed fields"):
        source_spec(KafkaTopic(BOOTSTRAP, "bytes", format="raw", partitions=1), {"value": "string"})


def test_the_schema_may_be_on_the_definition_or_in_schema_but_one_is_needed_for_json() -> None:
    own = source_spec(KafkaTopic(BOOTSTRAP, "t", schema={"a": "long"}, partitions=1))
    assert own == source_spec(KafkaTopic(BOOTSTRAP, "t", partitions=1), {"a": "long"})
    with pytest.raises(TopologyDefinitionError, match="needs schema="):
        source_spec(KafkaTopic(BOOTSTRAP, "t", partitions=1))
    with pytest.raises(TopologyDefinitionError, match="two different schemas"):
        source_spec(KafkaTopic(BOOTSTRAP, "t", schema={"a": "long"}, partitions=1), {"a": "string"})


@pytest.mark.parametrize(
    ("starting", "expected"),
    [("earliest", "earliest"), ("latest", "latest"), ({"timestamp": 1_700_000_000_000}, {"timestamp": 1_700_000_000_000})],
)
def test_starting_offsets_are_a_keyword_or_a_timestamp(starting: object, expected: object) -> None:
    spec = source_spec(KafkaTopic(BOOTSTRAP, "t", starting_offsets=starting, partitions=1), ["a"])  # type: ignore[arg-type]
    assert spec.options["starting_offsets"] == expected


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"starting_offsets": "beginning"}, "starting_offsets must be"),
        ({"starting_offsets": {"timestamp": -1}}, "starting_offsets must be"),
        ({"starting_offsets": {"timestamp": 1, "x": 2}}, "starting_offsets must be"),
        ({"format": "avro"}, "format must be one of"),
        ({"encoding": "latin1"}, "encoding must be one of"),
        ({"partitions": 0}, "partitions must be a positive integer"),
        ({"partitions": True}, "partitions must be a positive integer"),
        ({"max_offsets_per_trigger": 0}, "max_offsets_per_trigger must be"),
        ({"fail_on_data_loss": "no"}, "fail_on_data_loss must be"),
        ({"topic": "bad topic!"}, "not a valid topic name"),
        ({"topic": ""}, "not a valid topic name"),
        ({"bootstrap": " "}, "bootstrap must name the brokers"),
    ],
)
def test_a_bad_definition_is_refused(kwargs: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {"bootstrap": BOOTSTRAP, "topic": "t", "partitions": 1, **kwargs}
    with pytest.raises(TopologyDefinitionError, match=message):
        source_spec(KafkaTopic(**arguments), ["a"])  # type: ignore[arg-type]


def test_the_kafka_field_names_are_reserved() -> None:
    with pytest.raises(TopologyDefinitionError, match=r"\['kafka_offset'\] are reserved"):
        source_spec(KafkaTopic(BOOTSTRAP, "t", partitions=1), {"a": "string", "kafka_offset": "long"})


def test_max_offsets_per_trigger_is_kept() -> None:
    spec = source_spec(KafkaTopic(BOOTSTRAP, "t", partitions=1, max_offsets_per_trigger=500, fail_on_data_loss=False), ["a"])
    assert spec.options["max_offsets_per_trigger"] == 500 and spec.options["fail_on_data_loss"] is False


def test_a_topology_reads_one_task_per_partition() -> None:
    topology = Topology("kafka-plan")
    words = topology.source("words", KafkaTopic(BOOTSTRAP, "words", partitions=4), schema={"word": "string"})
    words.group_by("word").persistent_aggregate(Count(), out="count", state=OpaqueMapState)
    source = topology.chains[0].source
    assert source is not None and source.topic is None and source.spec.queues == 4
    assert "kafka_partition" in source.schema


def test_the_kind_has_no_directory_no_lag_without_a_query_and_describes_the_topic() -> None:
    spec = source_spec(KafkaTopic(BOOTSTRAP, "words", partitions=2), ["word"])
    kind = source_kind("kafka_topic")
    assert kind.queue_dir(spec, 1) is None
    assert kind.lag(spec, 0, 0) == SourceLag(records=None, files=None)  # no query reads it in this process
    assert kind.describe(spec) == f"reads JSON records of the Kafka topic `words` at {BOOTSTRAP} (2 partitions)"
    with pytest.raises(SourceError, match="queue 2 out of range"):
        kind.queue_dir(spec, 2)


def test_client_settings_are_kept_in_the_plan_without_resolving_env_values() -> None:
    spec = source_spec(
        KafkaTopic(
            BOOTSTRAP,
            "words",
            partitions=1,
            spark_options={"kafka.security.protocol": "SASL_SSL", "sasl.jaas.config": "env:KAFKA_JAAS"},
            client_config={"sasl.password": "env:KAFKA_PASSWORD"},
        ),
        {"word": "string"},
    )
    assert spec.options["spark_options"] == {"security.protocol": "SASL_SSL", "sasl.jaas.config": "env:KAFKA_JAAS"}
    assert spec.options["client_config"] == {"sasl.password": "env:KAFKA_PASSWORD"}


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"spark_options": {"bootstrap.servers": "x:1"}}, r"may not set \['bootstrap.servers'\]"),
        ({"spark_options": {"kafka.auto.offset.reset": "latest"}}, "may not set"),
        ({"spark_options": {"retries": 3}}, "must map setting names to strings"),
        ({"client_config": ["security.protocol"]}, "must map setting names to strings"),
    ],
)
def test_bad_client_settings_fail_at_definition_time(settings: dict, message: str) -> None:
    with pytest.raises(TopologyDefinitionError, match=message):
        source_spec(KafkaTopic(BOOTSTRAP, "words", partitions=1, **settings), {"word": "string"})
