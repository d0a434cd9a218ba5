"""Lineage (source assets, stage edges), the heartbeat sensor's targets, numeric observation
metadata, the health overview and unique check op names (pure: no ZooKeeper, no Spark)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
from dagster._core.remote_representation.external import RemoteRepository
from dagster._core.remote_representation.external_data import RepositorySnap
from dagster._core.remote_representation.handle import RepositoryHandle

from stream_ops import Count, FileTopic, OpaqueMapState, Topology
from stream_ops.errors import TopologyDefinitionError
from stream_ops.examples.wordcount import split
from stream_ops.nimbus.status import TaskStatus, TopologyStatus
from stream_ops.orchestration import (
    OBSERVE_JOB_NAME,
    TASKS_TABLE_SCHEMA,
    TOPOLOGY_HEALTH,
    StreamClusterResource,
    StreamOpsTranslator,
    ZooKeeperResource,
    build_definitions,
    health_events,
    observe_topology,
    stream_checks_op_name,
    topology_assets,
)
from stream_ops.sources import KafkaTopic

KEY = StreamOpsTranslator()


def _wordcount(tmp_path: Path, name: str = "wordcount", directory: str = "input/sentences") -> Topology:
    t = Topology(name)
    counts = (
        t.source("sentences", FileTopic(tmp_path / directory, 2), schema={"sentence": "string"})
        .each(split, out="word", fields=["sentence"])
        .group_by("word")
        .persistent_aggregate(Count(), out="count", state=OpaqueMapState)
    )
    t.query("words", counts)
    return t


def _kafka_topology() -> Topology:
    t = Topology("clicks")
    clicks = t.source("clicks", KafkaTopic("127.0.0.1:9092", "web.clicks", partitions=3), schema={"page": "string"})
    clicks.group_by("page").persistent_aggregate(Count(), out="count", state=OpaqueMapState)
    return t


def _definitions(*topologies: Topology, translator: StreamOpsTranslator | None = None) -> dg.Definitions:
    return build_definitions(
        topologies=list(topologies),
        zookeeper=ZooKeeperResource(hosts="127.0.0.1:1"),
        stream_cluster=StreamClusterResource(root="/nonexistent/stream_ops"),
        translator=translator,
    )


def test_the_asset_graph_is_the_topology_inputs_stages_state_and_health(tmp_path: Path) -> None:
    defs = topology_assets(topology=_wordcount(tmp_path))
    source = dg.AssetKey(["stream_ops", "topic", "input", "sentences"])
    sentences, count = defs.stream_specs
    assert [spec.key for spec in defs.source_specs] == [source]
    assert defs.source_specs[0].group_name == "stream_ops_sources"
    assert defs.source_specs[0].metadata["stream_ops/path"].value == str(tmp_path / "input" / "sentences")
    assert [d.asset_key for d in sentences.deps] == [defs.submission_asset.key, source]
    assert [d.asset_key for d in count.deps] == [defs.submission_asset.key, sentences.key]

    resources = {"zookeeper": ZooKeeperResource(hosts="127.0.0.1:1"), "stream_cluster": StreamClusterResource(root="/x")}
    graph = dg.Definitions(assets=defs.assets, asset_checks=defs.asset_checks, resources=resources).resolve_asset_graph()
    assert graph.get(KEY.state_asset_key("wordcount", "count")).parent_keys == {count.key}
    assert graph.get(KEY.health_asset_key("wordcount")).parent_keys == {sentences.key, count.key}
    assert graph.get(source).child_keys == {sentences.key}
    # The stream assets are observable (the UI's "Observe" runs the same read as a sensor tick).
    assert graph.get(count.key).is_observable


def test_a_kafka_source_is_named_after_its_topic(tmp_path: Path) -> None:
    defs = topology_assets(topology=_kafka_topology())
    (spec,) = defs.source_specs
    assert spec.key == dg.AssetKey(["stream_ops", "kafka", "web.clicks"])
    assert spec.kinds == {"kafka"}
    assert spec.metadata["stream_ops/kafka_bootstrap"].value == "127.0.0.1:9092"
    assert spec.metadata["stream_ops/queues"].value == 3
    assert defs.stream_specs[0].deps[1].asset_key == spec.key


def test_topologies_reading_one_input_share_its_asset_and_clashing_inputs_are_refused(tmp_path: Path) -> None:
    defs = _definitions(_wordcount(tmp_path), _wordcount(tmp_path, name="wc2"))
    graph = defs.resolve_asset_graph()
    source = dg.AssetKey(["stream_ops", "topic", "input", "sentences"])
    assert graph.get(source).child_keys == {
        KEY.stream_asset_key("wordcount", "sentences"),
        KEY.stream_asset_key("wc2", "sentences"),
    }
    other = tmp_path / "elsewhere"
    with pytest.raises(TopologyDefinitionError, match="stream_ops/topic/input/sentences"):
        _definitions(_wordcount(tmp_path), _wordcount(other, name="wc2"))


def test_the_heartbeat_sensor_is_listed_among_each_stream_assets_automations(tmp_path: Path) -> None:
    repo = _definitions(_wordcount(tmp_path)).get_repository_def()
    # What the webserver computes for the asset page's "Automation details" (targetingInstigators).
    remote = RemoteRepository(
        RepositorySnap.from_def(repo),
        repository_handle=RepositoryHandle.for_test(location_name="test", repository_name=repo.name),
        auto_materialize_use_sensors=True,
    )
    for stage in ("sentences", "count"):
        targeting = remote.get_sensors_targeting(KEY.stream_asset_key("wordcount", stage))
        assert [s.name for s in targeting] == ["stream_ops_heartbeat_sensor"]
    sensor = repo.get_sensor_def("stream_ops_heartbeat_sensor")
    assert OBSERVE_JOB_NAME in {target.job_name for target in sensor.targets}
    observe = repo.get_job(OBSERVE_JOB_NAME)
    assert observe.asset_layer.selected_asset_keys == {
        KEY.stream_asset_key("wordcount", "sentences"),
        KEY.stream_asset_key("wordcount", "count"),
    }


def _task(task_id: int, stage: int, *, alive: bool = True, lag: int | None = 7) -> TaskStatus:
    return TaskStatus(
        task_id=task_id,
        stage=stage,
        stage_name=("sentences", "count")[stage],
        queue=task_id % 2,
        assigned_to="127.0.0.1:6700",
        owner="127.0.0.1:6700" if alive else None,
        owner_epoch=1 if alive else None,
        heartbeat_age_s=0.5 if alive else None,
        committed_txid=10 + task_id,
        txid_in_flight=11 + task_id,
        rows_per_s=2.5,
        rows_out_per_s=1.5,
        lag_files=1,
        state_keys=3,
        dead_letters=1,
        lag_records=lag,
    )


def _status(*alive: bool) -> TopologyStatus:
    return TopologyStatus(
        topology_id="wordcount-1-1700000000",
        name="wordcount",
        status="ACTIVE",
        workers_wanted=2,
        workers_live=["127.0.0.1:6700"],
        assignment_epoch=1,
        tasks=[_task(i, i // 2, alive=a) for i, a in enumerate(alive)],
    )


def test_plotted_observation_values_are_numbers() -> None:
    observations = observe_topology(_status(True, True, True, True), previous_txids={0: 9, 1: 10, 2: 11, 3: 12})
    numeric = {
        "rows_per_s_in": dg.FloatMetadataValue,
        "rows_per_s_out": dg.FloatMetadataValue,
        "lag_records": dg.IntMetadataValue,
        "lag_files": dg.IntMetadataValue,
        "min_committed_txid": dg.IntMetadataValue,
        "max_committed_txid": dg.IntMetadataValue,
        "max_heartbeat_age_s": dg.FloatMetadataValue,
        "dead_letters": dg.IntMetadataValue,
        "tasks_alive": dg.IntMetadataValue,
        "txids_committed_since_last_tick": dg.IntMetadataValue,
    }
    for observation in observations:
        for name, kind in numeric.items():
            assert isinstance(observation.metadata[name], kind), (name, observation.metadata[name])
    count = observations[1].metadata
    assert count["rows_per_s_in"].value == 5.0 and count["lag_records"].value == 14
    assert count["min_committed_txid"].value == 12 and count["max_committed_txid"].value == 13
    assert count["max_heartbeat_age_s"].value == 0.5


def test_the_health_overview_has_a_task_table_a_word_and_a_check() -> None:
    translator = StreamOpsTranslator()
    materialization, evaluation = health_events(_status(True, False, True, True), translator=translator, heartbeat_timeout_s=10)
    assert isinstance(materialization, dg.AssetMaterialization)
    assert materialization.asset_key == translator.health_asset_key("wordcount")
    meta = materialization.metadata
    assert meta["health"].value == "degraded"
    table = meta["tasks"]
    assert isinstance(table, dg.TableMetadataValue) and table.schema == TASKS_TABLE_SCHEMA
    rows = [record.data for record in table.records]
    assert [r["task"] for r in rows] == [0, 1, 2, 3]
    assert rows[1] == {**rows[1], "owner": "", "alive": False, "heartbeat_age_s": None, "committed_txid": 11}
    assert rows[0]["heartbeat_age_s"] == 0.5 and rows[0]["lag_records"] == 7
    assert isinstance(meta["tasks_alive"], dg.IntMetadataValue) and meta["tasks_alive"].value == 3
    assert isinstance(meta["max_committed_txid"], dg.IntMetadataValue)
    assert materialization.description is not None and materialization.description.startswith("degraded")

    assert isinstance(evaluation, dg.AssetCheckEvaluation)
    assert (evaluation.check_name, evaluation.passed, evaluation.severity) == (TOPOLOGY_HEALTH, False, dg.AssetCheckSeverity.WARN)
    _, down = health_events(_status(False, False, False, False), translator=translator, heartbeat_timeout_s=10)
    assert isinstance(down, dg.AssetCheckEvaluation)
    assert (down.passed, down.severity) == (False, dg.AssetCheckSeverity.ERROR)
    _, healthy = health_events(_status(True, True, True, True), translator=translator, heartbeat_timeout_s=10)
    assert isinstance(healthy, dg.AssetCheckEvaluation) and healthy.passed


def test_two_topologies_in_one_group_get_distinct_check_ops(tmp_path: Path) -> None:
    class OneGroup(StreamOpsTranslator):
        def group_name(self, topology_name: str) -> str | None:
            return "streams"

    defs = _definitions(_wordcount(tmp_path), _wordcount(tmp_path, name="word-count"), translator=OneGroup())
    graph = defs.resolve_asset_graph()  # used to fail: both check ops were named streams_stream_checks
    assert len(graph.asset_check_keys) == 2 * 2 * 2 + 2  # two checks per stage, a health check per topology
    assert stream_checks_op_name("wordcount") == "wordcount_stream_checks"
    assert stream_checks_op_name("word-count").startswith("word_count_")
    assert stream_checks_op_name("word-count") != stream_checks_op_name("word_count")
