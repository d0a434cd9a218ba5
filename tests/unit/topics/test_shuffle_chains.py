"""Every txid a shuffle batch reads up to is accounted for: read, or vouched for as empty.

An upstream batch with no rows for a queue writes no file there; the next file of its task in
the queue names the txid of the one before it, so a reader tells a txid that wrote nothing from
a committed file that was lost. The upstream task learns its last file per queue from its own
commit records, so a new owner continues the chain; a zombie's staged files change nothing,
and a replayed batch (of the reader or the writer) finds or writes the same.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from stream_ops.errors import CommittedBatchLostError, TopicError
from stream_ops.hashing import encode_key
from stream_ops.spark.shuffle_queue import batch_files, retire_read
from stream_ops.topics.file_topic import PREVIOUS_TXID_KEY, FileTopic, QueueChains, batch_file_name
from stream_ops.topics.shuffle_files import PartialsShuffle, previous_txid

TASK = 4


class Upstream:
    """One owner of upstream task :data:`TASK`: stages a batch's files into the queues it has
    rows for, commits (the commit record is what ``staged_sizes`` returns) and publishes."""

    def __init__(self, output: FileTopic | PartialsShuffle, epoch: int = 1) -> None:
        self.output, self.epoch = output, epoch

    def stage(self, txid: int, queues: set[int]) -> None:
        for queue in sorted(queues):
            if isinstance(self.output, PartialsShuffle):
                self.output.stage_batch(queue, TASK, txid, self.epoch, [encode_key([f"w{txid}"])], [txid + 1])
            else:
                self.output.stage_batch(queue, TASK, txid, self.epoch, [{"key": encode_key([f"w{txid}"]), "value": txid + 1}])

    def run(self, txid: int, queues: set[int]) -> dict[str, int]:
        """One committed batch: staged, recorded, published; returns its commit record."""
        self.stage(txid, queues)
        record = self.output.staged_sizes(TASK, txid, self.epoch)
        self.output.publish_batch(TASK, txid, self.epoch, record)
        return record


def _log_offsets(checkpoint: Path, batch: int, txids: dict[int, int]) -> None:
    """What Spark logs for the queue source's batch ``batch`` (its end offset)."""
    offsets = checkpoint / "offsets"
    offsets.mkdir(parents=True, exist_ok=True)
    entry = {"queueTxids": {str(t): x for t, x in sorted(txids.items())}}
    (offsets / str(batch)).write_text(f"v1\n{{}}\n{json.dumps(entry)}\n")


@pytest.fixture(params=["parquet", "jsonl"])
def output(request: pytest.FixtureRequest, tmp_path: Path) -> FileTopic | PartialsShuffle:
    """A two-queue shuffle: Parquet partials, or a chained topic of JSON lines."""
    if request.param == "parquet":
        return PartialsShuffle(FileTopic(tmp_path / "shuffle", queues=2), "long")
    return FileTopic(tmp_path / "shuffle", queues=2, chained=True)


def _topic(output: FileTopic | PartialsShuffle) -> FileTopic:
    return output.topic if isinstance(output, PartialsShuffle) else output


def _suffix(output: FileTopic | PartialsShuffle) -> str:
    return ".parquet" if isinstance(output, PartialsShuffle) else ".jsonl"


def _names(paths: list[Path]) -> list[tuple[int, int]]:
    return [(int(p.name[1:6]), int(p.name[8:20])) for p in paths]


def _six_txids_with_gaps(output: FileTopic | PartialsShuffle) -> None:
    """Txids 0-5 of the upstream task; queue 0 gets files of 0, 2, 3 and 5 only."""
    upstream = Upstream(output)
    for txid in range(6):
        upstream.run(txid, {0} if txid in (0, 2, 3, 5) else {1})


