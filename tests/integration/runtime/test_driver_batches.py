"""Small source batches computed on the driver (``spark/driver_batches.py``).

The same batches, bad records included, through Spark's Python workers and through the driver
give the same outputs, partials, dead letters and input counts for every kind of operation; a
real streaming query computes its small batches on the driver and its counts stay exact through
a zombie owner and a replayed batch.
"""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest
from pyspark.sql import DataFrame
from runners import crash_after_publish, make_runner, pause_commits

from stream_ops import Count, FileTopic, OpaqueMapState, Sum, Topology, TransactionalMapState
from stream_ops.config import ClusterConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import OwnershipLostError
from stream_ops.examples.wordcount import build_wordcount, split, split_batch
from stream_ops.hashing import encode_key
from stream_ops.nimbus.submission import submit
from stream_ops.spark import compiler
from stream_ops.spark.compiler import source_batch
from stream_ops.spark.driver_batches import DRIVER_BATCH_BYTES_CONF
from stream_ops.topics.shuffle_files import read_partials
from stream_ops.topology.plan import build_plan

SCHEMA = "sentence string, n long, _corrupt_record string"
ROWS = [
    ("how are you how", 1, None),
    ("héllo  wörld", 2, None),  # two spaces: an empty word
    ("you you", None, None),  # a Sum refuses the null
    (None, 4, None),  # each(split) fails on it
    ("", 5, None),
    (None, None, '{"sentence": broken'),
    (None, None, '{"sentence": broken'),
]


def _rows_two_outputs(t: Topology, lines):
    words = lines.each(split, out="word", fields=["sentence"]).filter(bool, fields=["word"])
    words.map(len, out="size", fields=["word"]).to_parquet("/nonexistent/sizes", name="sizes")
    words.group_by("word").persistent_aggregate(Sum("n"), out="total", state=OpaqueMapState)


STAGES = {
    "each+count": lambda t, s: (
        s.each(split, out="word", fields=["sentence"])
        .group_by("word")
        .persistent_aggregate(Count(), out="c", state=OpaqueMapState)
    ),
    "map_batches+count": lambda t, s: (
        s.map_batches(split_batch, schema={"word": "string"})
        .group_by("word")
        .persistent_aggregate(Count(), out="c", state=OpaqueMapState)
    ),
    "sql+count": lambda t, s: (
        s.select_expr("explode(split(sentence, ' ')) AS word", "n")
        .where("length(word) > 1")
        .group_by("word")
        .persistent_aggregate(Count(), out="c", state=OpaqueMapState)
    ),
    "sql+each+sum": lambda t, s: (
        s.select_expr("sentence", "n")
        .where("n IS NULL OR n < 5")
        .each(split, out="word", fields=["sentence"])
        .group_by("word")
        .persistent_aggregate(Sum("n"), out="total", state=OpaqueMapState)
    ),
    "each/filter/map, two outputs": _rows_two_outputs,
}


def _canonical(result) -> tuple:
    outputs = {i: sorted(json.dumps(item, sort_keys=True, default=str) for item in items) for i, items in result.outputs.items()}
    letters = sorted(json.dumps(letter, sort_keys=True, default=str) for letter in result.dead_letters)
    return outputs, letters, result.input_rows, result.inputs


@pytest.mark.parametrize("name", list(STAGES))
def test_the_driver_path_gives_what_the_spark_path_gives(spark, tmp_path, monkeypatch, name):
    monkeypatch.setenv("STREAM_OPS_CACHE", str(tmp_path / "cache"))
    topology = Topology("paths")
    STAGES[name](topology, topology.source("lines", FileTopic(tmp_path / "in", 1), schema={"sentence": "string", "n": "long"}))
    stage = build_plan(topology).stage(0)
    batch = spark.createDataFrame(ROWS, SCHEMA)
    in_spark = _canonical(source_batch(batch, stage, on_driver=False))

    def no_python_worker(*args, **kwargs):
        raise AssertionError("the driver path ran mapInArrow")

    monkeypatch.setattr(DataFrame, "mapInArrow", no_python_worker)
    on_driver = _canonical(source_batch(batch, stage, on_driver=True))
    assert on_driver == in_spark
    assert in_spark[1], "the batch has dead letters"


