"""The consumer lag of Kafka source assets: offsets to lag, the merged observation, the check
outcome, the watches built from a plan and the Kafka sink asset's metadata (pure, no broker)."""

from __future__ import annotations

from dataclasses import replace

import dagster as dg
import pytest

from stream_ops import Count, OpaqueMapState, Topology
from stream_ops.dsl.build_plan import build_plan
from stream_ops.kafka.offsets import EndOffsets
from stream_ops.nimbus.status import TaskStatus
from stream_ops.orchestration import StreamOpsTranslator
from stream_ops.orchestration.consumer_lag import (
    CONSUMER_LAG,
    DEFAULT_CONSUMER_LAG_THRESHOLD,
    KafkaSourceWatch,
    PartitionLag,
    TopologyLag,
    committed_offset,
    consumer_lag_events,
    evaluate_consumer_lag,
    kafka_source_watches,
    partition_lags,
)
from stream_ops.orchestration.kafka_offsets import TickOffsets
from stream_ops.orchestration.sinks import sink_asset_specs
from stream_ops.sources import KafkaTopic

KEY = dg.AssetKey(["stream_ops", "kafka", "words"])
WATCH = KafkaSourceWatch(KEY, "wc", "words", "k:9092", "words", 3, threshold=100)


def _task(queue: int, offsets: tuple[object, ...] = (), stage_name: str = "words") -> TaskStatus:
    return TaskStatus(
        task_id=queue,
        stage=0,
        stage_name=stage_name,
        queue=queue,
        assigned_to=None,
        owner=None,
        owner_epoch=None,
        heartbeat_age_s=None,
        committed_txid=-1 if not offsets else 4,
        txid_in_flight=None,
        rows_per_s=0.0,
        rows_out_per_s=0.0,
        lag_files=0,
        state_keys=0,
        dead_letters=0,
        committed_offsets=offsets,
    )


def test_the_committed_offset_is_read_from_the_transactional_records_offsets() -> None:
    offsets = [{"logOffset": 3}, {"words": {"0": 10, "2": 7}}]
    assert committed_offset(offsets, "words", 0) == 10
    assert committed_offset(offsets, "words", 2) == 7
    assert committed_offset(offsets, "words", 1) is None
    assert committed_offset(offsets, "other", 0) is None
    assert committed_offset(["not json", {"words": {"0": True}}], "words", 0) is None


def test_lag_is_the_end_offset_less_the_committed_one_and_unknown_where_it_cannot_be_known() -> None:
    tasks = [_task(0, ({"words": {"0": 10}},)), _task(1), _task(2, ({"words": {"2": 9}},)), _task(0, stage_name="count")]
    marks = {0: (0, 25), 1: (4, 6), 2: (0, 5)}
    lags = partition_lags(WATCH, tasks, marks)
    assert lags == (
        PartitionLag(0, 10, 25, 15),
        PartitionLag(1, None, 6, 2),  # no commit yet, starts at earliest: the retained records
        PartitionLag(2, 9, 5, 0),  # committed past the end (a recreated topic): never negative
    )
    latest = replace(WATCH, from_earliest=False)
    assert partition_lags(latest, tasks, marks)[1].lag is None
    assert [p.lag for p in partition_lags(WATCH, tasks, None)] == [None, None, None]
    assert [p.committed for p in partition_lags(WATCH, tasks, None)] == [10, None, 9]


def _lag(watch: KafkaSourceWatch, *lags: int | None, status: str = "ACTIVE", error: str | None = None) -> TopologyLag:
    partitions = tuple(PartitionLag(p, 0 if lag is not None else None, lag, lag) for p, lag in enumerate(lags))
    return TopologyLag(watch=watch, topology_id=f"{watch.topology_name}-1", status=status, partitions=partitions, error=error)


def test_the_check_passes_under_the_threshold_and_warns_at_it_naming_the_partitions() -> None:
    ok = evaluate_consumer_lag(KEY, [_lag(WATCH, 40, 0, 59)])
    assert ok.passed and ok.check_name == CONSUMER_LAG
    assert ok.metadata["lag_records"].value == 99
    behind = evaluate_consumer_lag(KEY, [_lag(WATCH, 40, 0, 60)])
    assert not behind.passed and behind.severity == dg.AssetCheckSeverity.WARN
    assert "wc is 100 records behind" in behind.description
    assert "p2: 60, p0: 40" in behind.description and "p1" not in behind.description
    assert behind.metadata["lagging_partitions"].value == {"wc": {"2": 60, "0": 40}}


