"""Standby placement (Kafka Streams' num.standby.replicas) and failover onto a standby."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from stream_ops.coordination.records import AssignmentRecord, StormRecord
from stream_ops.errors import SchedulingError
from stream_ops.nimbus.assignment import standbys_stale
from stream_ops.scheduler import Slot, assign, moved_tasks, place_standbys


def _slots(hosts: int, ports: int) -> list[Slot]:
    return [Slot(f"h{h}", 6700 + p) for h in range(1, hosts + 1) for p in range(ports)]


def test_a_standby_is_never_on_the_owner_and_prefers_other_hosts():
    slots = _slots(2, 2)  # h1:6700 h1:6701 h2:6700 h2:6701
    owners = assign(range(8), slots, 4)
    standbys = place_standbys(range(8), owners, slots, 1)
    for task, (standby,) in standbys.items():
        assert standby != owners[task]
        assert standby.host != owners[task].host  # another host exists, so it is used


def test_standbys_are_balanced_and_distinct_per_task():
    slots = _slots(3, 2)
    owners = assign(range(12), slots, 6)
    standbys = place_standbys(range(12), owners, slots, 2)
    load = Counter(s for sb in standbys.values() for s in sb)
    assert max(load.values()) - min(load.values()) <= 1  # 24 standbys over 6 slots: 4 each
    for task, sb in standbys.items():
        assert len(sb) == 2 and len(set(sb)) == 2 and owners[task] not in sb
        assert len({owners[task].host, *(s.host for s in sb)}) == 3  # three hosts: one copy each


def test_same_host_standbys_only_when_no_other_host_is_live():
    slots = _slots(1, 3)
    owners = {0: slots[0], 1: slots[1]}
    standbys = place_standbys([0, 1], owners, slots, 1)
    assert all(sb[0] != owners[t] for t, sb in standbys.items())


def test_fewer_slots_than_replicas_gives_what_there_is():
    slots = _slots(1, 2)
    standbys = place_standbys([0], {0: slots[0]}, slots, 3)
    assert standbys == {0: [slots[1]]}
    assert place_standbys([0], {0: slots[0]}, [slots[0]], 1) == {0: []}


def test_placement_is_sticky_and_refills_a_dead_standby():
    slots = _slots(3, 1)
    owners = {0: slots[0], 1: slots[1]}
    first = place_standbys([0, 1], owners, slots, 1)
    assert place_standbys([0, 1], owners, slots, 1, previous=first) == first
    # a standby on a slot that died is replaced; the other stays where it is
    dead = first[0][0]
    alive = [s for s in slots if s != dead]
    again = place_standbys([0, 1], owners, alive, 1, previous=first)
    assert again[0] != [dead] and again[0][0] != owners[0]
    if first[1][0] != dead:
        assert again[1] == first[1]


def test_negative_replicas_are_refused():
    with pytest.raises(SchedulingError, match="standby replicas"):
        place_standbys([0], {0: Slot("h", 1)}, [Slot("h", 1)], -1)


def test_a_task_that_must_move_goes_to_its_standby_when_the_split_allows():
    slots = _slots(3, 1)
    owners = assign(range(6), slots, 3)
    standbys = place_standbys(range(6), owners, slots, 1)
    dead = slots[0]
    alive = [s for s in slots if s != dead]
    moved_plain = assign(range(6), alive, 3, previous=owners)
    moved_pref = assign(range(6), alive, 3, previous=owners, preferred=standbys)
    assert len(moved_tasks(owners, moved_pref)) == len(moved_tasks(owners, moved_plain))  # no extra moves
    assert sorted(Counter(moved_pref.values()).values()) == [3, 3]  # still even
    for task in moved_tasks(owners, moved_pref):
        assert moved_pref[task] == standbys[task][0]  # each lands on its warm standby


def test_preference_never_breaks_the_even_split_randomized():
    rng = random.Random(3)
    for _ in range(200):
        slots = _slots(rng.randint(1, 4), rng.randint(1, 3))
        tasks = list(range(rng.randint(1, 20)))
        workers = rng.randint(1, len(slots))
        owners = assign(tasks, slots, workers)
        standbys = place_standbys(tasks, owners, slots, rng.randint(0, 2))
        alive = [s for s in slots if rng.random() > 0.3] or slots[:1]
        with_pref = assign(tasks, alive, workers, previous=owners, preferred=standbys)
        without = assign(tasks, alive, workers, previous=owners)
        assert sorted(Counter(with_pref.values()).values()) == sorted(Counter(without.values()).values())
        assert len(moved_tasks(owners, with_pref)) == len(moved_tasks(owners, without))


def _storm(replicas: int) -> StormRecord:
    return StormRecord(
        topology_id="t-1-1",
        name="t",
        status="ACTIVE",
        workers=2,
        dist_dir="/d",
        submitted_at=0.0,
        num_tasks=2,
        code_sha256="c" * 64,
        submission_sha256="d" * 64,
        standby_replicas=replicas,
        stateful_tasks=[0, 1],
    )


def test_standbys_are_stale_when_their_worker_died_or_a_slot_joined():
    record = AssignmentRecord(tasks={0: "h1:1", 1: "h2:1"}, standbys={0: ["h2:1"], 1: ["h1:1"]})
    assert not standbys_stale(_storm(1), record, {"h1:1", "h2:1"})
    assert standbys_stale(_storm(1), record, {"h1:1", "h2:1", "h3:1"}) is False  # sticky: nothing missing
    lone = AssignmentRecord(tasks={0: "h1:1", 1: "h1:1"}, standbys={})
    assert standbys_stale(_storm(1), lone, {"h1:1", "h2:1"})  # a slot joined where standbys are missing
    assert not standbys_stale(_storm(0), lone, {"h1:1", "h2:1"})


def test_with_an_idle_slot_standbys_go_there_and_a_failover_lands_on_them():
    """Three slots, a topology wanting two: the idle slot is where a dead slot's tasks go, so
    that is where the standbys are kept."""
    slots = _slots(1, 3)
    owners = assign(range(4), slots, 2)
    idle = next(s for s in slots if s not in owners.values())
    standbys = place_standbys([2, 3], owners, slots, 1)
    assert standbys == {2: [idle], 3: [idle]}
    for dead in set(owners.values()):
        alive = [s for s in slots if s != dead]
        after = assign(range(4), alive, 2, previous=owners, preferred=standbys)
        for task in (2, 3):
            if owners[task] == dead:
                assert after[task] == idle


def test_homeless_tasks_pick_the_fresh_slot_holding_their_standbys():
    slots = _slots(1, 4)  # two idle slots; the standbys are on the second of them
    owners = {0: slots[0], 1: slots[1]}
    standbys = {0: [slots[3]], 1: [slots[3]]}
    after = assign([0, 1], [slots[1], slots[2], slots[3]], 2, previous=owners, preferred=standbys)
    assert after[0] == slots[3]
