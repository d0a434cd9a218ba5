"""S4 processing elements on real Spark and ZooKeeper: a prototype PE over two input streams
(one key-less, broadcast), a named output stream and an instance cache, through a zombie owner
and a replayed batch; each emitted record leaves exactly once."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from runners import make_runner, pause_commits, read_parquet

from stream_ops import FileTopic, Topology
from stream_ops.config import ClusterConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import OwnershipLostError
from stream_ops.examples.s4_parity import ALERT, LIMITS, PAYMENTS, SUMMARY, CardPE
from stream_ops.hashing import encode_key
from stream_ops.nimbus.submission import submit

RECORDS = "stream string, key string, record string"


def _cards(tmp_path: Path) -> Topology:
    t = Topology("cards")
    payments = t.source("payments", FileTopic(tmp_path / "payments", 1), schema=PAYMENTS)
    limits = t.source("limits", FileTopic(tmp_path / "limits", 1), schema=LIMITS)
    summaries = t.process(
        CardPE(limit=1),
        streams={"payments": (payments, "card"), "limits": (limits, None)},
        out=SUMMARY,
        outputs={"alerts": ALERT},
        timer_interval=3600,
        max_instances=2,
        name="cards",
    )
    summaries.to_parquet(tmp_path / "summaries", name="summaries")
    t.stream("alerts").to_parquet(tmp_path / "alerts", name="alerts")
    return t


def _batch(spark, items: list[tuple[str, dict]]):
    rows = [(stream, encode_key([r["card"]] if stream == "payments" else []), json.dumps(r)) for stream, r in items]
    return spark.createDataFrame(rows, RECORDS)


def test_a_prototype_pe_with_broadcast_named_outputs_and_eviction_emits_once_through_a_zombie(
    spark, zk_config, tmp_path, monkeypatch
):
    cluster = ClusterConfig(root=tmp_path / "cluster")
    batch0 = [
        ("payments", {"card": "c1", "amount": 10}),
        ("payments", {"card": "c2", "amount": 7}),
        ("payments", {"card": "c1", "amount": 5}),
    ]
    # the limit 5 reaches c1 and c2 (broadcast); c3 is new: copied from the prototype (limit 1),
    # and the cache of 2 instances removes the least recently used one, c2, with a summary
    batch1 = [
        ("limits", {"limit": 5}),
        ("payments", {"card": "c1", "amount": 1}),
        ("payments", {"card": "c3", "amount": 2}),
        ("payments", {"card": "c3", "amount": 3}),
    ]
    batch2 = [("payments", {"card": c, "amount": 1}) for c in ("c1", "c1", "c1")]
    with ZkStore.connect(zk_config) as admin, ZkStore.connect(zk_config) as store_a:
        topology_id = submit(admin, cluster, _cards(tmp_path), workers=1)
        a = make_runner(store_a, spark, cluster, topology_id, "host-a:1", stage="cards")
        a.prepare()
        a.process_batch(_batch(spark, batch0), 0)
        paused, resume = pause_commits(monkeypatch, "host-a:1")
        errors: list[BaseException] = []

        def run_a():
            try:
                a.process_batch(_batch(spark, batch1), 1)
            except BaseException as e:  # noqa: BLE001 - the test inspects it
                errors.append(e)

        thread = threading.Thread(target=run_a)
        thread.start()
        assert paused.wait(60)
        admin.delete(ZkPaths.owner(topology_id, a.task.task_id))  # A's session "expires"
        b = make_runner(admin, spark, cluster, topology_id, "host-b:2", stage="cards")
        b.prepare()  # rebuilds every instance (fields, LRU order) at txid 0 from the state topic
        b.process_batch(_batch(spark, batch1), 1)
        b.process_batch(_batch(spark, batch1), 1)  # Spark re-delivers the committed batch
        resume.set()
        thread.join(30)
        assert len(errors) == 1 and isinstance(errors[0], OwnershipLostError)
        b.process_batch(_batch(spark, batch2), 2)
        b.stop()
        a._close_state()
    # c1: alert at its 2nd payment (limit 1); after the broadcast limit 5 at its 6th (batch 2)
    # c3: alert at its 2nd payment (a fresh copy of the prototype: limit 1)
    assert read_parquet(tmp_path / "alerts", 'card, payments, "limit"') == [("c1", 2, 1), ("c1", 6, 5), ("c3", 2, 1)]
    assert read_parquet(tmp_path / "summaries", 'card, payments, total, "limit", reason') == [("c2", 1, 7, 5, "removed")]
