"""Shared markers only move forward: what a queue's reader consumed, what a sink delivered.

A previous owner (a zombie, or the I/O thread of a stopped runner) that read a marker before
the new owner wrote it and writes after cannot move it back, with or without owner epochs; an
upstream task's restart then still finds its consumed (or delivered) committed files accounted
for. Writers racing on real files, in threads and in processes, never lose an update.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stream_ops.durable_files import ForwardMarker, create_exclusively
from stream_ops.errors import TopicError
from stream_ops.topics.delivery_topic import DeliveryTopic
from stream_ops.topics.file_topic import FileTopic, batch_file_name

UPSTREAM = 3
WAIT_S = 30.0


def _publish(topic: FileTopic, task: int, txid: int) -> dict[str, int]:
    """An upstream batch of ``task`` into queue 0: staged, committed (its record returned), published."""
    topic.stage_batch(0, task, txid, 1, [{"key": "k", "value": txid}])
    record = topic.staged_sizes(task, txid, 1)
    topic.publish_batch(task, txid, 1, record)
    return record


def _stalled_between_read_and_write(
    monkeypatch: pytest.MonkeyPatch, stalled: threading.Thread
) -> tuple[threading.Event, threading.Event]:
    """Make ``stalled`` stop right after it read a marker, before it writes its new value
    (where it encodes that value): returns (read, resume) events."""
    read, resume = threading.Event(), threading.Event()
    real_dumps: Callable[..., str] = json.dumps

    def dumps(*args: Any, **kwargs: Any) -> str:
        if threading.current_thread() is stalled and not read.is_set():
            read.set()
            assert resume.wait(WAIT_S), "the new owner did not write in time"
        return real_dumps(*args, **kwargs)

    monkeypatch.setattr(json, "dumps", dumps)
    return read, resume


def _epochs(with_epochs: bool, epoch: int) -> dict[str, int]:
    return {"epoch": epoch} if with_epochs else {}


@pytest.mark.parametrize("with_epochs", [True, False], ids=["owner-epochs", "no-epochs"])
def test_a_previous_reader_recording_late_never_moves_consumed_back(tmp_path, monkeypatch, with_epochs):
    topic = FileTopic(tmp_path / "shuffle", queues=1)
    records = [_publish(topic, UPSTREAM, txid) for txid in range(8)]
    retired: list[int] = []
    zombie = threading.Thread(target=lambda: retired.append(topic.retire_consumed(0, {UPSTREAM: 3}, **_epochs(with_epochs, 1))))
    read, resume = _stalled_between_read_and_write(monkeypatch, zombie)
    zombie.start()
    assert read.wait(WAIT_S), "the previous owner did not read the record"
    assert topic.retire_consumed(0, {UPSTREAM: 7}, **_epochs(with_epochs, 2)) == 8  # the new owner: {U: 7}
    resume.set()
    zombie.join(WAIT_S)
    assert retired == [0]
    assert topic.consumed_txids(0) == {UPSTREAM: 7}
    # The upstream task restarts and publishes its committed txid 7 again: consumed, not lost.
    assert topic.publish_batch(UPSTREAM, 7, 1, records[7]) == 0


@pytest.mark.parametrize("with_epochs", [True, False], ids=["owner-epochs", "no-epochs"])
def test_a_previous_owner_marking_an_older_delivery_late_never_moves_it_back(tmp_path, monkeypatch, with_epochs):
    topic = DeliveryTopic(tmp_path / "sink", queues=1)
    records = [_publish(topic, UPSTREAM, txid) for txid in range(8)]
    zombie = threading.Thread(target=lambda: topic.mark_delivered(0, UPSTREAM, 3, **_epochs(with_epochs, 1)))
    read, resume = _stalled_between_read_and_write(monkeypatch, zombie)
    zombie.start()
    assert read.wait(WAIT_S), "the previous owner did not read the marker"
    for txid, _ in list(topic.undelivered(0, UPSTREAM)):  # the new owner delivers everything
        topic.mark_delivered(0, UPSTREAM, txid, **_epochs(with_epochs, 2))
    resume.set()
    zombie.join(WAIT_S)
    assert topic.delivered_txid(0, UPSTREAM) == 7
    assert topic.publish_batch(UPSTREAM, 7, 1, records[7]) == 0  # the restart: delivered, not lost
    assert topic.files(0) == []


def test_a_stale_owner_records_and_deletes_nothing_once_a_newer_one_recorded(tmp_path):
    topic = FileTopic(tmp_path / "shuffle", queues=1)
    for txid in range(4):
        _publish(topic, UPSTREAM, txid)
    assert topic.retire_consumed(0, {UPSTREAM: 0}, epoch=2) == 1
    assert topic.retire_consumed(0, {UPSTREAM: 2}, epoch=1) == 0  # refused: it may be behind the new owner
    assert topic.consumed_txids(0) == {UPSTREAM: 0} and len(topic.files(0)) == 3
    delivery = DeliveryTopic(tmp_path / "sink", queues=1)
    _publish(delivery, UPSTREAM, 0)
    assert delivery.mark_delivered(0, UPSTREAM, 0, epoch=2)
    _publish(delivery, UPSTREAM, 1)
    assert not delivery.mark_delivered(0, UPSTREAM, 1, epoch=1)
    assert delivery.delivered_txid(0, UPSTREAM) == 0 and [p.name for p in delivery.files(0)] == [batch_file_name(UPSTREAM, 1, 1)]


def test_racing_reader_threads_lose_no_update(tmp_path):
    topic = FileTopic(tmp_path / "shuffle", queues=1, durable=False)
    topic.create()
    rounds = 150
    seen: list[dict[int, int]] = []
    regressions: list[tuple[int, int, int | None]] = []
    done = threading.Event()

    def retire(task: int) -> None:
        for txid in range(rounds):
            topic.retire_consumed(0, {task: txid})

    def observe() -> None:
        last: dict[int, int] = {}
        while not done.is_set():
            now = topic.consumed_txids(0)
            regressions.extend((t, last[t], now.get(t)) for t in last if now.get(t, -1) < last[t])
            last = now
            seen.append(now)

    writers = [threading.Thread(target=retire, args=(task,)) for task in (1, 2)]
    observer = threading.Thread(target=observe)
    for thread in (*writers, observer):
        thread.start()
    for thread in writers:
        thread.join(WAIT_S * 4)
    done.set()
    observer.join(WAIT_S)
    assert not regressions, regressions[:5]
    assert topic.consumed_txids(0) == {1: rounds - 1, 2: rounds - 1}
    assert len(seen) > 1


_WRITER = """
import sys
from stream_ops.topics.file_topic import FileTopic
topic = FileTopic(sys.argv[1], queues=1, durable=False)
task, rounds = int(sys.argv[2]), int(sys.argv[3])
for txid in range(rounds):
    topic.retire_consumed(0, {task: txid})
