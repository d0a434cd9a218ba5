"""Sink assets: lineage from the writing stages, and materializations from committed files."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from stream_ops import Count, FileTopic, OpaqueMapState, Topology
from stream_ops.examples.wordcount import split
from stream_ops.orchestration.assets import topology_assets
from stream_ops.orchestration.sinks import ParquetSinkWatch, observe_parquet_sinks, parquet_sink_metadata
from stream_ops.orchestration.translator import StreamOpsTranslator
from stream_ops.sinks import ParquetSink


def _topology(tmp_path: Path) -> Topology:
    t = Topology("flows")
    a = t.source("a", FileTopic(tmp_path / "a", 1), schema={"sentence": "string"})
    b = t.source("b", FileTopic(tmp_path / "b", 1), schema={"sentence": "string"})
    merged = t.merge(a, b)
    merged.to_parquet(tmp_path / "all", name="all")
    counts = merged.each(split, out="word", fields=["sentence"]).group_by("word")
    counts.persistent_aggregate(Count(), out="count", state=OpaqueMapState).new_values().print(name="changes")
    return t


def test_each_sink_is_one_asset_downstream_of_every_stage_writing_it(tmp_path):
    defs = topology_assets(topology=_topology(tmp_path))
    by_key = {spec.key: spec for spec in defs.sink_specs}
    translator = StreamOpsTranslator()
    parquet = by_key[translator.sink_asset_key("flows", "all")]
    assert [d.asset_key for d in parquet.deps] == [
        translator.stream_asset_key("flows", "a"),
        translator.stream_asset_key("flows", "b"),
    ]
    assert parquet.kinds == {"parquet"} and parquet.metadata["stream_ops/path"].value == str(tmp_path / "all")
    changes = by_key[translator.sink_asset_key("flows", "changes")]
    assert [d.asset_key for d in changes.deps] == [translator.stream_asset_key("flows", "count")]
    assert defs.parquet_sinks == (ParquetSinkWatch(parquet.key, str(tmp_path / "all")),)
    dg.Definitions(assets=defs.assets, asset_checks=defs.asset_checks)  # keys are unique and valid


def _commit(root: Path, task: int, txid: int, rows: list[dict]) -> None:
    sink = ParquetSink(root, {"word": "string"})
    sink.stage_batch(task, txid, 1, rows)
    sink.publish_batch(task, txid, 1, sink.staged_sizes(task, txid, 1))


def test_a_parquet_sink_is_materialized_when_a_task_commits_new_files(tmp_path):
    root = tmp_path / "sink"
    root.mkdir()
    watch = ParquetSinkWatch(dg.AssetKey(["s"]), str(root))
    assert parquet_sink_metadata(root) is None
    assert observe_parquet_sinks([watch], lambda key: None) == []
    _commit(root, 0, 0, [{"word": "how"}, {"word": "are"}])
    _commit(root, 1, 4, [{"word": "you"}])
    ParquetSink(root, {"word": "string"}).stage_batch(0, 1, 1, [{"word": "uncommitted"}])
    found = parquet_sink_metadata(root)
    assert found is not None and (found["rows"], found["files"], found["last_txids"]) == (3, 2, {"0": 0, "1": 4})
    assert "| word |" in found["preview"]
    (event,) = observe_parquet_sinks([watch], lambda key: None)
    assert event.metadata["rows"].value == 3 and event.metadata["last_txid"].value == 4
    assert observe_parquet_sinks([watch], lambda key: {"0": 0, "1": 4}) == []  # nothing new since