def test_the_check_warns_when_the_broker_did_not_answer_and_ignores_inactive_topologies() -> None:
    failed = evaluate_consumer_lag(KEY, [_lag(WATCH, None, None, None, error="offsets not read in 2s")])
    assert not failed.passed and "offsets not read in 2s" in failed.description
    paused = evaluate_consumer_lag(KEY, [_lag(WATCH, 5000, 0, 0, status="INACTIVE")])
    assert paused.passed and "wc is INACTIVE" in paused.description
    assert evaluate_consumer_lag(KEY, []).passed


def test_readers_of_one_topic_get_one_merged_observation_and_are_judged_each_on_its_threshold() -> None:
    other = replace(WATCH, topology_name="audit", threshold=10_000)
    observations, outcomes = consumer_lag_events([_lag(WATCH, 1, 2, 3), _lag(other, 500, 0, None)])
    assert len(observations) == 1 and len(outcomes) == 1
    meta = observations[0].metadata
    assert meta["lag_p0"].value == 500 and meta["lag_p1"].value == 2 and meta["lag_p2"].value == 3
    assert meta["lag_records"].value == 505
    assert meta["topology_lag"].value == {"wc": 6, "audit": 500}
    rows = [r.data for r in meta["offsets"].records]
    assert {"topology": "audit", "partition": 2, "committed_offset": -1, "end_offset": -1, "lag": -1} in rows
    assert len(rows) == 6
    assert outcomes[0].passed  # wc 6 < 100, audit 500 < 10,000
    assert not consumer_lag_events([_lag(replace(other, threshold=400), 500, 0, 0)])[1][0].passed


def test_an_observation_without_offsets_has_no_numbers_to_plot_and_says_why() -> None:
    observations, _ = consumer_lag_events([_lag(WATCH, None, None, None, error="broker down")])
    meta = observations[0].metadata
    assert "lag_records" not in meta and not any(k.startswith("lag_p") for k in meta)
    assert meta["broker_error"].value == "broker down"
    assert "broker down" in (observations[0].description or "")


def _kafka_topology(name: str = "kwc", **source: object) -> Topology:
    topology = Topology(name)
    words = topology.source("words", KafkaTopic("k:9092", "words", partitions=3, **source), schema={"word": "string"})  # type: ignore[arg-type]
    counts = words.group_by("word").persistent_aggregate(Count(), out="count", state=OpaqueMapState)
    counts.new_values().to_kafka("k:9092", "counts", key="word", config={"sasl.password": "env:SECRET"})
    return topology


def test_watches_come_from_the_plans_kafka_sources_with_their_settings_unresolved() -> None:
    plan = build_plan(_kafka_topology(client_config={"sasl.password": "env:KAFKA_PASSWORD"}, starting_offsets="latest"))
    (watch,) = kafka_source_watches(plan, StreamOpsTranslator(), threshold=50)
    assert watch.asset_key == KEY and watch.stage_name == "words" and watch.partitions == 3
    assert watch.client_config == (("sasl.password", "env:KAFKA_PASSWORD"),)
    assert not watch.from_earliest and watch.threshold == 50
    assert (
        kafka_source_watches(build_plan(_kafka_topology()), StreamOpsTranslator())[0].threshold == DEFAULT_CONSUMER_LAG_THRESHOLD
    )
    with pytest.raises(ValueError, match="at least 1"):
        kafka_source_watches(plan, StreamOpsTranslator(), threshold=0)


def test_a_kafka_sink_asset_has_kind_kafka_and_names_its_topics_but_no_setting_values() -> None:
    specs, _ = sink_asset_specs(build_plan(_kafka_topology()), StreamOpsTranslator())
    (spec,) = specs
    assert spec.kinds == {"kafka"}
    meta = {k: v.value for k, v in spec.metadata.items()}
    assert meta["stream_ops/kafka_topic"] == "counts"
    assert meta["stream_ops/kafka_bootstrap"] == "k:9092"
    assert meta["stream_ops/kafka_progress_topic"] == "stream-ops-sink-progress"
    assert meta["stream_ops/kafka_client_settings"] == ["sasl.password"]
    assert "SECRET" not in repr(spec.metadata) and "env:" not in repr(spec.metadata)
    assert "`counts` on `k:9092`" in (spec.description or "")


def test_offsets_of_an_unreachable_broker_fail_fast_then_are_not_asked_again_for_a_while() -> None:
    now = [0.0]
    offsets = EndOffsets(timeout_s=0.3, retry_after_s=30.0, clock=lambda: now[0])
    watch = replace(WATCH, bootstrap="127.0.0.1:1")
    tick = TickOffsets(offsets)
    with pytest.raises(Exception, match="not read in 0.3s"):
        tick.marks(watch)
    with pytest.raises(Exception, match="not read in 0.3s"):  # the same tick: remembered, not asked again
        tick.marks(watch)
    with pytest.raises(Exception, match="not asked again for 30s"):
        offsets.read(watch.bootstrap, "other", 1)
    assert offsets.clients == 1
