"""How each source kind describes its input to Dagster as plain data (SourceKind.asset,
identity, lag_watch, arrow_readable), and that a registered kind is asked, not its name."""

from __future__ import annotations

import pytest

from stream_ops.asset_metadata import AssetMetadata
from stream_ops.orchestration.consumer_lag import kafka_source_watches
from stream_ops.orchestration.lineage import source_asset_specs
from stream_ops.orchestration.translator import StreamOpsTranslator, source_key
from stream_ops.sources import PartitionLagWatch, SourceAsset, SourceSpec, source_kind
from stream_ops.sources.base import directory_key_parts


def _kafka(**options: object) -> SourceSpec:
    return SourceSpec(
        kind="kafka_topic",
        queues=3,
        fields={"s": "string"},
        options={"bootstrap": "k:9092", "topic": "words", **options},
    )


def test_directory_key_parts_are_the_directory_and_its_parent() -> None:
    assert directory_key_parts("/a/b/input/sentences/") == ["input", "sentences"]
    assert directory_key_parts("sentences") == ["sentences"]


def test_a_file_topic_is_a_topic_asset_read_by_the_arrow_path() -> None:
    spec = SourceSpec(kind="file_topic", path="/data/in/sentences", queues=2, fields={"s": "string"})
    kind = source_kind("file_topic")
    asset = kind.asset(spec)
    assert asset == SourceAsset(
        key_parts=("topic", "in", "sentences"),
        kinds=frozenset({"files"}),
        description="FileTopic `/data/in/sentences` (2 queues): JSON-lines files the stream_ops topologies "
        "downstream read, one task per queue.",
    )
    assert kind.arrow_readable and kind.lag_watch(spec) is None
    assert kind.identity(spec) == {"kind": "file_topic", "path": "/data/in/sentences"}


@pytest.mark.parametrize("fmt", ["parquet", "csv", "json"])
def test_landed_files_are_a_files_asset_of_their_format(fmt: str) -> None:
    spec = SourceSpec(kind=f"{fmt}_files", path="/land/orders", fields={"s": "string"})
    kind = source_kind(spec.kind)
    asset = kind.asset(spec)
    assert asset is not None
    assert (asset.key_parts, asset.kinds) == (("files", "land", "orders"), frozenset({fmt}))
    assert f"landed {fmt} files" in asset.description
    assert not kind.arrow_readable and kind.lag_watch(spec) is None


def test_a_kafka_topic_names_its_topic_and_brokers_and_is_watched_for_lag() -> None:
    spec = _kafka(starting_offsets="latest", client_config={"sasl.password": "env:PW", "a": "1"})
    kind = source_kind("kafka_topic")
    asset = kind.asset(spec)
    assert asset is not None
    assert (asset.key_parts, asset.kinds) == (("kafka", "words"), frozenset({"kafka"}))
    assert asset.metadata == {
        "stream_ops/kafka_topic": AssetMetadata("text", "words"),
        "stream_ops/kafka_bootstrap": AssetMetadata("text", "k:9092"),
    }
    assert kind.identity(spec) == {"kind": "kafka_topic", "bootstrap": "k:9092", "topic": "words"}
    assert kind.lag_watch(spec) == PartitionLagWatch(
        bootstrap="k:9092", topic="words", client_config=(("a", "1"), ("sasl.password", "env:PW")), from_earliest=False
    )
    assert not kind.arrow_readable


def test_generated_rows_have_no_asset_and_no_key() -> None:
    spec = SourceSpec(kind="rate", fields={"timestamp": "long", "value": "long"})
    assert source_kind("rate").asset(spec) is None
    assert source_key(("stream_ops",), spec) is None


def test_the_orchestration_layer_asks_the_kind() -> None:
    from stream_ops.dsl.build_plan import build_plan
    from stream_ops.examples.kafka_wordcount import PARTITIONS, build_kafka_wordcount

    plan = build_plan(build_kafka_wordcount("k:9092", topic="words"))
    translator = StreamOpsTranslator()
    (spec,) = source_asset_specs(plan, translator).values()
    assert spec.key.path == ["stream_ops", "kafka", "words"]
    assert spec.kinds == {"kafka"}
    assert spec.metadata["stream_ops/kafka_topic"].value == "words"
    (watch,) = kafka_source_watches(plan, translator)
    assert (watch.asset_key, watch.topic, watch.partitions) == (spec.key, "words", PARTITIONS)
