"""Monitor.tick against a real ZooKeeper with fake workers (no Spark).

Worker loss is seen through the ephemeral ``/workers`` node; heartbeat staleness is judged
by the monitor's clock, here a hand-moved fake clock, so no test sleeps to age a heartbeat.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from stream_ops.config import SpreadPolicy
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import HeartbeatRecord
from stream_ops.coordination.store import ZkStore
from stream_ops.nimbus.assignment import read_assignment, reassign, spread_topology
from stream_ops.nimbus.monitor import REASON_HEARTBEAT_MISSING, REASON_WORKER_GONE, Monitor
from stream_ops.nimbus.submission import activate, deactivate, kill

ALL_TASKS = [0, 1, 2, 3]


def assignment(store: ZkStore, topology_id: str) -> tuple[dict[int, str], int]:
    found = read_assignment(store, topology_id)
    assert found is not None
    return dict(found[0].tasks), found[1]


def test_worker_death_moves_only_its_tasks_and_raises_the_epoch(
    zk_store: ZkStore, fake_worker: Callable[[int], Any], submit_wordcount: Callable[..., str]
) -> None:
    w1, w2 = fake_worker(7001), fake_worker(7002)
    topology_id = submit_wordcount(workers=2)
    before, epoch = assignment(zk_store, topology_id)
    assert sorted(before) == ALL_TASKS
    assert set(before.values()) == {w1.worker_id, w2.worker_id}
    w1.beat(topology_id)
    w2.beat(topology_id)
    monitor = Monitor(zk_store, task_timeout_s=1.0, launch_grace_s=30.0)
    assert monitor.tick() == []

    lost = w1.assigned(topology_id)
    kept = w2.assigned(topology_id)
    assert len(lost) == 2
    w1.die(zk_store)

    actions = monitor.tick()
    assert len(actions) == 1
    action = actions[0]
    assert action.topology_id == topology_id
    assert action.dead == dict.fromkeys(lost, REASON_WORKER_GONE)
    assert action.moved == {t: (w1.worker_id, w2.worker_id) for t in lost}
    assert action.excluded_slots == ()
    after, new_epoch = assignment(zk_store, topology_id)
    assert new_epoch == action.epoch > epoch
    assert after == dict.fromkeys(ALL_TASKS, w2.worker_id)
    assert all(before[t] == after[t] for t in kept)

    # Moved tasks are in their launch grace: nothing more to do.
    assert monitor.tick() == []
    assert assignment(zk_store, topology_id)[1] == new_epoch


def test_tasks_submitted_before_any_worker_are_assigned_when_one_joins(
    zk_store: ZkStore, fake_worker: Callable[[int], Any], submit_wordcount: Callable[..., str]
) -> None:
    topology_id = submit_wordcount(workers=2)
    assert assignment(zk_store, topology_id)[0] == {}
    monitor = Monitor(zk_store, task_timeout_s=1.0, launch_grace_s=30.0)
    assert monitor.tick() == []  # no worker yet: nothing to do, nothing written
    epoch = assignment(zk_store, topology_id)[1]
    assert monitor.tick() == []
    assert assignment(zk_store, topology_id)[1] == epoch

    w1 = fake_worker(7001)
    [action] = monitor.tick()
    assert action.unassigned == tuple(ALL_TASKS)
    assert action.dead == {}
    assert action.moved == {t: (None, w1.worker_id) for t in ALL_TASKS}
    assert action.epoch == epoch + 1
    assert assignment(zk_store, topology_id) == (dict.fromkeys(ALL_TASKS, w1.worker_id), epoch + 1)


def test_stale_heartbeats_after_grace_move_the_whole_slot_elsewhere(
    zk_store: ZkStore, fake_worker: Callable[[int], Any], submit_wordcount: Callable[..., str], fake_clock: Any
) -> None:
    w1, w2, w3 = fake_worker(7001), fake_worker(7002), fake_worker(7003)
    topology_id = submit_wordcount(workers=2)
    before, epoch = assignment(zk_store, topology_id)
    assert set(before.values()) == {w1.worker_id, w2.worker_id}  # 7003 is spare
    stale = sorted(t for t, w in before.items() if w == w2.worker_id)
    monitor = Monitor(zk_store, task_timeout_s=1.0, launch_grace_s=0.5, clock=fake_clock)
    w1.beat(topology_id)
    w2.beat(topology_id)
    assert monitor.tick() == []  # t=0: both heartbeats seen
    # w1 keeps beating; w2's heartbeat nodes stay but are never rewritten (its tasks hang).
    for _ in range(2):  # t=0.5, t=1.0: w2's beat is not older than 1 s yet
        fake_clock.advance(0.5)
        w1.beat(topology_id)
        assert monitor.tick() == []
    fake_clock.advance(0.5)  # t=1.5
    w1.beat(topology_id)
    [action] = monitor.tick()
    assert action.dead == dict.fromkeys(stale, "heartbeat stale 1.5 s")
    assert action.excluded_slots == (w2.worker_id,)
    after, new_epoch = assignment(zk_store, topology_id)
    assert new_epoch == action.epoch > epoch
    # w1 keeps its tasks; the bad slot's tasks go to the spare slot, not back to w2.
    assert action.moved == {t: (w2.worker_id, w3.worker_id) for t in stale}
    assert after == {t: (w3.worker_id if t in stale else w) for t, w in before.items()}


def test_stale_heartbeat_within_grace_is_not_death(
    zk_store: ZkStore, fake_worker: Callable[[int], Any], submit_wordcount: Callable[..., str], fake_clock: Any
) -> None:
    w1, w2 = fake_worker(7001), fake_worker(7002)
    topology_id = submit_wordcount(workers=2)
    before, epoch = assignment(zk_store, topology_id)
    monitor = Monitor(zk_store, task_timeout_s=1.0, launch_grace_s=2.0, clock=fake_clock)
    # w2 never beats (still starting its tasks): alive until its grace ends.
    for _ in range(4):  # t = 0, 0.5, 1.0, 1.5
        w1.beat(topology_id)
        assert monitor.tick() == []
        fake_clock.advance(0.5)
    w1.beat(topology_id)
    assert monitor.tick() == []  # t = 2.0: exactly at the end of the grace, still alive
    assert assignment(zk_store, topology_id)[1] == epoch
    fake_clock.advance(0.1)
    w1.beat(topology_id)
    [action] = monitor.tick()
    missing = sorted(t for t, w in before.items() if w == w2.worker_id)
    assert action.dead == dict.fromkeys(missing, REASON_HEARTBEAT_MISSING)
    assert action.excluded_slots == (w2.worker_id,)
    assert assignment(zk_store, topology_id)[0] == dict.fromkeys(ALL_TASKS, w1.worker_id)


def test_dead_tasks_on_every_slot_leave_the_assignment_alone(
    zk_store: ZkStore, fake_worker: Callable[[int], Any], submit_wordcount: Callable[..., str], fake_clock: Any
) -> None:
    fake_worker(7001)
    fake_worker(7002)
    topology_id = submit_wordcount(workers=2)
    before = assignment(zk_store, topology_id)
    monitor = Monitor(zk_store, task_timeout_s=1.0, launch_grace_s=0.5, clock=fake_clock)
    assert monitor.tick() == []
    fake_clock.advance(2.0)
    # Every slot has dead tasks: none can be excluded and the even split is unchanged.
    assert monitor.tick() == []
    assert monitor.tick() == []
    assert assignment(zk_store, topology_id) == before


def test_heartbeat_of_another_worker_does_not_count(
    zk_store: ZkStore, fake_worker: Callable[[int], Any], submit_wordcount: Callable[..., str], fake_clock: Any
) -> None:
    w1, w2, w3 = fake_worker(7001), fake_worker(7002), fake_worker(7003)
    topology_id = submit_wordcount(workers=2)
    before, _ = assignment(zk_store, topology_id)
    task, *others = sorted(t for t, w in before.items() if w == w2.worker_id)
    monitor = Monitor(zk_store, task_timeout_s=1.0, launch_grace_s=0.5, clock=fake_clock)
    actions: list[Any] = []
    for _ in range(3):  # t = 0, 0.5, 1.0
        w1.beat(topology_id)
        w2.beat(topology_id, others)
        w3.beat(topology_id, [task])  # e.g. a previous owner still beating: not w2's beat
        actions = monitor.tick()
        assert actions == []
        fake_clock.advance(0.5)
    w1.beat(topology_id)
    w2.beat(topology_id, others)
    w3.beat(topology_id, [task])
    [action] = monitor.tick()  # t = 1.5
    assert action.dead == {task: REASON_HEARTBEAT_MISSING}
    assert action.excluded_slots == (w2.worker_id,)
    found = zk_store.get_json(ZkPaths.heartbeat(topology_id, task))
    assert found is not None and HeartbeatRecord.model_validate(found[0]).worker_id == w3.worker_id


def test_inactive_topologies_are_left_alone_and_get_a_fresh_grace_when_resumed(
    zk_store: ZkStore, fake_worker: Callable[[int], Any], submit_wordcount: Callable[..., str], fake_clock: Any
) -> None:
    w1, w2 = fake_worker(7001), fake_worker(7002)
    topology_id = submit_wordcount(workers=2)
    monitor = Monitor(zk_store, task_timeout_s=1.0, launch_grace_s=0.5, clock=fake_clock)
    assert monitor.tick() == []
    deactivate(zk_store, topology_id)
    w1.die(zk_store)
    fake_clock.advance(5.0)
    assert monitor.tick() == []  # INACTIVE: workers run nothing, the monitor does nothing
    activate(zk_store, topology_id)
    w2.beat(topology_id)
    [action] = monitor.tick()  # the dead worker is seen at once...
    assert set(action.dead.values()) == {REASON_WORKER_GONE}
    # ...but w2's tasks, not beaten for 5 s while INACTIVE, got a fresh grace.
    assert set(action.moved) == set(action.dead)
    fake_clock.advance(0.3)
    assert monitor.tick() == []


def test_killed_topology_is_forgotten(
    zk_store: ZkStore, fake_worker: Callable[[int], Any], submit_wordcount: Callable[..., str]
) -> None:
    fake_worker(7001)
    topology_id = submit_wordcount(workers=1)
    monitor = Monitor(zk_store, task_timeout_s=1.0, launch_grace_s=30.0)
    assert monitor.tick() == []
    assert topology_id in monitor.tracker.topologies()
    kill(zk_store, topology_id)
    assert monitor.tick() == []
    assert topology_id not in monitor.tracker.topologies()


def test_reassign_excludes_slots_unless_none_would_be_left(
    zk_store: ZkStore, fake_worker: Callable[[int], Any], submit_wordcount: Callable[..., str]
) -> None:
    w1, w2 = fake_worker(7001), fake_worker(7002)
    topology_id = submit_wordcount(workers=2)
    before, epoch = assignment(zk_store, topology_id)
    record, new_epoch = reassign(zk_store, topology_id, exclude_slots=[w1.worker_id])
    assert set(record.tasks.values()) == {w2.worker_id}
    assert new_epoch == epoch + 1
    # Excluding every live slot is the same as excluding none: the even split comes back,
    # moving only two tasks back to w1.
    record2, epoch2 = reassign(zk_store, topology_id, exclude_slots=[w1.worker_id, w2.worker_id])
    assert epoch2 == new_epoch + 1
    assert sorted(record2.tasks.values()).count(w1.worker_id) == 2
    assert sum(record2.tasks[t] != record.tasks[t] for t in ALL_TASKS) == 2
    # Start times are kept for tasks that stayed.
    assert all(record2.start_times[t] == record.start_times[t] for t in ALL_TASKS if record2.tasks[t] == record.tasks[t])
    assert before != record.tasks


def test_a_worker_missing_from_a_stale_worker_list_is_not_declared_gone(
    zk_store: ZkStore, fake_worker: Callable[[int], Any], submit_wordcount: Callable[..., str]
) -> None:
    """The worker list is read before the assignment: a worker that joined (and got tasks)
    in between must be looked up again, not reported dead."""
    w1, w2 = fake_worker(7001), fake_worker(7002)
    topology_id = submit_wordcount(workers=2)
    monitor = Monitor(zk_store, task_timeout_s=1.0, launch_grace_s=30.0)
    real = monitor._live_slots
    calls: list[int] = []

    def stale_first() -> set[str]:
        calls.append(1)
        return {w1.worker_id} if len(calls) == 1 else real()

    monitor._live_slots = stale_first  # type: ignore[method-assign]
    assert monitor.tick() == []
    assert len(calls) == 2
    assert w2.assigned(topology_id)


def test_monitor_rejects_bad_settings(zk_store: ZkStore) -> None:
    with pytest.raises(ValueError):
        Monitor(zk_store, task_timeout_s=0)
    with pytest.raises(ValueError):
        Monitor(zk_store, launch_grace_s=-1)


# --- one liveness rule: the worker's clock does not matter ------------------------------------------


@pytest.mark.parametrize("skew_s", [60.0, -60.0])
def test_a_skewed_worker_clock_changes_nothing_for_the_monitor(
    zk_store: ZkStore, fake_worker: Callable[[int], Any], submit_wordcount: Callable[..., str], fake_clock: Any, skew_s: float
) -> None:
    w1, w2 = fake_worker(7001), fake_worker(7002)
    topology_id = submit_wordcount(workers=2)
    skewed = w2.assigned(topology_id)
    monitor = Monitor(zk_store, task_timeout_s=1.0, launch_grace_s=0.5, clock=fake_clock)
    for _ in range(6):  # 3 s of beats, far past the grace: alive although its stamps are 60 s off
        w1.beat(topology_id)
        w2.beat(topology_id, skew_s=skew_s)
        assert monitor.tick() == []
        fake_clock.advance(0.5)
    for _ in range(2):  # w2 hangs; within the timeout it is still alive
        w1.beat(topology_id)
        assert monitor.tick() == []
        fake_clock.advance(0.5)
    w1.beat(topology_id)
    [action] = monitor.tick()
    assert set(action.dead) == set(skewed)
    assert all(reason.startswith("heartbeat stale") for reason in action.dead.values())


# --- spreading onto workers that join later ---------------------------------------------------------


def test_a_crowded_topology_is_spread_as_workers_join_within_the_rate_limit(
    zk_store: ZkStore, fake_worker: Callable[[int], Any], submit_wordcount: Callable[..., str], fake_clock: Any
) -> None:
    w1 = fake_worker(7001)
    topology_id = submit_wordcount(workers=3)
    before, epoch = assignment(zk_store, topology_id)
    assert before == dict.fromkeys(ALL_TASKS, w1.worker_id)
    monitor = Monitor(
        zk_store, task_timeout_s=1.0, launch_grace_s=60.0, clock=fake_clock, spread=SpreadPolicy(interval_s=10, stability_s=5)
    )
    assert monitor.tick() == []  # t=0: one worker, it uses all it can
    w2 = fake_worker(7002)
    assert monitor.tick() == []  # t=0: w2 just seen
    fake_clock.advance(4.9)
    assert monitor.tick() == []  # t=4.9: not stable yet
    fake_clock.advance(0.1)
    [action] = monitor.tick()  # t=5: spread
    assert action.spread and action.dead == {} and action.unassigned == ()
    assert action.epoch == epoch + 1
    assert len(action.moved) == 2 and {to for _, to in action.moved.values()} == {w2.worker_id}
    halves, _ = assignment(zk_store, topology_id)
    assert sorted(Counter(halves.values()).values()) == [2, 2]

    fake_clock.advance(1.0)
    w3 = fake_worker(7003)
    assert monitor.tick() == []  # t=6: w3 seen
    fake_clock.advance(5.0)
    assert monitor.tick() == []  # t=11: w3 stable, but the last spread was at t=5
    fake_clock.advance(3.9)
    assert monitor.tick() == []  # t=14.9
    fake_clock.advance(0.1)
    [action] = monitor.tick()  # t=15
    assert action.spread and len(action.moved) == 1  # 4 tasks over 3: 2/1/1, one task moves
    assert {to for _, to in action.moved.values()} == {w3.worker_id}
    after, _ = assignment(zk_store, topology_id)
    assert sorted(Counter(after.values()).values()) == [1, 1, 2]
    assert sum(after[t] != halves[t] for t in ALL_TASKS) == 1
    fake_clock.advance(30.0)
    assert monitor.tick() == []  # spread as wanted: nothing more


def test_a_flapping_worker_gets_no_tasks_until_it_stays(
    zk_store: ZkStore, fake_worker: Callable[[int], Any], submit_wordcount: Callable[..., str], fake_clock: Any
) -> None:
    w1 = fake_worker(7001)
    topology_id = submit_wordcount(workers=2)
    monitor = Monitor(
        zk_store, task_timeout_s=1.0, launch_grace_s=60.0, clock=fake_clock, spread=SpreadPolicy(interval_s=0, stability_s=5)
    )
    flapper = fake_worker(7002)
    assert monitor.tick() == []  # t=0
    fake_clock.advance(3.0)
    flapper.die(zk_store)
    flapper = fake_worker(7002)  # back between two ticks: a new registration
    assert monitor.tick() == []  # t=3
    fake_clock.advance(4.0)
    assert monitor.tick() == []  # t=7: 7 s since it first came, but only 4 s since it came back
    assert set(assignment(zk_store, topology_id)[0].values()) == {w1.worker_id}
    fake_clock.advance(1.0)
    [action] = monitor.tick()  # t=8: 5 s without a break
    assert action.spread and {to for _, to in action.moved.values()} == {flapper.worker_id}


def test_spread_topology_refuses_what_the_rule_does_not_allow(
    zk_store: ZkStore, fake_worker: Callable[[int], Any], submit_wordcount: Callable[..., str]
) -> None:
    w1 = fake_worker(7001)
    topology_id = submit_wordcount(workers=2)
    w2 = fake_worker(7002)
    before = assignment(zk_store, topology_id)
    assert spread_topology(zk_store, topology_id, slots=[]) is None  # no free slot offered
    deactivate(zk_store, topology_id)
    assert spread_topology(zk_store, topology_id, slots=[w2.worker_id]) is None  # only ACTIVE topologies
    activate(zk_store, topology_id)
    record, epoch = spread_topology(zk_store, topology_id, slots=[w2.worker_id, "127.0.0.1:7999"])  # type: ignore[misc]
    assert epoch == before[1] + 1
    assert sorted(Counter(record.tasks.values()).items()) == [(w1.worker_id, 2), (w2.worker_id, 2)]
    assert spread_topology(zk_store, topology_id, slots=[w2.worker_id]) is None  # already spread