"""


def test_racing_reader_processes_lose_no_update(tmp_path):
    topic = FileTopic(tmp_path / "shuffle", queues=1, durable=False)
    topic.create()
    rounds = 150
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[3]), *sys.path])}
    writers = [
        subprocess.Popen([sys.executable, "-c", _WRITER, topic.path, str(task), str(rounds)], env=env, stderr=subprocess.PIPE)
        for task in (1, 2)
    ]
    last: dict[int, int] = {}
    deadline = time.monotonic() + WAIT_S * 4
    while any(w.poll() is None for w in writers):
        assert time.monotonic() < deadline, "the writer processes did not finish"
        now = topic.consumed_txids(0)
        assert all(now.get(t, -1) >= txid for t, txid in last.items()), (last, now)
        last = now
    for writer in writers:
        _, errors = writer.communicate(timeout=WAIT_S)
        assert writer.returncode == 0, errors.decode()
    assert topic.consumed_txids(0) == {1: rounds - 1, 2: rounds - 1}


def test_a_writer_slow_enough_to_create_a_collected_version_merges_again(tmp_path, monkeypatch):
    """A writer read version 1; faster writers then created 2 to 4 and collected 2: the slow
    writer's create of 2 succeeds (the name is free again) but nobody reads 2 under 4."""
    marker = ForwardMarker(tmp_path, "_m", durable=False)
    for txid in range(2):
        marker.advance({"fast": txid})
    stale = marker.read()
    assert stale.version == 1
    for txid in range(2, 5):
        marker.advance({"fast": txid})
    assert not (tmp_path / "_m-v000000000002.json").exists()
    reads = iter([stale])
    original = ForwardMarker.read
    monkeypatch.setattr(ForwardMarker, "read", lambda self: next(reads, None) or original(self))
    written = marker.advance({"slow": 7})
    assert written is not None and written.txids == {"fast": 4, "slow": 7}
    monkeypatch.undo()
    assert marker.read().txids == {"fast": 4, "slow": 7}


def test_a_reader_never_returns_a_version_a_slow_writer_created_again(tmp_path, monkeypatch):
    """A reader listed version 2 as the newest; before it opened the file, faster writers made
    3 and 4 (collecting 2) and a slow writer that had read version 1 created 2 again, built on
    1. The reader must not answer that: it is older than what version 2 first held."""
    marker = ForwardMarker(tmp_path, "_m", durable=False)
    for txid in range(5):
        marker.advance({"fast": txid})
    recycled = tmp_path / "_m-v000000000002.json"
    assert not recycled.exists()
    recycled.write_text(json.dumps({"epoch": -1, "txids": {"fast": 1, "slow": 7}}))
    listings = iter([[2]])  # the listing taken while 2 was the newest
    original = ForwardMarker._versions
    monkeypatch.setattr(ForwardMarker, "_versions", lambda self: next(listings, None) or original(self))
    assert marker.read().txids == {"fast": 4}


def test_old_versions_and_crashed_writes_go_and_a_version_cut_short_is_not_read(tmp_path):
    marker = ForwardMarker(tmp_path, "_m", durable=False)
    for txid in range(4):
        marker.advance({"a": txid})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["_m-v000000000002.json", "_m-v000000000003.json"]
    (tmp_path / "_m-v000000000004.json").write_text('{"epoch":-1,"txids":{"a":9')  # an OS crash cut it short
    assert marker.read().txids == {"a": 3} and marker.read().version == 4
    crashed, running = (tmp_path / f"._m-v000000000005.json.{c * 32}.tmp" for c in "ab")
    for temp in (crashed, running):
        temp.write_text("{")
    os.utime(crashed, (time.time() - 120, time.time() - 120))  # a writer killed two minutes ago
    written = marker.advance({"a": 5})
    assert written is not None and written.version == 5
    assert marker.read().txids == {"a": 5}
    assert not crashed.exists() and running.exists()


def test_a_taken_name_is_not_replaced_and_a_file_system_without_links_is_refused(tmp_path, monkeypatch):
    target = tmp_path / "v1"
    assert create_exclusively(target, b"first")
    assert not create_exclusively(target, b"second")
    assert target.read_bytes() == b"first" and [p.name for p in tmp_path.iterdir()] == ["v1"]

    def no_links(source: Any, destination: Any) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    with pytest.raises(TopicError, match="need a file system with hard links"):
        ForwardMarker(tmp_path, "_m").advance({"a": 1})
    assert [p.name for p in tmp_path.iterdir()] == ["v1"]
