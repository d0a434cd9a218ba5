"""The pure scheduler: slot ordering, even placement, stickiness, errors."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from stream_ops.errors import SchedulingError
from stream_ops.scheduler import Slot, assign, moved_tasks, sort_slots


def _slots(hosts: int, ports: int, first_port: int = 6700) -> list[Slot]:
    return [Slot(f"host{h}", first_port + p) for h in range(1, hosts + 1) for p in range(ports)]


def _loads(assignment: dict[int, Slot]) -> Counter[Slot]:
    return Counter(assignment.values())


def _min_moves(previous: dict[int, Slot], tasks: list[int], alive: set[Slot], used: int) -> int:
    """Fewest moves any even split over `used` slots allows (brute-force formula)."""
    keepable = Counter(s for t, s in previous.items() if t in set(tasks) and s in alive)
    counts = sorted(keepable.values(), reverse=True)[:used]
    base, extra = divmod(len(tasks), used)
    kept = sum(min(c, base + (1 if i < extra else 0)) for i, c in enumerate(counts))
    still_there = sum(1 for t in previous if t in set(tasks))
    return still_there - kept


# --- Slot ------------------------------------------------------------------------------


def test_slot_str_parse_and_order() -> None:
    slot = Slot.parse("host1:6700")
    assert slot == Slot("host1", 6700)
    assert str(slot) == "host1:6700"
    assert Slot.parse(str(Slot("::1", 7))) == Slot("::1", 7)
    assert sorted([Slot("b", 1), Slot("a", 2), Slot("a", 1)]) == [Slot("a", 1), Slot("a", 2), Slot("b", 1)]
    with pytest.raises(AttributeError):
        slot.port = 1  # type: ignore[misc]
    for bad in ("host1", ":6700", "host1:", "host1:x", "host1:70000"):
        with pytest.raises(SchedulingError, match="host:port"):
            Slot.parse(bad)


# --- sort_slots ------------------------------------------------------------------------


def test_sort_slots_interleaves_hosts() -> None:
    slots = _slots(2, 2)
    assert [str(s) for s in sort_slots(slots)] == ["host1:6700", "host2:6700", "host1:6701", "host2:6701"]


def test_sort_slots_hosts_with_more_free_slots_first() -> None:
    slots = [Slot("a", 2), Slot("c", 5), Slot("b", 3), Slot("c", 1), Slot("b", 1), Slot("c", 3), Slot("d", 9)]
    assert [str(s) for s in sort_slots(slots)] == ["c:1", "b:1", "a:2", "d:9", "c:3", "b:3", "c:5"]


def test_sort_slots_ignores_input_order_and_duplicates() -> None:
    slots = _slots(3, 4)
    expected = sort_slots(slots)
    rng = random.Random(7)
    for _ in range(20):
        shuffled = slots + rng.sample(slots, 5)
        rng.shuffle(shuffled)
        assert sort_slots(shuffled) == expected
    assert sort_slots([]) == []


# --- fresh placement -------------------------------------------------------------------


def test_seed_example_four_tasks_two_slots() -> None:
    a = assign([1, 2, 3, 4], [Slot("host1", 1), Slot("host2", 1)], num_workers=2)
    assert _loads(a) == {Slot("host1", 1): 2, Slot("host2", 1): 2}
    assert a == {1: Slot("host1", 1), 2: Slot("host2", 1), 3: Slot("host1", 1), 4: Slot("host2", 1)}


def test_seed_example_two_tasks_land_on_different_hosts() -> None:
    a = assign([1, 2], _slots(2, 2), num_workers=4)
    assert {s.host for s in a.values()} == {"host1", "host2"}
    assert len(set(a.values())) == 2


def test_fresh_is_round_robin_over_sorted_slots() -> None:
    slots = _slots(3, 2)
    ordered = sort_slots(slots)
    tasks = [9, 3, 7, 1, 5, 2, 8]
    a = assign(tasks, slots, num_workers=4)
    assert a == {t: ordered[i % 4] for i, t in enumerate(sorted(tasks))}


def test_at_most_num_workers_slots_are_used() -> None:
    slots = _slots(4, 4)
    for workers in (1, 2, 3, 5, 16, 40):
        a = assign(range(100), slots, num_workers=workers)
        assert len(set(a.values())) == min(workers, len(slots))
    assert len(set(assign(range(3), slots, num_workers=10).values())) == 3  # no empty workers


def test_balance_over_many_random_cases() -> None:
    rng = random.Random(20240601)
    for _ in range(400):
        slots = [Slot(f"h{rng.randrange(8)}", rng.randrange(6700, 6710)) for _ in range(rng.randrange(1, 30))]
        tasks = rng.sample(range(1000), rng.randrange(1, 120))
        workers = rng.randrange(1, 20)
        a = assign(tasks, slots, workers)
        assert set(a) == set(tasks)
        loads = _loads(a)
        assert len(loads) == min(workers, len(set(slots)), len(tasks))
        assert max(loads.values()) - min(loads.values()) <= 1
        assert set(loads) <= set(slots)


def test_no_tasks_gives_empty_assignment() -> None:
    assert assign([], [], num_workers=3) == {}
    assert assign([], _slots(1, 1), num_workers=3) == {}


# --- stickiness ------------------------------------------------------------------------


def test_healthy_assignment_is_unchanged() -> None:
    rng = random.Random(11)
    for _ in range(200):
        slots = _slots(rng.randrange(1, 6), rng.randrange(1, 5))
        tasks = list(range(rng.randrange(1, 60)))
        workers = rng.randrange(1, 12)
        first = assign(tasks, slots, workers)
        assert assign(tasks, slots, workers, previous=first) == first
        assert assign(tasks, list(reversed(slots)), workers, previous=first) == first


def test_dead_slot_moves_only_its_tasks() -> None:
    slots = _slots(3, 2)
    tasks = list(range(24))
    before = assign(tasks, slots, num_workers=4)
    dead = before[5]
    alive = [s for s in slots if s != dead]
    after = assign(tasks, alive, num_workers=4, previous=before)
    assert moved_tasks(before, after) == {t for t, s in before.items() if s == dead}
    assert len(set(after.values())) == 4
    assert max(_loads(after).values()) - min(_loads(after).values()) <= 1


def test_dead_slot_without_spare_slots_spreads_its_tasks() -> None:
    slots = _slots(2, 2)
    tasks = list(range(12))
    before = assign(tasks, slots, num_workers=4)
    dead = before[0]
    after = assign(tasks, [s for s in slots if s != dead], num_workers=4, previous=before)
    assert moved_tasks(before, after) == {t for t, s in before.items() if s == dead}
    assert sorted(_loads(after).values()) == [4, 4, 4]


def test_adding_a_slot_moves_the_minimum() -> None:
    slots = _slots(1, 3)
    tasks = list(range(12))
    before = assign(tasks, slots, num_workers=4)  # 3 slots x 4 tasks
    new_slot = Slot("host2", 6700)
    after = assign(tasks, [*slots, new_slot], num_workers=4, previous=before)
    assert len(moved_tasks(before, after)) == 3  # 4,4,4 -> 3,3,3,3
    assert _loads(after)[new_slot] == 3
    assert all(after[t] == new_slot for t in moved_tasks(before, after))


def test_moves_are_minimal_over_many_random_changes() -> None:
    rng = random.Random(99)
    for _ in range(300):
        slots = _slots(rng.randrange(1, 6), rng.randrange(1, 5))
        tasks = list(range(rng.randrange(1, 80)))
        workers = rng.randrange(1, 15)
        before = assign(tasks, slots, workers)
        # Change the world: kill some slots, add some, add/remove tasks, change workers.
        alive = [s for s in slots if rng.random() > 0.25] + [Slot("new", 7000 + i) for i in range(rng.randrange(3))]
        if not alive:
            alive = [Slot("new", 7000)]
        new_tasks = [t for t in tasks if rng.random() > 0.1] + list(range(100, 100 + rng.randrange(5)))
        if not new_tasks:
            continue
        new_workers = max(1, workers + rng.randrange(-2, 3))
        after = assign(new_tasks, alive, new_workers, previous=before)
        used = min(new_workers, len(alive), len(new_tasks))
        loads = _loads(after)
        assert set(after) == set(new_tasks)
        assert len(loads) == used
        assert max(loads.values()) - min(loads.values()) <= 1
        assert len(moved_tasks(before, after)) == _min_moves(before, new_tasks, set(alive), used)


def test_previous_may_use_host_port_strings() -> None:
    slots = _slots(2, 1)
    before = assign(range(4), slots, 2)
    as_text = {t: str(s) for t, s in before.items()}
    assert assign(range(4), slots, 2, previous=as_text) == before
    assert moved_tasks(as_text, before) == set()


def test_deterministic() -> None:
    rng = random.Random(5)
    slots = _slots(5, 3)
    tasks = list(range(50))
    before = assign(tasks, slots, 7)
    alive = slots[3:]
    expected = assign(tasks, alive, 7, previous=before)
    for _ in range(20):
        shuffled_tasks = rng.sample(tasks, len(tasks))
        shuffled_slots = rng.sample(alive, len(alive))
        shuffled_prev = dict(rng.sample(list(before.items()), len(before)))
        assert assign(shuffled_tasks, shuffled_slots, 7, previous=shuffled_prev) == expected


def test_moved_tasks_ignores_new_and_removed_tasks() -> None:
    a, b = Slot("a", 1), Slot("b", 1)
    assert moved_tasks({1: a, 2: a, 3: a}, {1: a, 2: b, 4: b}) == {2}
    assert moved_tasks({}, {1: a}) == set()


# --- errors ----------------------------------------------------------------------------


def test_errors() -> None:
    with pytest.raises(SchedulingError, match="no worker slots"):
        assign([1], [], num_workers=1)
    with pytest.raises(SchedulingError, match="num_workers"):
        assign([1], _slots(1, 1), num_workers=0)
    with pytest.raises(SchedulingError, match=r"duplicate task ids \[2, 3\]"):
        assign([1, 2, 2, 3, 3], _slots(1, 1), num_workers=1)
