"""The keyed stage over Parquet shuffle files, combined in Arrow by real streaming queries.

A zombie owner paused before its commit, the batch replayed by the next owner, a committed
batch replayed by Spark (its input fingerprint must match), and a null partial: the counts
stay exact and every batch is combined in Arrow, without a Spark job (nor a PySpark session). The Arrow combine gives
what Spark's ``groupBy``/``agg`` gives for every built-in aggregator.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from runners import crash_after_publish, make_runner, pause_commits

from stream_ops import FileTopic, Max, Min, Sum, Topology, TransactionalMapState
from stream_ops.compute import decision
from stream_ops.config import ClusterConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.dsl.build_plan import build_plan
from stream_ops.examples.wordcount import build_wordcount
from stream_ops.hashing import encode_key
from stream_ops.nimbus.submission import submit
from stream_ops.operators.aggregators import aggregator_from_spec
from stream_ops.operators.partials_combine import combine_partials
from stream_ops.spark.callback_sink import BatchFrame
from stream_ops.spark.checkpoint import batch_offsets
from stream_ops.topics.shuffle_files import PartialsShuffle, read_partials

BATCHES = [["how", "are", "you", "how"], ["you", "you", "nice"], ["how", "day"]]


def _publish(shuffle: PartialsShuffle, txid: int, counts: dict[str, int | None]) -> None:
    """What source task 0 publishes for ``txid`` after its commit."""
    shuffle.stage_batch(0, 0, txid, 1, [encode_key([w]) for w in counts], list(counts.values()))
    shuffle.publish_batch(0, txid, 1, shuffle.staged_sizes(0, txid, 1))


def _wait(condition, what: str) -> None:
    deadline = time.monotonic() + 90
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _committed(store: ZkStore, topology_id: str, task_id: int) -> int:
    return store.get_json(ZkPaths.transactional_task(topology_id, task_id))[0]["committed_txid"]


def test_a_zombie_and_replayed_batches_count_exactly_combined_in_arrow(spark, zk_config, tmp_path, monkeypatch):
    cluster = ClusterConfig(root=tmp_path / "cluster")
    combined: list[int] = []
    real_combine = decision.combine_partials
    monkeypatch.setattr(
        decision, "combine_partials", lambda table, agg: combined.append(table.num_rows) or real_combine(table, agg)
    )
    planned: list[int] = []
    frame_jdf = BatchFrame._jdf
    monkeypatch.setattr(BatchFrame, "_jdf", property(lambda frame: planned.append(1) or frame_jdf.fget(frame), frame_jdf.fset))
    sessions: list[int] = []
    frame_session = BatchFrame._session
    monkeypatch.setattr(
        BatchFrame, "_session", property(lambda frame: sessions.append(1) or frame_session.fget(frame), frame_session.fset)
    )
    topology = build_wordcount(tmp_path / "in", queues=1, state=TransactionalMapState)
    with ZkStore.connect(zk_config) as admin, ZkStore.connect(zk_config) as store_a:
        topology_id = submit(admin, cluster, topology, workers=1)
        a = make_runner(store_a, spark, cluster, topology_id, "host-a:1", stage=1, trigger_seconds=0.1)
        task = a.task.task_id
        shuffle = PartialsShuffle(a.layout.shuffle_topic(a.stage), "long")
        a.start()
        _publish(shuffle, 0, Counter(BATCHES[0]))
        _wait(lambda: _committed(admin, topology_id, task) == 0, "txid 0 committed")

        # A pauses before its ZooKeeper commit of txid 1; its session "expires"; B takes over.
        paused, resume = pause_commits(monkeypatch, "host-a:1", txid=1)
        _publish(shuffle, 1, Counter(BATCHES[1]))
        assert paused.wait(60)
        admin.delete(ZkPaths.owner(topology_id, task))
        b = make_runner(admin, spark, cluster, topology_id, "host-b:2", stage=1, trigger_seconds=0.1)
        b.prepare()
        resume.set()
        _wait(lambda: not a.is_running(), "the zombie's query stops")
        assert "OwnershipLostError" in (a.failure() or "")
        a.stop()
        assert _committed(admin, topology_id, task) == 0

        # B replays txid 1 and commits it, then "crashes" before Spark logs the batch done.
        crash_after_publish(monkeypatch, 1, OSError("simulated crash after the ZooKeeper commit"))
        b.start_query()
        _wait(lambda: not b.is_running(), "B's query dies after committing txid 1")
        b.stop()
        assert _committed(admin, topology_id, task) == 1

        # C: Spark replays txid 1 with the files it planned (fingerprint checked, skipped), then
        # txid 2, whose null partial is a dead letter.
        c = make_runner(admin, spark, cluster, topology_id, "host-c:3", stage=1, trigger_seconds=0.1)
        c.start()
        _publish(shuffle, 2, {**Counter(BATCHES[2]), "you": None})
        _wait(lambda: _committed(admin, topology_id, task) == 2, "txid 2 committed")
        truth = Counter(w for batch in BATCHES for w in batch)
        _wait(lambda: c.lookup([(w,) for w in sorted(truth)]) == [truth[w] for w in sorted(truth)], "exact counts")
        c.stop()
        assert combined == [3, 2, 2, 3]  # rows of A: txids 0, 1 (refused); B: txid 1; C: txid 2
        assert planned == [], "Spark never plans a batch of the queue source (no rows; the files are read in Arrow)"
        assert sessions == [], "nor is a PySpark session made for such a batch"
        # read with the queue source: offsets per upstream task, and what txid 1 read is deleted
        assert batch_offsets(c.layout.checkpoint_dir(task), 2) == [{"queueTxids": {"0": 2}}]
        _wait(lambda: shuffle.topic.consumed_txids(0) == {0: 1}, "txids 0 and 1 recorded as consumed")
        letters = [r for _, _, r in c.layout.dead_letter_topic().read_queue(0)]
        assert [(r["record"]["key"], r["txid"]) for r in letters] == [(["you"], 2)]


def _sums(path, aggregator) -> Topology:
    topology = Topology("sums")
    stream = topology.source("in", FileTopic(path, queues=1), schema={"w": "string", "n": "long", "x": "double", "s": "string"})
    topology.query("q", stream.group_by("w").persistent_aggregate(aggregator, out="v", state=TransactionalMapState))
    return topology


@pytest.mark.parametrize("aggregator", [Sum("n"), Min("s"), Max("x")], ids=["sum", "min", "max"])
def test_the_arrow_combine_gives_what_spark_gives(spark, tmp_path, aggregator):
    stage = build_plan(_sums(tmp_path / "in", aggregator)).stage(1)
    value_type = stage.input_fields["value"]
    values = {"long": [3, None, 4, 5], "string": ["b", None, "a", "c"], "double": [1.5, None, float("nan"), 2.0]}[value_type]
    keys = [encode_key(["a"]), encode_key(["b"]), encode_key(["a"]), None]
    shuffle = PartialsShuffle(FileTopic(tmp_path / "shuffle"), value_type)
    files = [
        shuffle.stage_batch(0, 0, txid, 1, keys[txid * 2 : txid * 2 + 2], values[txid * 2 : txid * 2 + 2]) for txid in (0, 1)
    ]

    df = spark.read.schema(f"key string, value {value_type}").parquet(*[str(f) for f in files])
    by_spark, read_by_spark = decision.keyed_batch(df, stage)
    by_arrow, read_by_arrow = combine_partials(read_partials(files, value_type), aggregator_from_spec(stage.state.aggregator))
    assert read_by_arrow == read_by_spark == 4
    assert sorted(map(repr, by_arrow)) == sorted(map(repr, by_spark))
