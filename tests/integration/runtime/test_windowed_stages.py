"""Windowed aggregates and event-time joins on real Spark and ZooKeeper: each window is
emitted exactly once, with exact contents, through a replayed batch and a zombie owner."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from runners import make_runner, pause_commits, read_parquet

from stream_ops import Count, FileTopic, Records, Sliding, Topology, Tumbling
from stream_ops.config import ClusterConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import OwnershipLostError
from stream_ops.hashing import encode_key
from stream_ops.nimbus.submission import submit
from stream_ops.operators import JoinBolt
from stream_ops.runtime.stage_processors import progress_row

RECORDS = "stream string, key string, record string"


def _progress(stage: int, records: list[dict]) -> list[tuple]:
    """The progress report an upstream source task (queue 0 of ``stage``) sends with its records."""
    row = progress_row(stage, 0, max(r["ts"] for r in records))
    return [(row["stream"], row["key"], row["record"])]


def _records(spark, stream: str, key_field: str | None, records: list[dict], *, upstream: int | None = None):
    rows = [(stream, encode_key([r[key_field]] if key_field else []), json.dumps(r)) for r in records]
    if upstream is not None:
        rows += _progress(upstream, records)
    return spark.createDataFrame(rows, RECORDS)


def _windowed_counts(tmp_path: Path) -> Topology:
    t = Topology("windows")
    clicks = t.source("clicks", FileTopic(tmp_path / "in", 1), schema={"user": "string", "ts": "double"})
    counts = clicks.window(Tumbling(10), time="event", timestamp_field="ts", lag=2, idle_timeout=None, late_stream="late")
    counts.group_by("user").aggregate(Count(), out="n").to_parquet(tmp_path / "counts", name="counts")
    t.stream("late").to_parquet(tmp_path / "late", name="late")
    return t


def test_a_window_spanning_a_zombie_and_a_replay_is_emitted_once_with_exact_counts(spark, zk_config, tmp_path, monkeypatch):
    cluster = ClusterConfig(root=tmp_path / "cluster")
    topology = _windowed_counts(tmp_path)
    batch0 = [{"user": "ann", "ts": 1.0}, {"user": "bob", "ts": 3.0}, {"user": "ann", "ts": 8.5}]
    batch1 = [{"user": "ann", "ts": 9.0}, {"user": "ann", "ts": 13.0}]  # watermark 11: [0, 10) closes
    batch2 = [{"user": "bob", "ts": 4.0}, {"user": "bob", "ts": 30.0}]  # 4.0 is late; [10, 20) closes
    with ZkStore.connect(zk_config) as admin, ZkStore.connect(zk_config) as store_a:
        topology_id = submit(admin, cluster, topology, workers=1)
        stage = "clicks-n-by-user"
        a = make_runner(store_a, spark, cluster, topology_id, "host-a:1", stage=stage)
        a.prepare()
        a.process_batch(_records(spark, "clicks", "user", batch0, upstream=0), 0)
        assert read_parquet(tmp_path / "counts", "*") == []  # nothing closed yet
        paused, resume = pause_commits(monkeypatch, "host-a:1")
        errors: list[BaseException] = []

        def run_a():
            try:
                a.process_batch(_records(spark, "clicks", "user", batch1, upstream=0), 1)
            except BaseException as e:  # noqa: BLE001 - the test inspects it
                errors.append(e)

        thread = threading.Thread(target=run_a)
        thread.start()
        assert paused.wait(60)
        admin.delete(ZkPaths.owner(topology_id, a.task.task_id))  # A's session "expires"
        b = make_runner(admin, spark, cluster, topology_id, "host-b:2", stage=stage)
        b.prepare()  # rebuilds the open windows and the watermark at txid 0 from the state topic
        b.process_batch(_records(spark, "clicks", "user", batch1, upstream=0), 1)
        b.process_batch(_records(spark, "clicks", "user", batch1, upstream=0), 1)  # Spark re-delivers the committed batch
        resume.set()
        thread.join(30)
        assert len(errors) == 1 and isinstance(errors[0], OwnershipLostError)
        b.process_batch(_records(spark, "clicks", "user", batch2, upstream=0), 2)
        b.stop()
        a._close_state()
    counts = read_parquet(tmp_path / "counts", "user, n, window_start, window_end")
    assert counts == [("ann", 1, 10.0, 20.0), ("ann", 3, 0.0, 10.0), ("bob", 1, 0.0, 10.0)]
    assert read_parquet(tmp_path / "late", "user, ts") == [("bob", 4.0)]


def test_a_sliding_event_time_join_emits_each_window_once_through_a_replay(spark, zk_config, tmp_path):
    cluster = ClusterConfig(root=tmp_path / "cluster")
    t = Topology("sliding-join")
    views = t.source("views", FileTopic(tmp_path / "views", 1), schema={"page": "string", "ts": "double"})
    buys = t.source("buys", FileTopic(tmp_path / "buys", 1), schema={"page": "string", "ts": "double", "amount": "long"})
    bolt = (
        JoinBolt("views", "page")
        .join("buys", "page", "views")
        .select("page, views:ts, buys:amount")
        .with_window(10, 5)
        .with_timestamp_field("ts")
        .with_lag(1)
    )
    t.join(bolt, views=views, buys=buys).to_parquet(tmp_path / "joined", name="joined")
    first = [("views", {"page": "p", "ts": 6.0}), ("buys", {"page": "p", "ts": 8.0, "amount": 3})]
    second = [
        ("buys", {"page": "p", "ts": 12.0, "amount": 4}),
        ("views", {"page": "q", "ts": 21.0}),
        ("buys", {"page": "q", "ts": 23.0, "amount": 5}),
    ]
    upstream = {"views": 0, "buys": 1}  # the source stages' indices

    def batch(items):
        rows = [(s, encode_key([r["page"]]), json.dumps(r)) for s, r in items]
        for stream, stage in upstream.items():
            rows += _progress(stage, [r for s, r in items if s == stream])
        return spark.createDataFrame(rows, RECORDS)

    with ZkStore.connect(zk_config) as admin:
        topology_id = submit(admin, cluster, t, workers=1)
        a = make_runner(admin, spark, cluster, topology_id, "host-a:1", stage="join-views-buys")
        a.prepare()
        a.process_batch(batch(first), 0)  # watermark 7: [0, 10) open
        a.stop()
        b = make_runner(admin, spark, cluster, topology_id, "host-b:2", stage="join-views-buys")
        b.prepare()
        b.process_batch(batch(first), 0)  # replay of a committed batch: nothing twice
        b.process_batch(batch(second), 1)  # watermark min(21, 23) - 1 = 20: [0, 10), [5, 15), [10, 20) close
        b.stop()
    rows = read_parquet(tmp_path / "joined", '"views:ts", "buys:amount"')
    # [0, 10): view 6 x buy 8; [5, 15): view 6 x buys 8 and 12; [10, 20): no view of p
    assert rows == [(6.0, 3), (6.0, 3), (6.0, 4)]


def test_a_global_count_window_counts_records_of_every_key(spark, zk_config, tmp_path):
    cluster = ClusterConfig(root=tmp_path / "cluster")
    t = Topology("global-window")
    events = t.source("events", FileTopic(tmp_path / "in", 1), schema={"user": "string"})
    events.window(Sliding(Records.of(3), Records.of(2))).aggregate(Count(), out="n").to_parquet(tmp_path / "n", name="n")
    with ZkStore.connect(zk_config) as admin:
        topology_id = submit(admin, cluster, t, workers=1)
        runner = make_runner(admin, spark, cluster, topology_id, "host-a:1", stage="events-n")
        runner.prepare()
        runner.process_batch(_records(spark, "events", None, [{"user": u} for u in "abcde"]), 0)
        runner.stop()
    assert [r[0] for r in read_parquet(tmp_path / "n", "n")] == [2, 3]