def test_txids_without_rows_for_the_queue_are_vouched_for_by_the_next_file(output, tmp_path):
    _six_txids_with_gaps(output)
    queue, checkpoint = _topic(output).queue_path(0), tmp_path / "checkpoint"
    _log_offsets(checkpoint, 0, {TASK: 0})
    _log_offsets(checkpoint, 1, {TASK: 5})
    assert _names(batch_files(checkpoint, 0, queue, _suffix(output))) == [(TASK, 0)]
    assert _names(batch_files(checkpoint, 1, queue, _suffix(output))) == [(TASK, 2), (TASK, 3), (TASK, 5)]
    assert [previous_txid(queue / batch_file_name(TASK, t, 1, _suffix(output))) for t in (0, 2, 3, 5)] == [-1, 0, 2, 3]
    # the first batch of a reader: txid 1 of the other queue's file only, then txid 2 here
    other, first = _topic(output).queue_path(1), tmp_path / "first"
    _log_offsets(first, 0, {TASK: 4})
    assert _names(batch_files(first, 0, other, _suffix(output))) == [(TASK, 1), (TASK, 4)]


@pytest.mark.parametrize("lost", [2, 3])
def test_a_lost_file_in_the_middle_of_a_batch_is_named(output, tmp_path, lost):
    _six_txids_with_gaps(output)
    queue, checkpoint = _topic(output).queue_path(0), tmp_path / "checkpoint"
    _log_offsets(checkpoint, 0, {TASK: 0})
    _log_offsets(checkpoint, 1, {TASK: 5})
    (queue / batch_file_name(TASK, lost, 1, _suffix(output))).unlink()
    with pytest.raises(CommittedBatchLostError, match=rf"t{TASK:05d}-x{lost:012d}-e\*{_suffix(output)}\) is gone"):
        batch_files(checkpoint, 1, queue, _suffix(output))


def test_a_replayed_batch_finds_its_files_after_the_earlier_batches_are_retired(output, tmp_path):
    _six_txids_with_gaps(output)
    topic, checkpoint = _topic(output), tmp_path / "checkpoint"
    _log_offsets(checkpoint, 0, {TASK: 0})
    _log_offsets(checkpoint, 1, {TASK: 5})
    first = batch_files(checkpoint, 1, topic.queue_path(0), _suffix(output))
    assert retire_read(topic, 0, {TASK: 0}) == 1  # batch 1 is planned: what batch 0 read goes
    # Spark delivers committed batch 1 again (a crash before its own commit): its first file
    # names the retired file of txid 0, which batch 0 read.
    assert batch_files(checkpoint, 1, topic.queue_path(0), _suffix(output)) == first


def test_a_new_owner_continues_the_chain_and_a_zombie_changes_nothing(output, tmp_path):
    old = Upstream(output, epoch=1)
    records = [old.run(txid, {0} if txid == 0 else {1}) for txid in range(3)]
    assert records[2] == {"1": records[2]["1"], "head:0": 0}
    old.stage(3, {0})  # the old owner, now a zombie, stages txid 3 and never commits it
    # The new owner's topic object knows nothing until it publishes the committed txid 2 from
    # its record, as a task's start does; then it runs txid 3 (again) and 4, and replays 4.
    new = Upstream(_other_process(output), epoch=2)
    new.output.publish_batch(TASK, 2, 1, records[2])
    new.run(3, {1})
    new.stage(4, {0})
    staged = _topic(output).pending_path(0) / batch_file_name(TASK, 4, 2, _suffix(output))
    first_bytes = staged.read_bytes()
    new.stage(4, {0})  # a replay of the uncommitted batch writes the same file
    assert staged.read_bytes() == first_bytes
    new.output.publish_batch(TASK, 4, 2, new.output.staged_sizes(TASK, 4, 2))
    queue, checkpoint = _topic(output).queue_path(0), tmp_path / "checkpoint"
    assert previous_txid(queue / batch_file_name(TASK, 4, 2, _suffix(output))) == 0
    _log_offsets(checkpoint, 0, {TASK: 4})
    assert _names(batch_files(checkpoint, 0, queue, _suffix(output))) == [(TASK, 0), (TASK, 4)]
    (queue / batch_file_name(TASK, 0, 1, _suffix(output))).unlink()
    with pytest.raises(CommittedBatchLostError, match=rf"t{TASK:05d}-x{0:012d}-e\*"):
        batch_files(checkpoint, 0, queue, _suffix(output))


