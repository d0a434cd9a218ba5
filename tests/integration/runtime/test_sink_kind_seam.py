"""A sink kind written for the tests (issue 32): adding a sink is its module, its registration
and its tests. The kind writes each committed batch as one JSON-lines file per (task, txid) into
a directory; a real TaskRunner (real Spark and ZooKeeper) runs it, and a batch whose delivery
failed after the commit is delivered once by the next owner, its replay adding nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from runners import make_runner

from stream_ops import FileTopic, Topology
from stream_ops.config import ClusterConfig
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import TopologyDefinitionError
from stream_ops.nimbus.submission import submit
from stream_ops.sinks import DeliveredBatchWriter
from stream_ops.topology import sink_kinds as sink_kinds_module
from stream_ops.topology.plan import SinkSpec
from stream_ops.topology.sink_kinds import SinkContext, SinkKind, SinkWriter, register_sink_kind

SOURCE_SCHEMA = "sentence string, _corrupt_record string"


class JsonLinesWriter(DeliveredBatchWriter):
    """Writes a published batch to ``<path>/<prefix>t<task>-x<txid>.jsonl``: a second delivery of
    a txid writes the same file again."""

    fail_txids: set[int] = set()

    def deliver(self, txid: int, records: list[dict]) -> None:
        if txid in self.fail_txids:
            self.fail_txids.discard(txid)
            raise OSError("the directory is away")
        assert self.spec.path is not None
        name = f"{self.spec.options.get('prefix', '')}t{self.context.task.task_id:05d}-x{txid:09d}.jsonl"
        target = Path(self.spec.path) / name
        temp = target.with_suffix(".tmp")
        temp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
        os.replace(temp, target)


class JsonLinesKind(SinkKind):
    name = "jsonl_dir"
    writes_directory = True
    asset_kinds = frozenset({"json"})

    def check_spec(self, spec: SinkSpec) -> None:
        super().check_spec(spec)
        if spec.path is None:
            raise TopologyDefinitionError(f"jsonl_dir sink {spec.name!r}: needs a path")

    def writer(self, spec: SinkSpec, context: SinkContext) -> SinkWriter:
        Path(spec.path or "").mkdir(parents=True, exist_ok=True)
        return JsonLinesWriter(spec, context)


@pytest.fixture
def jsonl_kind(monkeypatch):
    monkeypatch.setattr(sink_kinds_module, "_KINDS", sink_kinds_module._KINDS.copy())  # registered for this test only
    register_sink_kind(JsonLinesKind())
    monkeypatch.setattr(JsonLinesWriter, "fail_txids", set())
    return JsonLinesWriter


def _sentences(spark, *sentences):
    return spark.createDataFrame([(s, None) for s in sentences], SOURCE_SCHEMA)


def _written(root: Path) -> dict[str, list[str]]:
    return {p.name: [json.loads(line)["word"] for line in p.read_text().splitlines()] for p in sorted(root.glob("*.jsonl"))}


def test_a_sink_kind_registered_by_a_test_writes_each_batch_once_under_a_replay(spark, zk_config, tmp_path, jsonl_kind):
    out = tmp_path / "jsonl"
    t = Topology("jsonl")
    words = t.source("sentences", FileTopic(tmp_path / "in", 1), schema={"sentence": "string"})
    words.select_expr("explode(split(sentence, ' ')) AS word").to_sink(
        "jsonl_dir", path=out, options={"prefix": "w-"}, name="out"
    )
    cluster = ClusterConfig(root=tmp_path / "cluster")
    jsonl_kind.fail_txids = {1}
    with ZkStore.connect(zk_config) as admin:
        topology_id = submit(admin, cluster, t, workers=1)
        a = make_runner(admin, spark, cluster, topology_id, "host-a:1", stage=0)
        a.prepare()
        a.process_batch(_sentences(spark, "how are you"), 0)
        with pytest.raises(OSError, match="the directory is away"):
            a.process_batch(_sentences(spark, "fine thanks"), 1)  # committed and published, not delivered
        a.stop()
        assert sorted(_written(out)) == ["w-t00000-x000000000.jsonl"]
        b = make_runner(admin, spark, cluster, topology_id, "host-b:2", stage=0)
        b.prepare()  # the new owner delivers the committed batch
        b.process_batch(_sentences(spark, "fine thanks"), 1)  # Spark's replay of it adds nothing
        b.process_batch(_sentences(spark, "bye"), 2)
        b.stop()
    assert _written(out) == {
        "w-t00000-x000000000.jsonl": ["how", "are", "you"],
        "w-t00000-x000000001.jsonl": ["fine", "thanks"],
        "w-t00000-x000000002.jsonl": ["bye"],
    }
    assert b.layout.sink_delivery_topic(b.stage, "out").files(0) == [], "delivered batches are removed"


def test_a_second_sink_on_the_kinds_directory_is_refused(tmp_path, jsonl_kind):
    t = Topology("jsonl")
    words = t.source("sentences", FileTopic(tmp_path / "in", 1), schema={"sentence": "string"})
    words.to_sink("jsonl_dir", path=tmp_path / "out", name="a")
    with pytest.raises(TopologyDefinitionError, match="two sinks on one directory"):
        words.to_parquet(tmp_path / "out" / "inner", name="b")
