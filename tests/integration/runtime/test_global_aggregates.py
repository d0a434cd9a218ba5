"""Ungrouped aggregates on real Spark and ZooKeeper: Stream.aggregate (one record per batch)
and persistent_aggregate without group_by (one global key, one task)."""

from __future__ import annotations

from pathlib import Path

import pytest
from runners import make_runner

from stream_ops import Count, FileTopic, OpaqueMapState, Topology
from stream_ops.config import ClusterConfig
from stream_ops.coordination.store import ZkStore
from stream_ops.examples.wordcount import split
from stream_ops.nimbus.submission import submit

SOURCE_SCHEMA = "sentence string, _corrupt_record string"


@pytest.fixture
def cluster(tmp_path) -> ClusterConfig:
    return ClusterConfig(root=tmp_path / "cluster")


def _shuffled(spark, runner):
    reader = spark.read.schema(", ".join(f"{f} {t}" for f, t in runner.stage.input_fields.items()))
    return reader.format("parquet" if runner.stage.shuffle_format == "parquet" else "json").load(str(runner.input_dir))


def test_a_batch_aggregate_emits_one_record_and_a_global_count_keeps_one_value(spark, zk_config, cluster, tmp_path, caplog):
    t = Topology("totals")
    words = t.source("sentences", FileTopic(tmp_path / "in", 2), schema={"sentence": "string"}).each(
        split, out="word", fields=["sentence"]
    )
    t.query("total", words.persistent_aggregate(Count(), out="words", state=OpaqueMapState, name="total"))
    words.aggregate(Count(), out="n", name="per-batch").print(name="batches")
    with ZkStore.connect(zk_config) as admin:
        topology_id = submit(admin, cluster, t, workers=1)
        source = make_runner(admin, spark, cluster, topology_id, "host-a:1", stage="sentences")
        source.prepare()
        source.process_batch(spark.createDataFrame([("how are you", None), ("fine", None)], SOURCE_SCHEMA), 0)
        source.stop()
        total = make_runner(admin, spark, cluster, topology_id, "host-a:1", stage="total")
        total.prepare()
        total.process_batch(_shuffled(spark, total), 0)
        assert total.lookup([()]) == [4]
        total.stop()
        per_batch = make_runner(admin, spark, cluster, topology_id, "host-a:1", stage="per-batch")
        per_batch.prepare()
        with caplog.at_level("INFO", "stream_ops.print"):
            per_batch.process_batch(_shuffled(spark, per_batch), 0)
            per_batch.process_batch(_shuffled(spark, per_batch), 0)  # re-delivered: skipped, nothing printed again
        per_batch.stop()
    printed = [m for m in caplog.messages if m.startswith("batches ")]
    assert len(printed) == 1 and printed[0].endswith('{"n": 4}'), printed


USER_AGGREGATORS = """
from stream_ops.operators import CombinerAggregator, ReducerAggregator


class Longest(CombinerAggregator):
    value_type_name = "long"

    def init(self, record):
        return len(record["word"])

    def combine(self, a, b):
        return max(a, b)

    def zero(self):
        return 0


class Distinct(ReducerAggregator):
    def init(self):
        return []

    def reduce(self, state, record):
        return sorted({*state, record["word"]})
"""


def test_user_combiner_and_reducer_run_from_the_archive_under_a_replay(spark, zk_config, cluster, tmp_path):
    import importlib
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "security"))
    from user_packages import forget, import_ops, write_package

    src = tmp_path / "src"
    write_package(src, "aggpkg", "v1", extra={"aggs.py": USER_AGGREGATORS})
    import_ops(src, "aggpkg")
    sys.path.insert(0, str(src))
    try:
        aggs = importlib.import_module("aggpkg.aggs")
    finally:
        sys.path.remove(str(src))
    t = Topology("user-aggs")
    words = t.source("sentences", FileTopic(tmp_path / "in", 1), schema={"sentence": "string"}).each(
        split, out="word", fields=["sentence"]
    )
    t.query("longest", words.group_by("word").persistent_aggregate(aggs.Longest(), out="n", state=OpaqueMapState, name="longest"))
    t.query("distinct", words.persistent_aggregate(aggs.Distinct(), out="words", state=OpaqueMapState, name="distinct"))
    try:
        with ZkStore.connect(zk_config) as admin:
            topology_id = submit(admin, cluster, t, workers=1)
            forget("aggpkg")
            source = make_runner(admin, spark, cluster, topology_id, "host-a:1", stage="sentences")
            source.prepare()
            source.process_batch(spark.createDataFrame([("how are you", None), ("you", None)], SOURCE_SCHEMA), 0)
            source.stop()
            for stage, keys, expected in (
                ("longest", [("how",), ("you",)], [3, 3]),
                ("distinct", [()], [["are", "how", "you"]]),
            ):
                runner = make_runner(admin, spark, cluster, topology_id, "host-a:1", stage=stage)
                runner.prepare()
                runner.process_batch(_shuffled(spark, runner), 0)
                runner.process_batch(_shuffled(spark, runner), 0)  # re-delivered: nothing applied twice
                assert runner.lookup(keys) == expected
                runner.stop()
    finally:
        forget("aggpkg")
