"""The Dagster control room over Kafka, against a real broker and a real ZooKeeper: the consumer
lag of a Kafka source asset observed and checked by the heartbeat sensor, and the state asset
and the compaction job of a topology whose state topic is on Kafka.

Most tests write the znodes a source task's commit writes (``TransactionalRecord.offsets``) so
the lag is exact; one runs a real worker and checks the sensor sees it catch up.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from confluent_kafka import Producer

from stream_ops import Count, OpaqueMapState, Topology
from stream_ops.config import ClusterConfig, ZooKeeperConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import TransactionalRecord
from stream_ops.coordination.store import ZkStore
from stream_ops.dsl.build_plan import build_plan
from stream_ops.examples.wordcount import build_wordcount
from stream_ops.kafka.embedded import EmbeddedKafka
from stream_ops.kafka.offsets import EndOffsets
from stream_ops.nimbus import submit
from stream_ops.orchestration import StreamClusterResource, StreamOpsTranslator, ZooKeeperResource, build_definitions
from stream_ops.orchestration.consumer_lag import CONSUMER_LAG, kafka_source_watches
from stream_ops.orchestration.cursor import HeartbeatCursor
from stream_ops.orchestration.run_config import compact_run_config
from stream_ops.orchestration.sensors import HeartbeatTick, observe_tick
from stream_ops.sources import KafkaTopic
from stream_ops.state import OpaqueValue
from stream_ops.state.kafka_state_topic import KafkaStateLog, KafkaStateTopic
from stream_ops.state.state_log import open_state_log
from stream_ops.state.state_topic import encode_items
from stream_ops.topology.layout import TopologyLayout
from stream_ops.topology.plan import Plan

TIMEOUT_S = 120
TRANSLATOR = StreamOpsTranslator()


def _produce(kafka: EmbeddedKafka, topic: str, counts: dict[int, int]) -> None:
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for partition, n in counts.items():
        for i in range(n):
            producer.produce(topic, value=json.dumps({"word": f"w{i}"}), partition=partition)
    assert producer.flush(30) == 0


def _word_count(name: str, kafka: EmbeddedKafka, topic: str) -> Topology:
    topology = Topology(name)
    words = topology.source("words", KafkaTopic(kafka.bootstrap_servers, topic), schema={"word": "string"})
    counts = words.group_by("word").persistent_aggregate(Count(), out="count", state=OpaqueMapState)
    topology.query("counts", counts)
    return topology


def _resources(zk_config: ZooKeeperConfig, root: Path) -> dict[str, Any]:
    return {
        "zookeeper": ZooKeeperResource(
            hosts=zk_config.hosts,
            chroot=zk_config.chroot,
            session_timeout_s=zk_config.session_timeout_s,
            connect_timeout_s=zk_config.connect_timeout_s,
            insecure=True,
        ),
        "stream_cluster": StreamClusterResource(root=str(root)),
    }


def _commit_offsets(store: ZkStore, topology_id: str, task_id: int, txid: int, offsets: list[Any]) -> None:
    """What a source task's ZooKeeper commit writes: the txid and the batch's end offsets."""
    record = TransactionalRecord(committed_txid=txid, committed_epoch=1, epoch=1, offsets=offsets).to_json_obj()
    path = ZkPaths.transactional_task(topology_id, task_id)
    if store.exists(path):
        store.set_json(path, record)
    else:
        store.create_json(path, record)


def _source_task(plan: Plan, partition: int) -> int:
    return plan.task_for(0, partition).task_id


def _lag_events(tick: HeartbeatTick, key: dg.AssetKey) -> tuple[dict[str, Any], dg.AssetCheckEvaluation]:
    [observation] = [o for o in tick.observations if o.asset_key == key]
    [check] = [c for c in tick.check_evaluations if c.asset_key == key and c.check_name == CONSUMER_LAG]
    return {k: v.value for k, v in observation.metadata.items()}, check


def test_the_sensor_observes_each_partitions_lag_and_the_check_warns_over_the_threshold(
    kafka, zk_store, zk_config, tmp_path, topic_name
) -> None:
    kafka.create_topic(topic_name, partitions=2)
    _produce(kafka, topic_name, {0: 7, 1: 3})
    topology = _word_count("kafka-lag", kafka, topic_name)
    plan = build_plan(topology)
    topology_id = submit(zk_store, ClusterConfig(root=tmp_path / "cluster"), topology, workers=1)
    _commit_offsets(zk_store, topology_id, _source_task(plan, 0), 1, [{topic_name: {"0": 4}}])
    # partition 1: nothing committed yet, the source starts at earliest: its 3 records lag

    key = dg.AssetKey(["stream_ops", "kafka", topic_name])
    watches = kafka_source_watches(plan, TRANSLATOR, threshold=5)
    offsets = EndOffsets(timeout_s=5.0)
    options: dict[str, Any] = dict(
        topology_names=[topology.name],
        translator=TRANSLATOR,
        heartbeat_timeout_s=10.0,
        tick_budget_s=30.0,
        kafka_sources=watches,
        end_offsets=offsets,
    )
    first = observe_tick(zk_store, HeartbeatCursor(), **options)
    meta, check = _lag_events(first, key)
    assert (meta["lag_p0"], meta["lag_p1"], meta["lag_records"]) == (3, 3, 6)
    rows = sorted((r.data["partition"], r.data["committed_offset"], r.data["end_offset"]) for r in meta["offsets"].records)
    assert rows == [(0, 4, 7), (1, -1, 3)]
    assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN
    assert "6 records behind" in (check.description or "") and "p0: 3" in (check.description or "")

    _commit_offsets(zk_store, topology_id, _source_task(plan, 0), 2, [{topic_name: {"0": 7}}])
    _commit_offsets(zk_store, topology_id, _source_task(plan, 1), 0, [{topic_name: {"1": 2}}])
    second = observe_tick(zk_store, first.cursor, **options)
    meta, check = _lag_events(second, key)
    assert (meta["lag_p0"], meta["lag_p1"], meta["lag_records"]) == (0, 1, 1)
    assert check.passed
    assert offsets.clients == 1  # one client per bootstrap, kept across ticks


def test_a_broker_that_does_not_answer_is_reported_and_the_tick_goes_on(kafka, zk_store, tmp_path, topic_name) -> None:
    kafka.create_topic(topic_name, partitions=1)
    topology = _word_count("kafka-down", kafka, topic_name)
    plan = build_plan(topology)
    submit(zk_store, ClusterConfig(root=tmp_path / "cluster"), topology, workers=1)
    watches = [replace(w, bootstrap="127.0.0.1:1") for w in kafka_source_watches(plan, TRANSLATOR)]
    started = time.monotonic()
    tick = observe_tick(
        zk_store,
        HeartbeatCursor(),
        topology_names=[topology.name],
        translator=TRANSLATOR,
        heartbeat_timeout_s=10.0,
        tick_budget_s=30.0,
        kafka_sources=watches,
        end_offsets=EndOffsets(timeout_s=0.5),
    )
    assert time.monotonic() - started < 5.0
    assert tick.observed == [topology.name] and not tick.failed
    meta, check = _lag_events(tick, watches[0].asset_key)
    assert "lag_records" not in meta and "not read in 0.5s" in meta["broker_error"]
    assert not check.passed and "not read" in (check.description or "")
    # The stage's own observations are still there.
    assert any(o.asset_key == TRANSLATOR.stream_asset_key(topology.name, "words") for o in tick.observations)


def test_the_definitions_declare_the_check_and_the_sensor_reports_it(kafka, zk_store, zk_config, tmp_path, topic_name) -> None:
    kafka.create_topic(topic_name, partitions=1)
    _produce(kafka, topic_name, {0: 4})
    topology = _word_count("kafka-defs", kafka, topic_name)
    resources = _resources(zk_config, tmp_path / "cluster")
    defs = build_definitions(
        topologies=[topology],
        zookeeper=resources["zookeeper"],
        stream_cluster=resources["stream_cluster"],
        consumer_lag_threshold=100,
        repair=False,
        # A fresh topic's first offsets request took over 2 s (the default) on a loaded CI box.
        kafka_timeout_s=15.0,
    )
    key = dg.AssetKey(["stream_ops", "kafka", topic_name])
    check_key = dg.AssetCheckKey(key, CONSUMER_LAG)
    assert check_key in defs.resolve_asset_graph().asset_check_keys
    topology_id = submit(zk_store, resources["stream_cluster"].config(), topology, workers=1)
    _commit_offsets(zk_store, topology_id, _source_task(build_plan(topology), 0), 0, [{topic_name: {"0": 1}}])

    sensor = defs.resolve_sensor_def("stream_ops_heartbeat_sensor")
    with dg.build_sensor_context(resources=resources) as context:
        result = sensor(context)
    assert isinstance(result, dg.SensorResult)
    events = result.asset_events or []
    [observation] = [e for e in events if isinstance(e, dg.AssetObservation) and e.asset_key == key]
    assert observation.metadata["lag_records"].value == 3
    [evaluation] = [e for e in events if isinstance(e, dg.AssetCheckEvaluation) and e.asset_key == key]
    assert evaluation.passed

    # Executed on demand, the check reads ZooKeeper and the broker now.
    on_demand = dg.Definitions.merge(
        defs, dg.Definitions(jobs=[dg.define_asset_job("lag_checks", selection=dg.AssetSelection.checks(check_key))])
    )
    with dg.instance_for_test() as instance:
        run = on_demand.resolve_job_def("lag_checks").execute_in_process(instance=instance)
        assert run.success
        [found] = run.get_asset_check_evaluations()
        assert found.passed and found.metadata["lag_records"].value == 3


def _state_batches(log: KafkaStateLog, task_id: int, txids: range, words: int = 5) -> None:
    """Batch ``txid`` counts every word once more (what a keyed task appends in step 4)."""
    for txid in txids:
        log.append_batch(task_id, txid, 1, encode_items([((f"w{i}",), OpaqueValue(txid, txid + 1, txid)) for i in range(words)]))


def test_the_state_asset_and_the_compaction_job_work_on_a_kafka_state_topic(kafka, zk_store, zk_config, tmp_path) -> None:
    topology = build_wordcount(tmp_path / "in", name="kafka-state", queues=1)
    conf = KafkaStateTopic(bootstrap=kafka.bootstrap_servers).to_conf()
    resources = _resources(zk_config, tmp_path / "cluster")
    cluster = resources["stream_cluster"].config()
    topology_id = submit(zk_store, cluster, topology, workers=1, conf=conf)
    plan = build_plan(topology)
    stage = plan.stage(1)
    task_id = plan.task_for(stage.index, 0).task_id
    layout = TopologyLayout(cluster, topology_id)
    log = open_state_log(
        conf,
        file_topic=layout.state_topic(stage),
        queue=0,
        topology_id=topology_id,
        stage_index=stage.index,
        stage_name=stage.name,
    )
    assert isinstance(log, KafkaStateLog)
    try:
        _state_batches(log, task_id, range(0, 5))
        _commit_offsets(zk_store, topology_id, task_id, 3, [])  # txid 4 in flight: its records must stay
        defs = build_definitions(topologies=[topology], conf=conf, repair=False, **resources)
        state_key = TRANSLATOR.state_asset_key(topology.name, stage.name)
        state_asset = defs.resolve_assets_def(state_key)
        assert "kafka at " + kafka.bootstrap_servers in str(state_asset.metadata_by_key[state_key]["stream_ops/state_topic"])

        materialized = dg.materialize([state_asset], partition_key="0")  # resources bound by the definitions
        assert materialized.success
        [event] = materialized.get_asset_materialization_events()
        meta = {k: v.value for k, v in event.materialization.metadata.items()}
        assert meta["state_topic"] == log.where and meta["state_topic_kind"] == "kafka"
        assert (meta["snapshot_txid"], meta["keys"]) == (3, 5)
        assert log.partition.watermarks()[0] == 0  # the asset only snapshots

        job = defs.resolve_job_def("stream_ops_compact_state")
        result = job.execute_in_process(run_config=compact_run_config(topology.name))
        assert result.success
        summary = result.output_for_node("compact_state")
        assert summary["queues"] == 1 and summary["deleted_files"] == 4 * 6  # 4 batches of 5 entries + an end record
        low, high = log.partition.watermarks()
        assert (low, high) == (24, 30)  # txid 4's records are kept
        [compacted] = [e for e in result.get_asset_materialization_events() if e.asset_key == state_key]
        assert compacted.materialization.metadata["state_topic"].value == log.where
    finally:
        log.close()


@pytest.mark.timeout(600)
def test_a_running_kafka_topology_is_seen_catching_up(kafka, kafka_workers, kafka_store, topic_name) -> None:
    kafka.create_topic(topic_name, partitions=2)
    _produce(kafka, topic_name, {0: 6, 1: 4})
    topology = _word_count("kafka-caught-up", kafka, topic_name)
    plan = build_plan(topology)
    submit(kafka_store, kafka_workers.cluster, topology, workers=1)
    key = dg.AssetKey(["stream_ops", "kafka", topic_name])
    watches = kafka_source_watches(plan, TRANSLATOR, threshold=1)
    offsets = EndOffsets()
    cursor = HeartbeatCursor()
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        tick = observe_tick(
            kafka_store,
            cursor,
            topology_names=[topology.name],
            translator=TRANSLATOR,
            heartbeat_timeout_s=10.0,
            tick_budget_s=30.0,
            kafka_sources=watches,
            end_offsets=offsets,
        )
        cursor = tick.cursor
        meta, check = _lag_events(tick, key)
        rows = sorted((r.data["partition"], r.data["committed_offset"], r.data["end_offset"]) for r in meta["offsets"].records)
        if rows == [(0, 6, 6), (1, 4, 4)]:
            break
        assert time.monotonic() < deadline, f"the worker did not commit every offset in {TIMEOUT_S} s: {rows}"
        time.sleep(0.5)
    assert meta["lag_records"] == 0 and check.passed