def _other_process(output: FileTopic | PartialsShuffle) -> FileTopic | PartialsShuffle:
    """Another process's object for the same shuffle (it remembers nothing)."""
    topic = _topic(output)
    if isinstance(output, PartialsShuffle):
        return PartialsShuffle(FileTopic(topic.path, topic.queues), "long")
    return FileTopic(topic.path, topic.queues, chained=True)


@pytest.mark.parametrize("output", ["parquet", "jsonl"], indirect=True)
def test_a_file_after_a_gap_that_names_no_previous_txid_is_refused(output, tmp_path):
    for txid in (3, 5):  # objects that never published the task's previous batch: no chain known
        Upstream(_other_process(output)).run(txid, {0})
    queue, checkpoint = _topic(output).queue_path(0), tmp_path / "checkpoint"
    assert previous_txid(queue / batch_file_name(TASK, 5, 1, _suffix(output))) is None
    _log_offsets(checkpoint, 0, {TASK: 5})
    with pytest.raises(TopicError, match=rf"t{TASK:05d}-x{3:012d}-e000001.* follows a gap .* names no previous file"):
        batch_files(checkpoint, 0, queue, _suffix(output))
    assert (queue / batch_file_name(TASK, 3, 1, _suffix(output))).exists()  # refused, never skipped


def test_a_file_out_of_its_tasks_order_is_refused(tmp_path):
    topic = FileTopic(tmp_path / "shuffle", queues=2, chained=True)
    upstream = Upstream(topic)
    for txid in range(5):
        upstream.run(txid, {0} if txid in (0, 1, 4) else {1})
    queue = topic.queue_path(0)
    shutil.copy(queue / batch_file_name(TASK, 1, 1), queue / batch_file_name(TASK, 2, 1))  # a stray copy
    checkpoint = tmp_path / "checkpoint"
    _log_offsets(checkpoint, 0, {TASK: 2})
    _log_offsets(checkpoint, 1, {TASK: 4})
    with pytest.raises(TopicError, match="names txid 1 as its task's previous file"):
        batch_files(checkpoint, 1, queue, ".jsonl")


def test_a_chained_json_file_names_its_previous_txid_in_its_first_line_only(tmp_path):
    topic = FileTopic(tmp_path / "shuffle", queues=1, chained=True)
    staged = topic.stage_batch(0, TASK, 0, 1, iter([{"key": "a"}, {"key": "b"}]))
    lines = [json.loads(line) for line in staged.read_text().splitlines()]
    assert lines == [{"key": "a", PREVIOUS_TXID_KEY: -1}, {"key": "b"}]
    topic.publish_batch(TASK, 0, 1, topic.staged_sizes(TASK, 0, 1))
    assert [record for _, _, record in topic.read_queue(0)] == [{"key": "a"}, {"key": "b"}]
    plain = FileTopic(tmp_path / "sink", queues=1)  # a topic users read is never chained
    assert json.loads(plain.stage_batch(0, TASK, 0, 1, [{"key": "a"}]).read_text()) == {"key": "a"}
    assert plain.staged_sizes(TASK, 0, 1).keys() == {"0"}


def test_the_commit_record_keeps_the_last_file_per_queue() -> None:
    chains = QueueChains(queues=3)
    assert chains.commit_keys(TASK, 0, written=[1]) == {"head:0": -1, "head:2": -1}  # txid 0: nothing before
    assert chains.previous(TASK, 1, 0) is None  # txid 0 not published yet
    chains.committed(TASK, 0, {"1": 10, "head:0": -1, "head:2": -1})
    assert [chains.previous(TASK, 1, q) for q in range(3)] == [-1, 0, -1]
    assert chains.commit_keys(TASK, 1, written=[2]) == {"head:0": -1, "head:1": 0}
    chains.committed(TASK, 1, {"2": 10, "head:0": -1, "head:1": 0})
    chains.committed(TASK, 0, {"1": 10, "head:0": -1, "head:2": -1})  # an older batch published again
    assert [chains.previous(TASK, 2, q) for q in range(3)] == [-1, 0, 1]
    assert chains.previous(TASK, 3, 0) is None  # txid 2 not published: not known
