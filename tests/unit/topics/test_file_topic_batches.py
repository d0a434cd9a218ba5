"""Staged batch files: durable before the commit, published as the commit recorded, and
never removed by an owner older than the files' epoch."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from stream_ops.errors import CommittedBatchLostError
from stream_ops.topics import file_topic as file_topic_module
from stream_ops.topics.file_topic import FileTopic, batch_file_name


@pytest.fixture
def topic(tmp_path: Path) -> FileTopic:
    return FileTopic(tmp_path / "shuffle", queues=2)


def test_a_written_file_and_its_directory_are_fsynced_before_the_write_returns(
    topic: FileTopic, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    target = topic.stage_batch(1, task_id=3, txid=7, epoch=2, records=[{"a": 1}])
    assert any(".tmp" in path and target.name in path for path in synced), synced  # the data, before the rename
    assert str(target.parent) in synced  # the name, after it


def test_a_topic_that_is_not_durable_does_not_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(os, "fsync", calls.append)
    FileTopic(tmp_path / "t", durable=False).stage_batch(0, 1, 1, 1, [{"a": 1}])
    assert calls == []


def test_publish_moves_what_the_commit_recorded_and_touches_the_files(topic: FileTopic) -> None:
    staged = topic.stage_batch(1, 3, 7, 2, [{"a": 1}, {"a": 2}])
    week_ago = time.time() - 8 * 86400
    os.utime(staged, (week_ago, week_ago))  # staged long ago: Spark's maxFileAge would skip it
    expected = topic.staged_sizes(3, 7, 2)
    assert expected == {"1": staged.stat().st_size}

    assert topic.publish_batch(3, 7, 2, expected) == 1
    published = topic.queue_path(1) / batch_file_name(3, 7, 2)
    assert published.exists() and not staged.exists()
    assert published.stat().st_mtime > time.time() - 60
    assert topic.publish_batch(3, 7, 2, expected) == 0  # idempotent


def test_a_committed_file_that_is_gone_or_cut_short_fails_the_publish(topic: FileTopic) -> None:
    staged = topic.stage_batch(0, 3, 7, 2, [{"a": 1}])
    expected = topic.staged_sizes(3, 7, 2)
    staged.write_text("")  # cut short by a crash
    with pytest.raises(CommittedBatchLostError, match="has 0 bytes, the commit recorded"):
        topic.publish_batch(3, 7, 2, expected)
    (topic.queue_path(0) / staged.name).unlink()
    with pytest.raises(CommittedBatchLostError, match="neither staged nor published"):
        topic.publish_batch(3, 7, 2, expected)


def test_two_concurrent_publishes_of_one_batch_both_succeed(topic: FileTopic, monkeypatch: pytest.MonkeyPatch) -> None:
    for queue in (0, 1):
        topic.stage_batch(queue, 3, 7, 2, [{"q": queue}])
    expected = topic.staged_sizes(3, 7, 2)
    # Both publishers see the target missing before either renames (the race of two owners).
    barrier = threading.Barrier(2)
    real_utime = os.utime

    def utime_in_step(path: Path, *args: object) -> None:
        barrier.wait(5)
        real_utime(path, *args)

    monkeypatch.setattr(file_topic_module.os, "utime", utime_in_step)
    results: list[object] = []

    def publish() -> None:
        try:
            results.append(topic.publish_batch(3, 7, 2, expected))
        except Exception as e:  # noqa: BLE001 - the test inspects it
            results.append(e)

    threads = [threading.Thread(target=publish) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert all(isinstance(r, int) for r in results), results
    assert sorted(p.name for q in (0, 1) for p in topic.files(q)) == [batch_file_name(3, 7, 2)] * 2


def test_discard_keeps_newer_epochs_and_the_committed_batch(topic: FileTopic) -> None:
    older = topic.stage_batch(0, 3, 11, 5, [{"a": 1}])  # a dead predecessor's uncommitted batch
    committed = topic.stage_batch(0, 3, 10, 5, [{"a": 2}])  # committed, not yet published
    newer = topic.stage_batch(0, 3, 11, 7, [{"a": 3}])  # a newer owner's batch in flight
    other_task = topic.stage_batch(0, 4, 11, 1, [{"a": 4}])
    crashed_tmp = topic.pending_path(0) / f".{batch_file_name(3, 12, 5)}.{'0' * 32}.tmp"
    crashed_tmp.write_text("half")
    newer_tmp = topic.pending_path(0) / f".{batch_file_name(3, 12, 7)}.{'1' * 32}.tmp"
    newer_tmp.write_text("in flight")

    # The caller is a stale owner at epoch 6 that does not know epoch 7 took over.
    assert topic.discard_staged(3, below_epoch=6, keep=(10, 5)) == 2
    assert not older.exists() and not crashed_tmp.exists()
    assert committed.exists() and newer.exists() and other_task.exists() and newer_tmp.exists()


def test_stale_tick_temp_files_are_removed(topic: FileTopic) -> None:
    topic.create()
    old = topic.queue_path(0) / f".tick-t00003-1.jsonl.{'2' * 32}.tmp"
    old.write_text("")
    fresh = topic.queue_path(0) / f".tick-t00003-2.jsonl.{'3' * 32}.tmp"
    fresh.write_text("")
    os.utime(old, (time.time() - 120, time.time() - 120))
    assert topic.discard_stale_temp_files(0, "tick-t00003-", older_than_s=60, now=time.time()) == 1
    assert not old.exists() and fresh.exists()


def test_files_and_directories_are_private_under_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        topic = FileTopic(tmp_path / "topics" / "dead-letters", queues=1)
        staged = topic.stage_batch(0, 3, 7, 2, [{"a": 1}])
        topic.publish_batch(3, 7, 2, topic.staged_sizes(3, 7, 2))
        published = topic.queue_path(0) / staged.name
    finally:
        os.umask(old)
    assert published.stat().st_mode & 0o777 == 0o640
    for directory in (topic.queue_path(0), topic.pending_path(0), topic.root, topic.root.parent):
        assert directory.stat().st_mode & 0o777 == 0o750, directory