def _committed(store: ZkStore, topology_id: str, task_id: int) -> int:
    return store.get_json(ZkPaths.transactional_task(topology_id, task_id))[0]["committed_txid"]


def _wait(condition, what: str) -> None:
    deadline = time.monotonic() + 90
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_small_batches_of_a_query_run_on_the_driver_and_count_exactly(spark, zk_config, tmp_path, monkeypatch):
    cluster = ClusterConfig(root=tmp_path / "cluster")
    on_driver: list[int] = []
    real_driver_rows = compiler.driver_rows
    monkeypatch.setattr(compiler, "driver_rows", lambda df, fn, agg: on_driver.append(1) or real_driver_rows(df, fn, agg))
    topic = FileTopic(tmp_path / "in", queues=1)
    topic.create()
    lines = [["how are you", "how"], ["you you", "nice"], ["how day", "{broken"]]

    def land(i: int) -> None:
        text = [json.dumps({"sentence": s}) if not s.startswith("{") else s for s in lines[i]]
        topic.write_lines(0, f"in-{i}.jsonl", text)

    with ZkStore.connect(zk_config) as admin, ZkStore.connect(zk_config) as store_a:
        topology_id = submit(admin, cluster, build_wordcount(tmp_path / "in", queues=1, state=TransactionalMapState), workers=1)
        a = make_runner(store_a, spark, cluster, topology_id, "host-a:1", stage=0, trigger_seconds=0.1)
        task = a.task.task_id
        a.start()
        land(0)
        _wait(lambda: _committed(admin, topology_id, task) == 0, "txid 0 committed")

        # A pauses before its ZooKeeper commit of txid 1 and loses the task to B.
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

        # B commits txid 1, then "crashes" before Spark logs the batch done: C replays it.
        crash_after_publish(monkeypatch, 1, OwnershipLostError("simulated crash after the ZooKeeper commit"))
        b.start_query()
        _wait(lambda: not b.is_running(), "B's query dies after committing txid 1")
        b.stop()
        c = make_runner(admin, spark, cluster, topology_id, "host-c:3", stage=0, trigger_seconds=0.1)
        c.start()
        land(2)
        _wait(lambda: _committed(admin, topology_id, task) == 2, "txid 2 committed")
        c.stop()
        stats = (a.stats.rows_in, b.stats.rows_in, c.stats.rows_in)
        shuffle = c.layout.shuffle_topic(c.plan.stage(1))
        letters = [r for _, _, r in c.layout.dead_letter_topic().read_queue(0)]

    counted: Counter[str] = Counter()
    for row in read_partials(shuffle.files(0), "long").to_pylist():
        counted[row["key"]] += row["value"]
    words = Counter(encode_key([w]) for s in ["how are you", "how", "you you", "nice", "how day"] for w in s.split(" "))
    assert counted == words
    assert [(r["record"], r["txid"]) for r in letters] == [("{broken", 2)]
    assert stats == (2, 0, 2), "rows of completed batches: A txid 0, C txid 2 (B's txid 1 crashed, its replay skipped)"
    assert len(on_driver) == 4, "A: txids 0 and 1 (refused), B: txid 1, C: txid 2"


def test_a_batch_is_small_by_its_files_in_the_file_source_log(spark, tmp_path):
    files = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    for path, size in zip(files, (300, 700), strict=True):
        path.write_bytes(b"x" * size)
    log = tmp_path / "checkpoint" / "sources" / "0"
    log.mkdir(parents=True)
    entries = [{"path": path.as_uri(), "timestamp": 0, "batchId": 4} for path in files]
    (log / "4").write_text("\n".join(["v1", *map(json.dumps, entries)]), encoding="utf-8")
    batch = spark.createDataFrame(ROWS, SCHEMA)
    seen: dict[int, bool] = {}

    def decide(df, batch_id):
        seen[batch_id] = compiler.computes_on_driver(df)

    noting = compiler.noting_input_bytes(decide, tmp_path / "checkpoint")
    for limit in ("1000", "999"):
        spark.conf.set(DRIVER_BATCH_BYTES_CONF, limit)
        try:
            noting(batch, 4)
            noting(batch, 5)  # no log entry: the size is unknown
        finally:
            spark.conf.unset(DRIVER_BATCH_BYTES_CONF)
        assert seen == {4: limit == "1000", 5: False}
    assert not compiler.computes_on_driver(batch), "noted only while its callback runs"
