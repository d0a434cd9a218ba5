"""An event-time JoinBolt stage on real Spark and ZooKeeper: its window buffer is state-topic
entries a batch writes only where it changed them; each window is joined exactly once, with
exact rows, through a zombie owner, a replayed batch and moves that rebuild the buffer from
the state topic."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from runners import make_runner, pause_commits, read_parquet

from stream_ops import FileTopic, Topology
from stream_ops.config import ClusterConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import OwnershipLostError
from stream_ops.hashing import encode_key
from stream_ops.nimbus.submission import submit
from stream_ops.operators import JoinBolt
from stream_ops.runtime.stage_processors import progress_row
from stream_ops.state.state_topic import StateTopicQueue
from stream_ops.topology.layout import TopologyLayout

RECORDS = "stream string, key string, record string"
STAGE = "join-views-buys"
UPSTREAM = {"views": 0, "buys": 1}  # the source stages' indices
PREFIX = "__join_window__"

Item = tuple[str, dict[str, Any]]


def _topology(tmp_path: Path) -> Topology:
    t = Topology("join-entries")
    views = t.source("views", FileTopic(tmp_path / "views", 1), schema={"page": "string", "ts": "double"})
    buys = t.source("buys", FileTopic(tmp_path / "buys", 1), schema={"page": "string", "ts": "double", "amount": "long"})
    bolt = (
        JoinBolt("views", "page")
        .outer_join("buys", "page", "views")
        .select("page, views:ts as view_ts, buys:amount as amount")
        .with_tumbling_window(seconds=10)
        .with_timestamp_field("ts")
        .with_lag(1)
        .with_late_tuple_stream("late")
    )
    t.join(bolt, views=views, buys=buys).to_parquet(tmp_path / "joined", name="joined")
    t.stream("late").to_parquet(tmp_path / "late", name="late")
    return t


def _view(page: str, ts: float) -> Item:
    return ("views", {"page": page, "ts": ts})


def _buy(page: str, ts: float, amount: int) -> Item:
    return ("buys", {"page": page, "ts": ts, "amount": amount})


BATCHES: list[list[Item]] = [
    # 0: watermark min(6, 3) - 1 = 2, nothing closes
    [_view("p", 1.0), _view("q", 6.0), _view("z", 2.0), _buy("p", 3.0, 1)],
    # 1: watermark min(14, 12) - 1 = 11: [0, 10) closes, with records of batches 0 and 1
    [_view("p", 8.0), _view("s", 14.0), _buy("q", 9.0, 2), _buy("p", 12.0, 3)],
    # 2: view p@5 is late (watermark 11); watermark min(15, 19) - 1 = 14: nothing closes
    [_view("p", 15.0), _view("p", 5.0), _buy("s", 18.0, 4), _buy("u", 19.0, 6)],
    # 3: watermark min(25, 26) - 1 = 24: [10, 20) closes, with records of batches 1 and 2
    [_view("t", 25.0), _buy("t", 26.0, 5)],
]


def _batch(spark: Any, items: list[Item]) -> Any:
    rows = [(stream, encode_key([r["page"]]), json.dumps(r)) for stream, r in items]
    for stream, stage in UPSTREAM.items():
        row = progress_row(stage, 0, max(r["ts"] for s, r in items if s == stream))
        rows.append((row["stream"], row["key"], row["record"]))
    return spark.createDataFrame(rows, RECORDS)


def _buffer_entries(layout: TopologyLayout, stage: Any) -> dict[int, list[tuple[tuple, Any]]]:
    """txid -> the join buffer's entries (key, value or None) the winning owner of that txid wrote."""
    queue = StateTopicQueue(layout.state_topic(stage), 0)
    epochs: dict[int, int] = {}
    for file_id, _ in queue.batch_files():
        epochs[file_id.txid] = max(file_id.epoch, epochs.get(file_id.txid, file_id.epoch))
    out: dict[int, list[tuple[tuple, Any]]] = {}
    for entry in queue.entries():
        if entry.epoch == epochs[entry.txid] and entry.key[0] == PREFIX:
            out.setdefault(entry.txid, []).append((entry.key, None if entry.value is None else entry.value["val"]))
    return out


