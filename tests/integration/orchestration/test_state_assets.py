"""The queue-partitioned state asset and the compact-state job against a real ZooKeeper.

State-topic entries are written with :meth:`StateTopicQueue.append` (what a task writes for
each batch), and committed txids through ``sim_workers`` (what its ZooKeeper commit writes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow.parquet as pq
import pytest

from stream_ops.coordination.store import ZkStore
from stream_ops.dsl.build_plan import build_plan
from stream_ops.dsl.streams import Topology
from stream_ops.nimbus.submission import submit
from stream_ops.orchestration import (
    StreamClusterResource,
    build_jobs,
    compact_run_config,
    state_assets,
    topology_assets,
)
from stream_ops.state import OpaqueValue, StateTopicQueue, read_snapshot
from stream_ops.topology.layout import TopologyLayout
from stream_ops.topology.plan import Plan

STATE_KEY = dg.AssetKey(["stream_ops", "wordcount", "count_state"])
KEYED_STAGE = 1  # the word count's "count" stage; its tasks are 2 (queue 0) and 3 (queue 1)


@pytest.fixture
def plan(wordcount: Topology) -> Plan:
    return build_plan(wordcount)


@pytest.fixture
def state_asset(plan: Plan) -> dg.AssetsDefinition:
    [asset] = state_assets(plan=plan)
    return asset


@pytest.fixture
def topology_id(wordcount: Topology, zk_store: ZkStore, cluster_resource: StreamClusterResource, sim_workers: Any) -> str:
    sim_workers.register()
    return submit(zk_store, cluster_resource.config(), wordcount, workers=2)


def _queue(cluster: StreamClusterResource, topology_id: str, plan: Plan, queue: int) -> StateTopicQueue:
    return StateTopicQueue(TopologyLayout(cluster.config(), topology_id).state_topic(plan.stage(KEYED_STAGE)), queue)


def _write_batches(
    cluster: StreamClusterResource, topology_id: str, plan: Plan, queue: int, txids: range, *, words: int = 5
) -> None:
    """Batch ``txid`` counts every word once more: word ``w<i>`` reaches ``txid + 1``."""
    state = _queue(cluster, topology_id, plan, queue)
    task_id = plan.task_for(KEYED_STAGE, queue).task_id
    for txid in txids:
        state.append(task_id, txid, 1, [((f"q{queue}-w{i}",), OpaqueValue(txid, txid + 1, txid)) for i in range(words)])


def _commit(sim_workers: Any, topology_id: str, plan: Plan, queue: int, txid: int) -> None:
    sim_workers.beat(topology_id, plan.task_for(KEYED_STAGE, queue).task_id, committed_txid=txid)


def _materialize(asset: dg.AssetsDefinition, resources: dict[str, Any], partition: str) -> dict[str, Any]:
    result = dg.materialize([asset], resources=resources, partition_key=partition)
    assert result.success
    [event] = result.get_asset_materialization_events()
    assert event.materialization.partition == partition
    return {k: v.value for k, v in event.materialization.metadata.items()}


def test_state_asset_is_partitioned_by_queue(state_asset: dg.AssetsDefinition, wordcount: Topology) -> None:
    assert state_asset.key == STATE_KEY
    assert state_asset.partitions_def is not None
    assert state_asset.partitions_def.get_partition_keys() == ["0", "1"]
    assert [d.asset_key for d in state_asset.specs_by_key[STATE_KEY].deps] == [dg.AssetKey(["stream_ops", "wordcount", "count"])]
    assert [a.key for a in topology_assets(topology=wordcount).state_assets] == [STATE_KEY]


def test_materializing_a_partition_snapshots_its_queue_at_the_committed_txid(
    state_asset: dg.AssetsDefinition,
    resources: dict[str, Any],
    cluster_resource: StreamClusterResource,
    topology_id: str,
    plan: Plan,
    sim_workers: Any,
) -> None:
    _write_batches(cluster_resource, topology_id, plan, 0, range(0, 6))  # txid 5 is written, not committed
    _commit(sim_workers, topology_id, plan, 0, 4)

    meta = _materialize(state_asset, resources, "0")

    assert meta["topology_id"] == topology_id
    assert meta["committed_txid"] == 4
    assert meta["keys"] == meta["dagster/row_count"] == 5
    assert meta["bytes"] > 0 and meta["replay_seconds"] >= 0
    snapshot = Path(meta["snapshot"])
    assert snapshot.parent == Path(meta["snapshot_dir"])
    assert dict(read_snapshot(snapshot)) == _queue(cluster_resource, topology_id, plan, 0).replay(4)
    assert dict(read_snapshot(snapshot))[("q0-w0",)] == OpaqueValue(4, 5, 4)  # not txid 5's value
    # A plain Parquet table: key and value columns, one row per key.
    table = pq.read_table(snapshot)
    assert table.column_names == ["key", "value"] and table.num_rows == 5
    assert "q0-w0" in meta["preview"]


def test_backfill_over_all_queues_rebuilds_every_snapshot(
    state_asset: dg.AssetsDefinition,
    resources: dict[str, Any],
    cluster_resource: StreamClusterResource,
    topology_id: str,
    plan: Plan,
    sim_workers: Any,
) -> None:
    for queue, committed in ((0, 2), (1, 3)):
        _write_batches(cluster_resource, topology_id, plan, queue, range(0, committed + 1), words=3 + queue)
        _commit(sim_workers, topology_id, plan, queue, committed)

    # A backfill runs one run per partition.
    first = {key: _materialize(state_asset, resources, key) for key in state_asset.partitions_def.get_partition_keys()}  # type: ignore[union-attr]
    assert {k: (m["committed_txid"], m["keys"]) for k, m in first.items()} == {"0": (2, 3), "1": (3, 4)}

    # More batches commit; the next backfill brings every snapshot to the new committed txid.
    for queue, committed in ((0, 6), (1, 5)):
        _write_batches(cluster_resource, topology_id, plan, queue, range(0, committed + 1), words=3 + queue)
        _commit(sim_workers, topology_id, plan, queue, committed)
    second = {key: _materialize(state_asset, resources, key) for key in ("0", "1")}
    assert {k: m["snapshot_txid"] for k, m in second.items()} == {"0": 6, "1": 5}
    for key, meta in second.items():
        assert dict(read_snapshot(Path(meta["snapshot"]))) == _queue(cluster_resource, topology_id, plan, int(key)).replay(
            meta["committed_txid"]
        )
        assert [p.name for p in Path(meta["snapshot_dir"]).iterdir() if p.suffix == ".parquet"] == [
            Path(meta["snapshot"]).name
        ]  # the older snapshot was replaced


def test_a_queue_without_commits_materializes_empty(
    state_asset: dg.AssetsDefinition, resources: dict[str, Any], topology_id: str
) -> None:
    meta = _materialize(state_asset, resources, "1")
    assert (meta["committed_txid"], meta["keys"]) == (-1, 0)
    assert "snapshot" not in meta


def test_materializing_without_a_live_submission_fails_with_the_fix(
    state_asset: dg.AssetsDefinition, resources: dict[str, Any]
) -> None:
    result = dg.materialize([state_asset], resources=resources, partition_key="0", raise_on_error=False)
    assert not result.success
    assert "no running topology named 'wordcount'" in str(result.all_events)


def test_compact_job_compacts_every_queue_and_records_the_state_partitions(
    resources: dict[str, Any],
    cluster_resource: StreamClusterResource,
    topology_id: str,
    plan: Plan,
    sim_workers: Any,
) -> None:
    for queue in (0, 1):
        _write_batches(cluster_resource, topology_id, plan, queue, range(0, 5))
        _commit(sim_workers, topology_id, plan, queue, 3)  # txid 4 in flight: its file must stay
    job = build_jobs(topology_names=["wordcount"]).compact_state

    result = job.execute_in_process(run_config=compact_run_config("wordcount"), resources=resources)

    assert result.success
    summary = result.output_for_node("compact_state")
    assert summary == {"topology_id": topology_id, "queues": 2, "deleted_files": 8, "deleted_bytes": summary["deleted_bytes"]}
    for queue in (0, 1):
        state = _queue(cluster_resource, topology_id, plan, queue)
        assert [file_id.txid for file_id, _ in state.batch_files()] == [4]  # only the uncommitted batch is left
    materializations = result.asset_materializations_for_node("compact_state")
    assert {(m.asset_key, m.partition) for m in materializations} == {(STATE_KEY, "0"), (STATE_KEY, "1")}
    assert all(m.metadata["deleted_files"].value == 4 for m in materializations)
    assert all(m.metadata["committed_txid"].value == 3 for m in materializations)
