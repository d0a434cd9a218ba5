"""The state topic: replay rules, StateTopicQueue files and rebuilding a store."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from stream_ops.errors import ReplayError
from stream_ops.state import (
    OpaqueValue,
    RocksDBBackingMap,
    StateTopicEntry,
    StateTopicQueue,
    TransactionalValue,
    rebuild_store,
    replay_state_topic,
)
from stream_ops.topics.file_topic import FileTopic, batch_file_name


def entry(key: Any, value: Any, offset: int, txid: int, epoch: int = 1) -> dict[str, Any]:
    return {"key": key, "value": value, "offset": offset, "txid": txid, "epoch": epoch}


# --- replay_state_topic -----------------------------------------------------------------------


def test_the_largest_offset_wins_per_key() -> None:
    entries = [entry(["a"], 1, 0, 1), entry(["b"], 7, 1, 1), entry(["a"], 2, 2, 2), entry(["a"], 3, 3, 2)]
    assert replay_state_topic(entries, committed_txid=2) == {("a",): 3, ("b",): 7}


def test_offset_decides_not_the_order_entries_are_given_in() -> None:
    assert replay_state_topic([entry(["a"], 2, 5, 1), entry(["a"], 1, 4, 1)], committed_txid=1) == {("a",): 2}


def test_entries_after_the_committed_txid_are_ignored() -> None:
    entries = [entry(["a"], 1, 0, 1), entry(["a"], 2, 1, 2), entry(["b"], 9, 2, 3)]
    assert replay_state_topic(entries, committed_txid=1) == {("a",): 1}


def test_the_highest_epoch_of_a_txid_wins_even_against_a_larger_offset() -> None:
    entries = [
        entry(["a"], "new owner", 0, 5, epoch=3),
        entry(["a"], "dead owner", 1, 5, epoch=2),  # written later by the owner that lost the task
        entry(["b"], "dead owner only", 2, 5, epoch=2),  # its other keys do not count either
        entry(["c"], "older txid", 3, 4, epoch=2),  # a lower epoch is fine for another txid
    ]
    assert replay_state_topic(entries, committed_txid=5) == {("a",): "new owner", ("c",): "older txid"}


def test_a_tombstone_deletes_and_a_later_value_revives() -> None:
    entries = [
        entry(["a"], 1, 0, 1),
        entry(["b"], 1, 1, 1),
        entry(["a"], None, 2, 2),
        entry(["b"], None, 3, 2),
        entry(["b"], 4, 4, 3),
    ]
    assert replay_state_topic(entries, committed_txid=3) == {("b",): 4}


def test_list_keys_become_tuples_and_entry_objects_are_accepted() -> None:
    entries = [StateTopicEntry(("w", 1), 1, 0, 1, 1), entry(["w", 1], 2, 1, 1), entry(["x", [1, 2]], 3, 2, 1)]
    assert replay_state_topic(entries, committed_txid=1) == {("w", 1): 2, ("x", (1, 2)): 3}


@pytest.mark.parametrize("field", ["key", "value", "offset", "txid", "epoch"])
def test_an_entry_missing_a_field_is_a_replay_error(field: str) -> None:
    broken = entry(["a"], 1, 0, 1)
    del broken[field]
    with pytest.raises(ReplayError, match=f"entry #1 has no '{field}' field"):
        replay_state_topic([entry(["a"], 1, 0, 1), broken], committed_txid=1)


@pytest.mark.parametrize("bad", [entry("a", 1, 0, 1), entry(["a"], 1, "0", 1), entry(["a"], 1, 0, -1)])
def test_a_malformed_entry_is_a_replay_error(bad: dict[str, Any]) -> None:
    with pytest.raises(ReplayError, match="entry #0"):
        replay_state_topic([bad], committed_txid=1)


def test_two_counted_entries_of_a_key_at_one_offset_are_a_replay_error() -> None:
    with pytest.raises(ReplayError, match="share offset 3"):
        replay_state_topic([entry(["a"], 1, 3, 1), entry(["a"], 2, 3, 1)], committed_txid=1)


# --- StateTopicQueue ------------------------------------------------------------------------


@pytest.fixture
def queue(tmp_path: Path) -> StateTopicQueue:
    return StateTopicQueue(FileTopic(tmp_path / "state", queues=2), queue=1)


def test_append_writes_one_batch_file_and_entries_read_it_back(queue: StateTopicQueue) -> None:
    path = queue.append(4, txid=1, epoch=2, items=[(("a",), TransactionalValue(1, 3)), (("b", 1), None)])
    assert path == queue.path / batch_file_name(4, 1, 2, ".arrow")
    assert list(queue.entries()) == [
        StateTopicEntry(("a",), {"k": "tx", "txid": 1, "val": 3}, offset=0, txid=1, epoch=2),
        StateTopicEntry(("b", 1), None, offset=1, txid=1, epoch=2),
    ]


def test_offsets_increase_across_files_and_other_files_are_skipped(queue: StateTopicQueue) -> None:
    queue.append(4, txid=2, epoch=1, items=[(("a",), 2)])
    queue.append(4, txid=1, epoch=1, items=[(("a",), 1), (("b",), 1)])
    (queue.path / "notes.txt").write_text("not a batch file\n")
    assert [(e.offset, e.txid, e.key) for e in queue.entries()] == [(0, 1, ("a",)), (1, 1, ("b",)), (2, 2, ("a",))]


def test_a_replayed_batch_overwrites_its_file(queue: StateTopicQueue) -> None:
    queue.append(4, txid=1, epoch=1, items=[(("a",), 1), (("b",), 1)])
    queue.append(4, txid=1, epoch=1, items=[(("a",), 5)])
    assert queue.replay(committed_txid=1) == {("a",): 5}


def test_replay_round_trips_values_with_two_epochs_for_one_txid(queue: StateTopicQueue) -> None:
    queue.append(4, txid=1, epoch=1, items=[(("a",), OpaqueValue(1, 1)), (("b",), TransactionalValue(1, 1))])
    queue.append(4, txid=2, epoch=1, items=[(("a",), OpaqueValue(2, 9, 1)), (("c",), "dead")])  # owner lost the task
    queue.append(4, txid=2, epoch=2, items=[(("a",), OpaqueValue(2, 3, 1)), (("b",), None)])  # new owner re-ran 2
    queue.append(4, txid=3, epoch=2, items=[(("a",), OpaqueValue(3, 4, 3))])  # not committed yet

    assert queue.replay(committed_txid=2) == {("a",): OpaqueValue(2, 3, 1)}
    assert queue.replay(committed_txid=1) == {("a",): OpaqueValue(1, 1), ("b",): TransactionalValue(1, 1)}


# --- rebuild_store --------------------------------------------------------------------------


class SteppingClock:
    """A clock that advances a fixed step each time it is read."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_rebuild_store_restores_the_replayed_state(queue: StateTopicQueue, tmp_path: Path) -> None:
    queue.append(4, txid=1, epoch=1, items=[(("a",), TransactionalValue(1, 1)), (("b",), TransactionalValue(1, 2))])
    queue.append(4, txid=2, epoch=1, items=[(("a",), None)])
    queue.append(4, txid=3, epoch=1, items=[(("c",), TransactionalValue(3, 3))])
    with RocksDBBackingMap(tmp_path / "db") as store:
        assert rebuild_store(store, queue, committed_txid=2, committed_epoch=5) == 1
        assert list(store.items()) == [(("b",), TransactionalValue(1, 2))]
        assert store.applied_marker() == (2, 5)


