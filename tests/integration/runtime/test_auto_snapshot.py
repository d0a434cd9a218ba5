"""Automatic snapshots: a keyed task compacts its own state-topic queue once the tail passes
the topology's threshold, and the next owner restores from that snapshot plus a short tail,
with exact values."""

from __future__ import annotations

import time

from runners import make_runner

from stream_ops import Count, FileTopic, OpaqueMapState, Topology
from stream_ops.config import ClusterConfig
from stream_ops.coordination.store import ZkStore
from stream_ops.examples.wordcount import split
from stream_ops.hashing import encode_key
from stream_ops.nimbus.submission import submit
from stream_ops.state.auto_snapshot import SnapshotPolicy
from stream_ops.state.snapshot import latest_snapshot


def _partials(spark, counts: dict[str, int]):
    return spark.createDataFrame([(encode_key([w]), n) for w, n in counts.items()], "key string, value long")


def test_a_task_snapshots_by_itself_and_the_next_owner_replays_only_the_tail(spark, zk_config, tmp_path):
    cluster = ClusterConfig(root=tmp_path / "cluster")
    t = Topology("auto-snap")
    counts = (
        t.source("sentences", FileTopic(tmp_path / "in", 1), schema={"sentence": "string"})
        .each(split, out="word", fields=["sentence"])
        .group_by("word")
        .persistent_aggregate(Count(), out="count", state=OpaqueMapState)
    )
    t.query("words", counts)
    with ZkStore.connect(zk_config) as admin:
        topology_id = submit(admin, cluster, t, workers=1, conf={"snapshot_after_entries": 4})
        policy = SnapshotPolicy.from_conf({"snapshot_after_entries": 4})
        a = make_runner(admin, spark, cluster, topology_id, "host-a:1", stage="count", snapshot_policy=policy)
        a.prepare()
        a.process_batch(_partials(spark, {"a": 1, "b": 1}), 0)  # tail 2 entries
        a.process_batch(_partials(spark, {"c": 1, "d": 1}), 1)  # tail 4: snapshot at txid 1
        a._auto_snapshot.wait(30)
        snapshot_dir = a.layout.snapshot_dir(a.stage, 0)
        first = latest_snapshot(snapshot_dir)
        assert first is not None and first.txid == 1 and first.keys == 4
        a.process_batch(_partials(spark, {"a": 2}), 2)  # a tail of one batch above the snapshot
        covered = [p.name for _, p in a.state.state_topic.batch_files()]
        a.stop()
        b = make_runner(admin, spark, cluster, topology_id, "host-b:2", stage="count", snapshot_policy=policy)
        started = time.monotonic()
        b.prepare()
        assert time.monotonic() - started < 30
        assert b.lookup([("a",), ("b",), ("c",), ("d",)]) == [3, 1, 1, 1]
        b.stop()
    assert covered and all("x000000000000" not in name and "x000000000001" not in name for name in covered), covered


def test_snapshot_thresholds_come_from_the_topology_conf():
    import pytest

    from stream_ops.errors import ConfigError

    assert SnapshotPolicy.from_conf({}) == SnapshotPolicy()
    policy = SnapshotPolicy.from_conf({"snapshot_after_entries": 10, "snapshot_after_bytes": 0})
    assert policy.due(10, 0) and not policy.due(9, 10**12)
    with pytest.raises(ConfigError, match="non-negative integers"):
        SnapshotPolicy.from_conf({"snapshot_after_entries": -1})
