"""The nemesis suite (issue 31, "exactly once at the edges, proven under a nemesis").

Real worker processes, really cut off, starved of disk and slowed down, while a word count is
fed continuously; every scenario ends with every count equal to the ground truth computed from
what was fed (DESIGN invariants 1, 2, 3, 5 and 6), or a task stopped with a clear error, never a
lost or doubled update. They share one stack (module scope, :func:`nemesis_helpers.nemesis_stack`):
one embedded ZooKeeper, the nimbus monitor in this process and two workers, ``nemesis`` (reaches
ZooKeeper through a TCP proxy the test can cut, keeps its RocksDB stores on a small tmpfs, has
an fsync-slowing ``LD_PRELOAD`` shim) and ``plain``; the internal topics of both are on another
small tmpfs. Each scenario prints its timeline (``pytest -s``; a failure shows it too).

* :func:`test_a_partitioned_owner_is_fenced_and_counts_stay_exact`: a silent network partition
  between the nemesis worker and ZooKeeper, its connections kept or dropped at the heal
  (invariants 1-2: the zombie's session expires, its commits are refused, the plain worker takes
  over under a higher owner epoch; healed, the zombie commits and publishes nothing that counts);
  :func:`test_a_partition_shorter_than_the_session_pauses_commits_and_moves_nothing`: the same
  cut healed before the session expires (nothing commits while cut, the same owner goes on).
* :func:`test_a_full_disk_stops_tasks_with_a_clear_error_and_nothing_is_lost`: the topics disk
  of every worker full, then the nemesis worker's state-store disk full (invariants 5-6: a
  batch that cannot be staged commits nothing; a committed batch whose store write fails is
  repaired from the state topic or fails the task; the error is in ``/errors`` and the status;
  once space returns the tasks resume exactly).
* :func:`test_slow_fsync_during_commits_and_a_takeover_ends_exact`: every fsync of the nemesis
  worker takes a second while it commits and while it takes over the tasks of the plain
  worker, SIGKILLed meanwhile (invariants 1, 2 and 6). Known gap, recorded in the timeline but
  not asserted: while the disk stays that slow the takeover does not finish, because rocksdict
  holds the GIL through RocksDB's fsyncs (a store open: 5-10 of them), kazoo cannot ping, the
  worker's session expires, it stops its tasks and starts over; it ends exact once the disk is
  fast again.
* The fourth nemesis, **ZooKeeper leader loss in an ensemble during commits**, is
  ``tests/e2e/test_cluster_deployment.py::test_word_count_on_the_cluster_survives_zookeeper_and_spark_worker_crashes``
  (a three-server ensemble whose leader is SIGKILLed while batches commit): part of this suite,
  kept there because it needs the cluster deployment.

``bench/nemesis_soak.py`` runs the same scenarios in a loop with random timing.

Needs root (``mount -t tmpfs``; CI runs as root) and gcc for the shim (``tests/run.sh``
installs it); without gcc only the slow-disk scenario is skipped.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from nemesis_helpers import (
    SESSION_TIMEOUT_S,
    FsyncShim,
    NemesisStack,
    ScenarioResult,
    can_mount_tmpfs,
    nemesis_stack,
    run_disk_full,
    run_partition,
    run_slow_disk,
)

from stream_ops import OpaqueMapState, TransactionalMapState

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NemesisStack]:
    """The module's stack: ZooKeeper, proxy, the two small tmpfs, the shim, two workers."""
    reason = can_mount_tmpfs()
    if reason is not None:
        pytest.skip(reason)
    with nemesis_stack(tmp_path_factory.mktemp("nemesis") / "home", with_shim=FsyncShim.missing_compiler() is None) as started:
        yield started


def _report(result: ScenarioResult) -> None:
    print(result.summary(), flush=True)


@pytest.mark.parametrize("drop_connections", [False, True], ids=["connections-kept", "connections-dropped"])
def test_a_partitioned_owner_is_fenced_and_counts_stay_exact(stack: NemesisStack, drop_connections: bool) -> None:
    result = run_partition(
        stack, name=f"nemesis-partition-{'drop' if drop_connections else 'keep'}", drop_connections=drop_connections
    )
    _report(result)
    assert result.facts["expired"] and result.facts["takeover"]


def test_a_partition_shorter_than_the_session_pauses_commits_and_moves_nothing(stack: NemesisStack) -> None:
    """Cut for 0.4 of the session timeout (less than kazoo's read timeout, 2/3 of it): the session
    survives, nothing commits while cut, the same owner (same epoch) commits again after the
    heal, counts exact."""
    result = run_partition(stack, name="nemesis-brief-partition", state=OpaqueMapState, hold_s=SESSION_TIMEOUT_S * 0.4)
    _report(result)
    assert not result.facts["expired"] and not result.facts["takeover"]


def test_a_full_disk_stops_tasks_with_a_clear_error_and_nothing_is_lost(stack: NemesisStack) -> None:
    result = run_disk_full(stack, name="nemesis-disk-full", state=OpaqueMapState, disks=("topics", "local"))
    _report(result)
    assert {"topics_error_after_s", "local_error_after_s", "topics_resumed_after_s", "local_resumed_after_s"} <= set(result.facts)


@pytest.mark.skipif(FsyncShim.missing_compiler() is not None, reason=str(FsyncShim.missing_compiler()))
def test_slow_fsync_during_commits_and_a_takeover_ends_exact(stack: NemesisStack) -> None:
    result = run_slow_disk(stack, name="nemesis-slow-disk", state=TransactionalMapState, delay_ms=1000)
    _report(result)
    assert "takeover_after_kill_s" in result.facts