def test_rebuild_store_logs_progress_at_a_bounded_rate(
    queue: StateTopicQueue, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    queue.append(4, txid=1, epoch=1, items=[((f"k{i}",), i) for i in range(100)])
    clock = SteppingClock(1.0)  # progress is checked per chunk of keys: here, one chunk
    with RocksDBBackingMap(tmp_path / "db") as store, caplog.at_level(logging.INFO, "stream_ops.state.state_topic"):
        rebuild_store(store, queue, committed_txid=1, committed_epoch=1, clock=clock)
    progress = [r for r in caplog.records if "/100 keys" in r.getMessage()]
    assert 0 < len(progress) <= clock.now / 1.0


# --- files lost by a machine crash --------------------------------------------


def test_an_empty_batch_writes_a_file_that_marks_its_epoch(queue: StateTopicQueue) -> None:
    path = queue.append(4, txid=0, epoch=2, items=[])
    reader = pa.ipc.open_file(path.read_bytes())
    assert reader.read_all().num_rows == 0
    assert json.loads(reader.schema.metadata[b"stream_ops.state_batch"]) == {"format": 1, "txid": 0, "epoch": 2, "entries": 0}
    assert queue.replay(0) == {}
    assert queue.top_epoch(0) == 2


def test_a_missing_committed_file_fails_the_rebuild(queue: StateTopicQueue, tmp_path: Path) -> None:
    queue.append(4, txid=0, epoch=1, items=[(("a",), 1)])
    lost = queue.append(4, txid=1, epoch=1, items=[(("a",), 2)])
    queue.append(4, txid=2, epoch=1, items=[])
    lost.unlink()
    with RocksDBBackingMap(tmp_path / "db") as store, pytest.raises(ReplayError, match="txid 1 have no state-topic file"):
        rebuild_store(store, queue, committed_txid=2, committed_epoch=1, require_complete=True)


def test_a_lost_file_of_the_committing_epoch_fails_the_rebuild(queue: StateTopicQueue, tmp_path: Path) -> None:
    queue.append(4, txid=0, epoch=1, items=[(("a",), 1)])
    queue.append(4, txid=1, epoch=1, items=[(("a",), 99)])  # a crashed attempt; epoch 2 committed txid 1
    with RocksDBBackingMap(tmp_path / "db") as store, pytest.raises(ReplayError, match="committed by epoch 2"):
        rebuild_store(store, queue, committed_txid=1, committed_epoch=2, require_complete=True)
