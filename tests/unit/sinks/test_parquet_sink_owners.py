"""Parquet and topic sink files carry their submission and sink (issue 31, item 5): a resubmitted topology,
whose txids start again at 0, never has its batch taken for one already published."""

from __future__ import annotations

from pathlib import Path

from stream_ops.sinks import read_table
from stream_ops.sinks.parquet_sink import ParquetSink, committed_markers
from stream_ops.topology.sink_paths import sink_owner


def _commit(sink: ParquetSink, task: int, txid: int, epoch: int, rows: list[dict]) -> None:
    sink.stage_batch(task, txid, epoch, rows)
    sink.publish_batch(task, txid, epoch, sink.staged_sizes(task, txid, epoch))


def test_two_submissions_of_a_topology_keep_every_row_of_their_batch_0(tmp_path: Path) -> None:
    first = ParquetSink(tmp_path, {"w": "string"}, owner=sink_owner("wc-1-1700000000", "out"))
    second = ParquetSink(tmp_path, {"w": "string"}, owner=sink_owner("wc-2-1700000100", "out"))
    _commit(first, 0, 0, 1, [{"w": "a1"}, {"w": "a2"}])
    _commit(second, 0, 0, 1, [{"w": "b1"}, {"w": "b2"}])  # same (task, txid, epoch) and the same size
    assert sorted(r["w"] for r in read_table(tmp_path).to_pylist()) == ["a1", "a2", "b1", "b2"]
    assert sorted(m["owner"] for m in committed_markers(tmp_path)) == ["wc-1-1700000000.out", "wc-2-1700000100.out"]
    assert {p.name for p in tmp_path.glob("*.parquet")} == {
        "wc-1-1700000000.out.t00000-x000000000000-e000001.parquet",
        "wc-2-1700000100.out.t00000-x000000000000-e000001.parquet",
    }


def test_discarding_staged_files_leaves_other_owners_files(tmp_path: Path) -> None:
    ours = ParquetSink(tmp_path, {"w": "string"}, owner="wc-1-1.out")
    theirs = ParquetSink(tmp_path, {"w": "string"}, owner="wc-2-2.out")
    ours.stage_batch(0, 5, 1, [{"w": "x"}])
    theirs.stage_batch(0, 5, 1, [{"w": "y"}])
    assert ours.discard_staged(0, below_epoch=2) == 1
    assert theirs.staged_sizes(0, 5, 1) and not ours.staged_sizes(0, 5, 1)


def test_a_topic_sink_written_by_two_submissions_keeps_both_batches(tmp_path: Path) -> None:
    from stream_ops.topics.file_topic import FileTopic

    read = FileTopic(tmp_path / "topic", 1)
    for owner, rows in (("wc-1-1700000000.out", [{"w": "a1"}]), ("wc-2-1700000100.out", [{"w": "b1"}])):
        topic = FileTopic(tmp_path / "topic", 1, owner=owner)
        topic.stage_batch(0, 0, 0, 1, rows)
        topic.publish_batch(0, 0, 1, topic.staged_sizes(0, 0, 1))
    assert sorted(record["w"] for _, _, record in read.read_queue(0)) == ["a1", "b1"]
    # A writer discards only its own staged files.
    ours, theirs = FileTopic(tmp_path / "topic", 1, owner="x-1-1.out"), FileTopic(tmp_path / "topic", 1, owner="x-2-2.out")
    ours.stage_batch(0, 0, 5, 1, [{"w": "x"}])
    theirs.stage_batch(0, 0, 5, 1, [{"w": "y"}])
    assert ours.discard_staged(0, below_epoch=2) == 1 and theirs.staged_sizes(0, 5, 1)
