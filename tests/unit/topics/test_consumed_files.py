"""Consumed shuffle files: recorded, then deleted; a batch's files from its queue offsets.

A committed batch whose file its reader consumed and deleted publishes as done; one whose file
is gone without that record is lost. A batch's files are those above the previous batch's
offset up to its own, and a planned file that is gone stops the batch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stream_ops.errors import CommittedBatchLostError
from stream_ops.spark.shuffle_queue import (
    TICKS,
    batch_files,
    checkpoint_reader,
    next_tick_stamp,
    planned_txids,
    retire_read,
    tick_file_name,
    unread_files,
)
from stream_ops.topics.file_topic import FileTopic, batch_file_name


def _published(topic: FileTopic, task: int, txid: int) -> dict[str, int]:
    topic.stage_batch(0, task, txid, 1, [{"key": "k", "value": txid}])
    sizes = topic.staged_sizes(task, txid, 1)
    topic.publish_batch(task, txid, 1, sizes)
    return sizes


def _log_offsets(checkpoint: Path, batch: int, txids: dict[int, int]) -> None:
    offsets = checkpoint / "offsets"
    offsets.mkdir(parents=True, exist_ok=True)
    entry = {"queueTxids": {str(t): x for t, x in sorted(txids.items())}}
    (offsets / str(batch)).write_text(f"v1\n{{}}\n{json.dumps(entry)}\n")


def test_retired_files_are_deleted_after_they_are_recorded(tmp_path):
    topic = FileTopic(tmp_path / "shuffle", queues=1)
    for txid in range(3):
        _published(topic, 4, txid)
    _published(topic, 5, 0)
    assert topic.retire_consumed(0, {4: 1}) == 2
    assert [p.name for p in topic.files(0)] == [batch_file_name(4, 2, 1), batch_file_name(5, 0, 1)]
    assert topic.consumed_txids(0) == {4: 1}
    assert topic.retire_consumed(0, {4: 0, 5: 0}) == 1  # a record never moves back
    assert topic.consumed_txids(0) == {4: 1, 5: 0}


def test_a_consumed_file_publishes_again_and_a_missing_one_is_lost(tmp_path):
    topic = FileTopic(tmp_path / "shuffle", queues=1)
    first = _published(topic, 4, 0)
    second = _published(topic, 4, 1)
    topic.retire_consumed(0, {4: 0})
    assert topic.publish_batch(4, 0, 1, first) == 0  # consumed and deleted: done
    (topic.queue_path(0) / batch_file_name(4, 1, 1)).unlink()
    with pytest.raises(CommittedBatchLostError, match="neither staged nor published"):
        topic.publish_batch(4, 1, 1, second)


def test_a_batch_reads_the_files_between_its_offsets(tmp_path):
    topic = FileTopic(tmp_path / "shuffle", queues=1)
    for task, txids in ((4, range(4)), (5, range(2))):
        for txid in txids:
            _published(topic, task, txid)
    checkpoint = tmp_path / "checkpoint"
    assert checkpoint_reader(checkpoint) is None
    _log_offsets(checkpoint, 0, {4: 1})
    _log_offsets(checkpoint, 1, {4: 3, 5: 1})
    assert checkpoint_reader(checkpoint) == "queue"
    queue = topic.queue_path(0)
    assert [p.name for p in batch_files(checkpoint, 0, queue, ".jsonl")] == [batch_file_name(4, t, 1) for t in (0, 1)]
    assert [p.name for p in batch_files(checkpoint, 1, queue, ".jsonl")] == [
        batch_file_name(4, 2, 1),
        batch_file_name(4, 3, 1),
        batch_file_name(5, 0, 1),
        batch_file_name(5, 1, 1),
    ]
    with pytest.raises(CommittedBatchLostError):  # no Parquet file of the planned txids
        batch_files(checkpoint, 1, queue, ".parquet")
    assert planned_txids(checkpoint) == {4: 3, 5: 1}
    assert unread_files(queue, {4: 2}, ".jsonl") == sorted(
        [queue / batch_file_name(4, 3, 1), queue / batch_file_name(5, 0, 1), queue / batch_file_name(5, 1, 1)]
    )


def test_a_planned_file_that_is_gone_stops_the_batch(tmp_path):
    topic = FileTopic(tmp_path / "shuffle", queues=1)
    for txid in range(2):
        _published(topic, 4, txid)
    checkpoint = tmp_path / "checkpoint"
    _log_offsets(checkpoint, 0, {4: 1})
    (topic.queue_path(0) / batch_file_name(4, 1, 1)).unlink()
    with pytest.raises(CommittedBatchLostError, match=r"\(4, 1\)"):
        batch_files(checkpoint, 0, topic.queue_path(0), ".jsonl")
    _log_offsets(checkpoint, 2, {4: 1})  # batch 1's offset is not in the log
    with pytest.raises(CommittedBatchLostError, match="no offset of batch 1"):
        batch_files(checkpoint, 2, topic.queue_path(0), ".jsonl")


def test_a_file_source_checkpoint_is_told_apart(tmp_path):
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "offsets" / "0").write_text('v1\n{}\n{"logOffset":0}\n')
    assert checkpoint_reader(checkpoint) == "files"
    assert planned_txids(checkpoint) is None
    logged_only = tmp_path / "logged"
    (logged_only / "sources" / "0").mkdir(parents=True)
    (logged_only / "sources" / "0" / "0").write_text("v1\n")
    assert checkpoint_reader(logged_only) == "files"


def test_tick_files_count_as_one_more_task_and_are_retired_by_stamp(tmp_path):
    topic = FileTopic(tmp_path / "shuffle", queues=1)
    _published(topic, 4, 0)
    queue = topic.queue_path(0)
    for stamp in (100, 200):
        topic.write_file(0, tick_file_name(7, stamp), [{"stream": "__tick__"}])
    checkpoint = tmp_path / "checkpoint"
    _log_offsets(checkpoint, 0, {TICKS: 100})
    _log_offsets(checkpoint, 1, {4: 0, TICKS: 200})
    assert [p.name for p in batch_files(checkpoint, 0, queue, ".jsonl")] == [tick_file_name(7, 100)]
    assert [p.name for p in batch_files(checkpoint, 1, queue, ".jsonl")] == [batch_file_name(4, 0, 1), tick_file_name(7, 200)]
    assert next_tick_stamp(checkpoint, now_ns=150) == 201  # never at or below a planned tick
    assert next_tick_stamp(checkpoint, now_ns=999) == 999
    assert retire_read(topic, 0, {4: 0, TICKS: 100}) == 2
    assert [p.name for p in topic.files(0)] == [tick_file_name(7, 200)]
    assert topic.consumed_txids(0) == {4: 0}
