"""Windowed aggregates and event-time joins on real Spark and ZooKeeper: each window is
emitted exactly once, with exact contents, through a replayed batch and a zombie owner."""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path

import pytest
from runners import crash_after_publish, make_runner, pause_commits, read_parquet

from stream_ops import Count, FileTopic, Records, Sliding, Topology, Tumbling
from stream_ops.compute import arrow_on_driver
from stream_ops.config import ClusterConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import OwnershipLostError
from stream_ops.hashing import encode_key
from stream_ops.nimbus.submission import submit
from stream_ops.operators import JoinBolt
from stream_ops.runtime.stage_processors import progress_row, window_partials

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


def _committed(store: ZkStore, topology_id: str, task_id: int) -> int:
    return store.get_json(ZkPaths.transactional_task(topology_id, task_id))[0]["committed_txid"]


def _wait(condition, what: str) -> None:
    deadline = time.monotonic() + 90
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.mark.parametrize("partials", [True, False], ids=["partials", "whole records"])
def test_source_partials_through_a_zombie_and_a_replay_give_the_counts_of_whole_records(
    spark, zk_config, tmp_path, monkeypatch, partials
):
    """A source task sends the records that cannot be late as partials per (window, key) (its
    bound from the commit of the batch before), the others whole; through a zombie that computed
    txid 1, the new owner's commit of it, a crash after that commit and the replay, the window
    task emits what whole records give, and the late record and the one without a time go where
    they went before."""
    if not partials:
        monkeypatch.setattr(arrow_on_driver, "_window_partials", lambda *args: None)
    cuts: list[tuple[str, float]] = []
    real_split = arrow_on_driver.split_window_partials
    monkeypatch.setattr(
        arrow_on_driver,
        "split_window_partials",
        lambda table, **kw: cuts.append((kw["threshold"], table.num_rows)) or real_split(table, **kw),
    )
    cluster = ClusterConfig(root=tmp_path / "cluster")
    topology = _windowed_counts(tmp_path)
    topic = FileTopic(tmp_path / "in", queues=1)
    topic.create()
    files = [
        [{"user": "ann", "ts": 1.0}, {"user": "bob", "ts": 3.0}, {"user": "ann", "ts": 8.5}],  # all partials: nothing sent before
        [
            {"user": "ann", "ts": 9.0},
            {"user": "ann", "ts": 13.0},
            {"user": "bob", "ts": 5.0},
        ],  # bound 8.5 - 2: bob 5.0 whole (late)
        [{"user": "bob", "ts": 4.0}, {"user": "bob", "ts": 30.0}, {"user": "carl", "ts": None}],  # bound 11: bob 4.0 whole (late)
    ]

    def land(i: int) -> None:
        topic.write_lines(0, f"in-{i}.jsonl", [json.dumps(r) for r in files[i]])

    with ZkStore.connect(zk_config) as admin, ZkStore.connect(zk_config) as store_a:
        topology_id = submit(admin, cluster, topology, workers=1)
        a = make_runner(store_a, spark, cluster, topology_id, "host-a:1", stage=0, trigger_seconds=0.1)
        task = a.task.task_id
        a.start()
        land(0)
        _wait(lambda: _committed(admin, topology_id, task) == 0, "txid 0 committed")
        # A computes txid 1, pauses before its ZooKeeper commit and loses the task to B.
        paused, resume = pause_commits(monkeypatch, "host-a:1", txid=1)
        land(1)
        assert paused.wait(60)
        admin.delete(ZkPaths.owner(topology_id, task))
        b = make_runner(admin, spark, cluster, topology_id, "host-b:2", stage=0, trigger_seconds=0.1)
        b.prepare()
        resume.set()
        _wait(lambda: not a.is_running(), "the zombie's query stops")
        assert "OwnershipLostError" in (a.failure() or "")
        a.stop()
        # B commits txid 1 and "crashes" before Spark logs it done: C's query replays it.
        crash_after_publish(monkeypatch, 1, OwnershipLostError("simulated crash after the ZooKeeper commit"))
        b.start_query()
        _wait(lambda: not b.is_running(), "B's query dies after committing txid 1")
        b.stop()
        c = make_runner(admin, spark, cluster, topology_id, "host-c:3", stage=0, trigger_seconds=0.1)
        c.start()
        land(2)
        _wait(lambda: _committed(admin, topology_id, task) == 2, "txid 2 committed")
        c.stop()
        sent = admin.get_json(ZkPaths.transactional_task(topology_id, task))[0]["event_times_sent"]
        shuffled = [
            line for _, _, line in c.layout.shuffle_topic(c.plan.stage(1)).read_queue(0)
        ]  # before the window task retires them
        # The window task reads one file per batch: its watermark at each file is the bound that file was cut with.
        w = make_runner(
            admin, spark, cluster, topology_id, "host-c:3", stage=1, max_files_per_trigger=1, shuffle_trigger_seconds=0.1
        )
        w.start()
        _wait(lambda: _committed(admin, topology_id, w.task.task_id) >= 2 and w.lag_files() == 0, "the window task read all")
        w.stop()
        letters = [(r["record"], r["error"]) for _, _, r in w.layout.dead_letter_topic().read_queue(0)]

    assert sent == {"1": 30.0}
    partial_rows = window_partials([(line["stream"], line["key"], json.loads(line["record"])) for line in shuffled])
    if partials:
        # A's txid 0, A's and B's txid 1 (the same bound), C's txid 2
        assert cuts == [(-math.inf, 3), (6.5, 3), (6.5, 3), (11.0, 3)]
        assert len(partial_rows) == 5  # ann and bob in [0, 10), ann in [0, 10) and [10, 20), bob in [30, 40)
    else:
        assert partial_rows == []
    counts = read_parquet(tmp_path / "counts", "user, n, window_start, window_end")
    assert counts == [("ann", 1, 10.0, 20.0), ("ann", 3, 0.0, 10.0), ("bob", 1, 0.0, 10.0)]
    assert read_parquet(tmp_path / "late", "user, ts") == [("bob", 4.0), ("bob", 5.0)]
    assert letters == [({"user": "carl", "ts": None}, "no usable event time in field 'ts'")]
