"""The submission asset against a real ZooKeeper: submit once, then report the running one."""

from __future__ import annotations

import re
from typing import Any

import dagster as dg
import pytest

from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.dsl.streams import Topology
from stream_ops.nimbus.submission import find_topology_id, submit
from stream_ops.orchestration import (
    StreamClusterResource,
    StreamOpsTranslator,
    ZooKeeperResource,
    topology_assets,
)

TOPOLOGY_ID = re.compile(r"^wordcount-\d+-\d+$")


def _materialize(asset: dg.AssetsDefinition, resources: dict[str, Any]) -> dict[str, Any]:
    result = dg.materialize([asset], resources=resources)
    assert result.success
    [event] = result.get_asset_materialization_events()
    materialization = event.materialization
    assert materialization.asset_key == asset.key
    return {k: v.value for k, v in materialization.metadata.items()}


def test_materialize_submits_the_topology(
    wordcount: Topology, resources: dict[str, Any], zk_store: ZkStore, sim_workers: Any
) -> None:
    sim_workers.register()
    defs = topology_assets(topology=wordcount, workers=2)

    meta = _materialize(defs.submission_asset, resources)

    assert TOPOLOGY_ID.match(meta["topology_id"]), meta["topology_id"]
    assert meta["action"] == "submitted"
    assert meta["status"] == "ACTIVE"
    assert meta["tasks"] == 4
    assert meta["workers"] == 2
    assert meta["workers_live"] == 2
    assert meta["plan_matches_definition"] is True
    assert zk_store.children(ZkPaths.STORMS) == [meta["topology_id"]]
    # Assignment table: header + separator + one row per task, every task on a live worker.
    rows = meta["assignment"].splitlines()[2:]
    assert len(rows) == 4
    assert all(any(w in row for w in ("127.0.0.1:6700", "127.0.0.1:6701")) for row in rows)
    assert [r.split("|")[2].strip() for r in rows] == ["sentences", "sentences", "count", "count"]
    assert [s["name"] for s in meta["plan_json"]["stages"]] == ["sentences", "count"]
    assert "| 0 | sentences | source | 2 |" in meta["plan"]


def test_materialize_twice_does_not_submit_twice(wordcount: Topology, resources: dict[str, Any], zk_store: ZkStore) -> None:
    asset = topology_assets(topology=wordcount).submission_asset

    first = _materialize(asset, resources)
    second = _materialize(asset, resources)

    assert second["action"] == "already_running"
    assert second["topology_id"] == first["topology_id"]
    assert second["plan_matches_definition"] is True
    assert zk_store.children(ZkPaths.STORMS) == [first["topology_id"]]
    # No workers registered: the tasks wait unassigned.
    assert "(unassigned)" in second["assignment"]


def test_running_submission_with_another_plan_is_reported_not_replaced(
    make_wordcount: Any, resources: dict[str, Any], zk_store: ZkStore, cluster_resource: StreamClusterResource
) -> None:
    running_id = submit(zk_store, cluster_resource.config(), make_wordcount(queues=3), workers=1)
    asset = topology_assets(topology=make_wordcount(queues=2)).submission_asset

    meta = _materialize(asset, resources)

    assert meta["topology_id"] == running_id
    assert meta["action"] == "already_running"
    assert meta["plan_matches_definition"] is False
    assert meta["tasks"] == 6  # what runs, not what the code defines
    assert find_topology_id(zk_store, "wordcount") == running_id


def test_stream_specs_depend_on_the_submission_and_their_upstream_stages(wordcount: Topology) -> None:
    defs = topology_assets(topology=wordcount)

    assert defs.submission_asset.key == dg.AssetKey(["stream_ops", "wordcount", "submission"])
    assert [s.key for s in defs.stream_specs] == [
        dg.AssetKey(["stream_ops", "wordcount", "sentences"]),
        dg.AssetKey(["stream_ops", "wordcount", "count"]),
    ]
    sentences, count = defs.stream_specs
    # The source stage also depends on the FileTopic it reads (input/sentences).
    assert [d.asset_key for d in sentences.deps] == [
        defs.submission_asset.key,
        dg.AssetKey(["stream_ops", "topic", "input", "sentences"]),
    ]
    assert [d.asset_key for d in count.deps] == [defs.submission_asset.key, sentences.key]
    for spec in defs.stream_specs:
        assert spec.group_name == "wordcount"
        schema = spec.metadata["stream_ops/observation_schema"].schema
        assert {"health", "heartbeat_age_s", "committed_txid", "min_committed_txid"} <= {c.name for c in schema.columns}
    assert defs.stream_specs[0].metadata["stream_ops/input_schema"].schema.columns[0].name == "sentence"
    assert {"zookeeper", "stream_cluster"} <= defs.submission_asset.required_resource_keys


def test_translator_subclass_renames_everything(make_wordcount: Any) -> None:
    class Prod(StreamOpsTranslator):
        key_prefix = ("prod", "streams")

        def group_name(self, topology_name: str) -> str | None:
            return "streaming"

    defs = topology_assets(topology=make_wordcount(name="word-count"), translator=Prod())

    assert defs.submission_asset.key == dg.AssetKey(["prod", "streams", "word-count", "submission"])
    assert {s.group_name for s in defs.stream_specs} == {"streaming"}
    assert defs.stream_specs[1].key == dg.AssetKey(["prod", "streams", "word-count", "count"])


def test_factory_rejects_bad_workers(wordcount: Topology) -> None:
    with pytest.raises(Exception, match="at least 1 worker"):
        topology_assets(topology=wordcount, workers=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"hosts": "zk1"}, "must be written host:port"),
        ({"chroot": "stream_ops"}, "must start with '/'"),
        ({"session_timeout_s": 0}, "session_timeout_s"),
    ],
)
def test_zookeeper_resource_validation_says_what_to_fix(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(Exception, match=message):
        ZooKeeperResource(**kwargs)


def test_zookeeper_resource_env_var_is_validated_when_resolved(monkeypatch: pytest.MonkeyPatch) -> None:
    resource = ZooKeeperResource(hosts=dg.EnvVar("STREAM_OPS_TEST_ZK"))  # not validated yet
    monkeypatch.setenv("STREAM_OPS_TEST_ZK", "no-port")

    @dg.asset
    def needs_zookeeper(zookeeper: ZooKeeperResource) -> None:
        zookeeper.config()

    with pytest.raises(dg.DagsterResourceFunctionError) as raised:
        dg.materialize([needs_zookeeper], resources={"zookeeper": resource})
    assert "'no-port' must be written host:port" in str(raised.value.__cause__)


def test_cluster_resource_builds_cluster_config(tmp_path: Any) -> None:
    config = StreamClusterResource(root=str(tmp_path), checkpoints_root=str(tmp_path / "ck")).config()
    assert config.resolved_dist_dir() == tmp_path / "dist"
    assert config.resolved_checkpoints_root() == tmp_path / "ck"
    with pytest.raises(Exception, match="root must be a directory path"):
        StreamClusterResource(root=" ")
