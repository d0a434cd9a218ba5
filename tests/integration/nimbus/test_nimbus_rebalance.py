"""rebalance(): REBALANCING during the wait, an even spread moving the fewest tasks, status back."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from stream_ops.coordination.store import ZkStore
from stream_ops.errors import SchedulingError, TopologyNotFoundError
from stream_ops.nimbus.assignment import read_assignment
from stream_ops.nimbus.monitor import Monitor
from stream_ops.nimbus.rebalance import rebalance
from stream_ops.nimbus.submission import deactivate, kill, read_storm


def assignment(store: ZkStore, topology_id: str) -> tuple[dict[int, str], int]:
    found = read_assignment(store, topology_id)
    assert found is not None
    return dict(found[0].tasks), found[1]


def test_rebalance_to_three_workers_after_a_third_joins_moves_one_task(
    zk_store: ZkStore, fake_worker: Callable[[int], Any], submit_wordcount: Callable[..., str]
) -> None:
    w1, w2 = fake_worker(7001), fake_worker(7002)
    topology_id = submit_wordcount(workers=2)
    before, epoch = assignment(zk_store, topology_id)
    assert sorted(Counter(before.values()).values()) == [2, 2]
    w3 = fake_worker(7003)

    statuses: list[str] = []
    record, new_epoch = rebalance(
        zk_store, "wordcount", workers=3, wait_s=2.0, sleep=lambda s: statuses.append(read_storm(zk_store, topology_id).status)
    )
    assert statuses == ["REBALANCING"]
    assert new_epoch == epoch + 1
    assert assignment(zk_store, topology_id) == (dict(record.tasks), new_epoch)
    counts = Counter(record.tasks.values())
    assert set(counts) == {w1.worker_id, w2.worker_id, w3.worker_id}
    assert sorted(counts.values()) == [1, 1, 2]
    moved = [t for t in before if before[t] != record.tasks[t]]
    assert len(moved) == 1  # the minimum: 2+2 -> 2+1+1
    assert record.tasks[moved[0]] == w3.worker_id
    storm = read_storm(zk_store, topology_id)
    assert (storm.status, storm.workers) == ("ACTIVE", 3)


def test_rebalancing_status_is_visible_during_a_real_wait_and_the_monitor_keeps_off(
    zk_store: ZkStore,
    fake_worker: Callable[[int], Any],
    submit_wordcount: Callable[..., str],
    poll: Callable[..., None],
) -> None:
    w1, w2 = fake_worker(7001), fake_worker(7002)
    topology_id = submit_wordcount(workers=2)
    _, epoch = assignment(zk_store, topology_id)
    monitor = Monitor(zk_store, task_timeout_s=1.0, launch_grace_s=30.0)
    assert monitor.tick() == []
    go = threading.Event()
    result: list[tuple[Any, int]] = []

    def gated_sleep(seconds: float) -> None:
        assert seconds == 1.5
        assert go.wait(10.0), "test did not release the wait"

    thread = threading.Thread(
        target=lambda: result.append(rebalance(zk_store, topology_id, wait_s=1.5, sleep=gated_sleep)), daemon=True
    )
    thread.start()
    poll(lambda: read_storm(zk_store, topology_id).status == "REBALANCING")
    w1.die(zk_store)
    assert monitor.tick() == []  # not ACTIVE: the monitor leaves it to the rebalance
    assert assignment(zk_store, topology_id)[1] == epoch
    go.set()
    thread.join(10.0)
    assert not thread.is_alive()
    [(record, new_epoch)] = result
    assert set(record.tasks.values()) == {w2.worker_id}
    assert new_epoch == epoch + 1
    assert read_storm(zk_store, topology_id).status == "ACTIVE"


def test_rebalance_of_a_balanced_topology_moves_nothing(
    zk_store: ZkStore, fake_worker: Callable[[int], Any], submit_wordcount: Callable[..., str]
) -> None:
    fake_worker(7001)
    fake_worker(7002)
    topology_id = submit_wordcount(workers=2)
    before = assignment(zk_store, topology_id)
    record, epoch = rebalance(zk_store, topology_id, sleep=lambda s: pytest.fail("no wait was asked for"))
    assert (dict(record.tasks), epoch) == before
    assert read_storm(zk_store, topology_id).status == "ACTIVE"


def test_rebalance_to_fewer_workers_empties_one_slot(
    zk_store: ZkStore, fake_worker: Callable[[int], Any], submit_wordcount: Callable[..., str]
) -> None:
    fake_worker(7001), fake_worker(7002)
    topology_id = submit_wordcount(workers=2)
    before, _ = assignment(zk_store, topology_id)
    record, _ = rebalance(zk_store, topology_id, workers=1)
    assert len(set(record.tasks.values())) == 1
    assert sum(before[t] != record.tasks[t] for t in before) == 2
    assert read_storm(zk_store, topology_id).workers == 1


def test_rebalance_of_an_inactive_topology_leaves_it_inactive(
    zk_store: ZkStore, fake_worker: Callable[[int], Any], submit_wordcount: Callable[..., str]
) -> None:
    fake_worker(7001)
    topology_id = submit_wordcount(workers=2)
    deactivate(zk_store, topology_id)
    fake_worker(7002)
    record, _ = rebalance(zk_store, topology_id)
    assert len(set(record.tasks.values())) == 2
    assert read_storm(zk_store, topology_id).status == "INACTIVE"


def test_a_topology_killed_during_the_wait_stays_killed(
    zk_store: ZkStore, fake_worker: Callable[[int], Any], submit_wordcount: Callable[..., str]
) -> None:
    fake_worker(7001)
    topology_id = submit_wordcount(workers=1)

    def kill_meanwhile(seconds: float) -> None:
        kill(zk_store, topology_id)

    with pytest.raises(TopologyNotFoundError):
        rebalance(zk_store, topology_id, wait_s=1.0, sleep=kill_meanwhile)
    assert zk_store.get_json(f"/storms/{topology_id}") is None


def test_rebalance_rejects_bad_arguments(zk_store: ZkStore, submit_wordcount: Callable[..., str]) -> None:
    submit_wordcount(workers=1)
    with pytest.raises(SchedulingError):
        rebalance(zk_store, "wordcount", workers=0)
    with pytest.raises(SchedulingError):
        rebalance(zk_store, "wordcount", wait_s=-1)
    with pytest.raises(TopologyNotFoundError):
        rebalance(zk_store, "no-such-topology")
