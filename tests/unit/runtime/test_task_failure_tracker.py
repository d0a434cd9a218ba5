"""Backoff and quarantine of failing tasks (pure: no clock, no ZooKeeper)."""

from __future__ import annotations

import sqlite3

import pytest

from stream_ops.runtime.task_failures import FailurePolicy, FailureTracker, describe_error, is_resource_exhaustion

KEY = ("wordcount-db-3-1700000000", 4)
OTHER = ("wordcount-1-1700000000", 0)


def test_backoff_doubles_up_to_its_maximum() -> None:
    policy = FailurePolicy(initial_backoff_s=1.0, max_backoff_s=60.0)
    assert [policy.backoff_s(n) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]


def test_a_failing_task_waits_longer_after_each_failure_then_is_quarantined() -> None:
    tracker = FailureTracker(FailurePolicy(initial_backoff_s=1.0, quarantine_after=3))
    assert tracker.may_start(KEY, now=0.0, assigned_at=5.0)
    first = tracker.failed(KEY, "start failed: OperationalError: unable to open database file", now=10.0, assigned_at=5.0)
    assert (first.failures, first.retry_at, first.quarantined) == (1, 11.0, False)
    assert not tracker.may_start(KEY, now=10.9, assigned_at=5.0)
    assert tracker.may_start(KEY, now=11.0, assigned_at=5.0)
    second = tracker.failed(KEY, "again", now=11.5, assigned_at=5.0)
    assert (second.failures, second.retry_at) == (2, 13.5)
    third = tracker.failed(KEY, "again", now=14.0, assigned_at=5.0)
    assert third.quarantined and third.failures == 3
    assert not tracker.may_start(KEY, now=1e9, assigned_at=5.0)
    assert tracker.quarantined() == [KEY]
    # Other tasks are not affected.
    assert tracker.may_start(OTHER, now=14.0, assigned_at=5.0)


def test_a_new_assignment_or_a_clear_starts_over() -> None:
    tracker = FailureTracker(FailurePolicy(quarantine_after=1))
    assert tracker.failed(KEY, "x", now=0.0, assigned_at=5.0).quarantined
    assert tracker.may_start(KEY, now=0.0, assigned_at=6.0)  # moved away and back: a new start time
    assert tracker.get(KEY) is None
    assert tracker.failed(KEY, "x", now=1.0, assigned_at=6.0).failures == 1
    tracker.clear(KEY)
    assert tracker.may_start(KEY, now=1.0, assigned_at=6.0)


def test_a_task_that_runs_long_enough_recovers_once() -> None:
    tracker = FailureTracker(FailurePolicy(healthy_after_s=60.0, quarantine_after=5))
    tracker.failed(KEY, "query failed: boom", now=0.0, assigned_at=None)
    tracker.started(KEY, now=1.0)
    assert not tracker.recovered(KEY, now=60.0)
    assert tracker.recovered(KEY, now=61.0)
    assert not tracker.recovered(KEY, now=62.0)  # reported once
    assert tracker.failed(KEY, "query failed: boom", now=63.0, assigned_at=None).failures == 1
    tracker.started(OTHER, now=0.0)
    assert not tracker.recovered(OTHER, now=1000.0)  # nothing to recover from


def test_retain_forgets_tasks_no_longer_assigned() -> None:
    tracker = FailureTracker(FailurePolicy(quarantine_after=1))
    tracker.failed(KEY, "x", now=0.0, assigned_at=None)
    tracker.failed(OTHER, "x", now=0.0, assigned_at=None)
    tracker.retain({OTHER})
    assert tracker.get(KEY) is None and tracker.quarantined() == [OTHER]


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (sqlite3.OperationalError("unable to open database file"), "OperationalError: unable to open database file"),
        (KeyError("task 9"), "KeyError: 'task 9'"),
        (RuntimeError("line one\n  line two"), "RuntimeError: line one line two"),
        (ValueError(), "ValueError: (no message)"),
    ],
)
def test_describe_error_is_one_bounded_line(error: BaseException, expected: str) -> None:
    assert describe_error(error) == expected
    assert len(describe_error(RuntimeError("x" * 5000))) == 1000


FULL_DISK = "query failed: stream_ops.errors.TopicError: could not write x.jsonl: [Errno 28] No space left on device"


def test_a_full_disk_backs_off_briefly_and_is_never_quarantined() -> None:
    tracker = FailureTracker(FailurePolicy(quarantine_after=2, max_backoff_s=60.0, resource_backoff_s=5.0))
    waits = []
    for attempt in range(10):
        failure = tracker.failed(KEY, FULL_DISK, now=attempt * 10.0, assigned_at=None)
        waits.append(failure.retry_at - attempt * 10.0)
        assert not failure.quarantined
    assert waits[:4] == [1.0, 2.0, 4.0, 5.0] and max(waits) == 5.0
    assert tracker.may_start(KEY, now=95.0, assigned_at=None)  # space came back: it starts again by itself
    # Any other failure counts towards the quarantine, from one.
    assert tracker.failed(KEY, "ImportError: no module named 'mypkg'", now=100.0, assigned_at=None).failures == 1
    assert tracker.failed(KEY, "ImportError: no module named 'mypkg'", now=110.0, assigned_at=None).quarantined


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        (FULL_DISK, True),
        ("StateStoreBehindError: IO error: No space left on device: While appending to file", True),
        ("OSError: [Errno 122] Disk quota exceeded", True),
        ("OperationalError: disk I/O error", False),
        ("ImportError: no module named 'mypkg'", False),
    ],
)
def test_resource_exhaustion_is_told_by_the_reason(reason: str, expected: bool) -> None:
    assert is_resource_exhaustion(reason) is expected