def _records(entries: list[tuple[tuple, Any]]) -> list[tuple[str, dict]]:
    return sorted(
        ((stream, record) for key, value in entries if key[1] == "t" and value for _, _, stream, record in value), key=repr
    )


def test_a_join_window_spanning_a_zombie_a_replay_and_moves_is_joined_once_from_state_topic_entries(
    spark, zk_config, tmp_path, monkeypatch
):
    cluster = ClusterConfig(root=tmp_path / "cluster")
    with ZkStore.connect(zk_config) as admin, ZkStore.connect(zk_config) as store_a:
        topology_id = submit(admin, cluster, _topology(tmp_path), workers=1)
        a = make_runner(store_a, spark, cluster, topology_id, "host-a:1", stage=STAGE)
        a.prepare()
        a.process_batch(_batch(spark, BATCHES[0]), 0)
        assert read_parquet(tmp_path / "joined", "*") == []
        paused, resume = pause_commits(monkeypatch, "host-a:1")
        errors: list[BaseException] = []

        def run_a() -> None:
            try:
                a.process_batch(_batch(spark, BATCHES[1]), 1)
            except BaseException as e:  # noqa: BLE001 - the test inspects it
                errors.append(e)

        thread = threading.Thread(target=run_a)
        thread.start()
        assert paused.wait(60)
        admin.delete(ZkPaths.owner(topology_id, a.task.task_id))  # A's session "expires"
        b = make_runner(admin, spark, cluster, topology_id, "host-b:2", stage=STAGE)
        b.prepare()  # rebuilds the buffer of txid 0 from the state topic
        assert b.state is not None and b.state.rebuilt
        b.process_batch(_batch(spark, BATCHES[1]), 1)
        b.process_batch(_batch(spark, BATCHES[1]), 1)  # Spark re-delivers the committed batch
        resume.set()
        thread.join(30)
        assert len(errors) == 1 and isinstance(errors[0], OwnershipLostError)
        b.process_batch(_batch(spark, BATCHES[2]), 2)
        b.stop()
        a._close_state()
        c = make_runner(admin, spark, cluster, topology_id, "host-c:3", stage=STAGE)
        c.prepare()  # a move: the buffer again from the state topic, entries of three owners
        assert c.state is not None and c.state.rebuilt
        c.process_batch(_batch(spark, BATCHES[3]), 3)
        layout, stage = c.layout, c.stage
        c.stop()

    joined = read_parquet(tmp_path / "joined", "page, view_ts, amount")
    # [0, 10): p@1 x p@3, z alone, q@6 x q@9, p@8 x p@3; [10, 20): s@14 x s@18, p@15 x p@12, buy u alone
    assert joined == [
        ("p", 1.0, 1),
        ("p", 8.0, 1),
        ("p", 15.0, 3),
        ("q", 6.0, 2),
        ("s", 14.0, 4),
        ("u", None, 6),
        ("z", 2.0, None),
    ]
    assert [json.loads(r) for (r,) in read_parquet(tmp_path / "late", "record")] == [{"page": "p", "ts": 5.0}]

    # Each batch wrote the records it added that its windows still need, and deleted those of
    # the window it closed: never the whole buffer again.
    entries = _buffer_entries(layout, stage)
    assert _records(entries[0]) == sorted(BATCHES[0], key=repr)
    assert _records(entries[1]) == sorted([_view("s", 14.0), _buy("p", 12.0, 3)], key=repr)
    assert _records(entries[2]) == sorted([_view("p", 15.0), _buy("s", 18.0, 4), _buy("u", 19.0, 6)], key=repr)
    assert _records(entries[3]) == sorted(BATCHES[3], key=repr)
    written_0 = {key for key, value in entries[0] if key[1] == "t"}
    assert {key for key, value in entries[1] if value is None} == written_0  # [0, 10) closed
    written_1_2 = {key for txid in (1, 2) for key, value in entries[txid] if key[1] == "t" and value is not None}
    assert {key for key, value in entries[3] if value is None} == written_1_2  # [10, 20) closed
    assert {key[3] for key in written_0} == {0} and {key[3] for key in written_1_2} == {1}
