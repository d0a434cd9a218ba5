"""Spreading a crowded topology onto free slots: Storm's even scheduler, sticky and rate-limited.

Storm's nimbus schedules a topology again when it uses fewer workers than it wants
(``Cluster.needsScheduling``); its ``DefaultScheduler`` then frees the slots whose executor
count does not fit the even split and deals their executors over the free slots in
``sort-slots`` order (hosts interleaved). stream_ops does the same but keeps what fits on the
used slots, so the fewest tasks move. These tests pin that rule and its rate limit, pure.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Mapping

import pytest

from stream_ops.config import SpreadPolicy
from stream_ops.errors import ConfigError
from stream_ops.nimbus.monitor import SlotTracker
from stream_ops.scheduler import Slot, assign, decide_spread, moved_tasks, needs_spread, spread

A, B, C, D = Slot("h1", 6700), Slot("h2", 6700), Slot("h3", 6700), Slot("h4", 6700)
SIX = list(range(6))  # the word count with queues=3: 3 source + 3 keyed tasks


def loads(assignment: Mapping[int, Slot]) -> list[int]:
    """Tasks per used slot, largest first."""
    return sorted(Counter(assignment.values()).values(), reverse=True)


def decide(
    assignment: Mapping[int, Slot | str],
    live_for: Mapping[Slot, float],
    workers: int = 3,
    *,
    since: float | None = None,
    tasks: list[int] = SIX,
):
    return decide_spread(tasks, assignment, live_for, workers, since_last_spread=since, interval_s=10.0, stability_s=5.0)


# --- the rule: when -----------------------------------------------------------------------------


def test_a_topology_on_one_slot_that_wants_three_needs_spreading() -> None:
    crowded = dict.fromkeys(SIX, A)
    assert needs_spread(SIX, crowded, [A, B, C], num_workers=3)
    assert needs_spread(SIX, crowded, [A, B], num_workers=3)  # one free slot is enough to start
    assert not needs_spread(SIX, crowded, [A], num_workers=3)  # nothing free: it uses all it can


def test_no_spread_when_it_uses_all_the_slots_it_wants() -> None:
    spread_out = {0: A, 1: B, 2: C, 3: A, 4: B, 5: C}
    assert not needs_spread(SIX, spread_out, [A, B, C, D], num_workers=3)  # D stays free, as in Storm
    assert spread(SIX, [A, B, C, D], 3, spread_out) == spread_out


def test_an_uneven_split_over_enough_slots_is_left_alone_like_storm() -> None:
    # Storm's needsScheduling looks at the number of workers only: 4/2 over the 2 wanted stays.
    uneven = {0: A, 1: A, 2: A, 3: A, 4: B, 5: B}
    assert not needs_spread(SIX, uneven, [A, B, C], num_workers=2)


def test_fewer_tasks_than_workers_wanted_cap_the_spread() -> None:
    crowded = {0: A, 1: A}
    assert needs_spread([0, 1], crowded, [A, B, C], num_workers=5)
    after = spread([0, 1], [A, B, C], 5, crowded)
    assert loads(after) == [1, 1]
    assert not needs_spread([0, 1], after, [A, B, C], num_workers=5)


def test_unplaced_tasks_and_dead_slots_are_the_failover_paths_business() -> None:
    assert not needs_spread(SIX, {t: A for t in SIX[:5]}, [A, B, C], 3)  # task 5 unassigned
    assert not needs_spread(SIX, dict.fromkeys(SIX, D), [A, B, C], 3)  # every task on a dead slot


# --- the rule: how (even split, fewest moves, hosts interleaved) -------------------------------


def test_six_tasks_on_one_slot_spread_two_two_two_moving_four() -> None:
    crowded = dict.fromkeys(SIX, A)
    after = spread(SIX, [A, B, C], 3, crowded)
    assert loads(after) == [2, 2, 2]
    assert moved_tasks(crowded, after) == {2, 3, 4, 5}  # A keeps its lowest two: only the surplus moves
    # Storm deals the freed executors round-robin over the free slots in sort order.
    assert {t: after[t] for t in (2, 3, 4, 5)} == {2: B, 3: C, 4: B, 5: C}


def test_a_third_worker_takes_one_task_from_each_of_the_two_used() -> None:
    halves = {0: A, 1: B, 2: A, 3: B, 4: A, 5: B}
    after = spread(SIX, [A, B, C], 3, halves)
    assert loads(after) == [2, 2, 2]
    moved = moved_tasks(halves, after)
    assert len(moved) == 2
    assert {halves[t] for t in moved} == {A, B}
    assert {after[t] for t in moved} == {C}


def test_free_slots_on_other_hosts_come_first() -> None:
    same_host = Slot("h1", 6701)
    crowded = dict.fromkeys(range(4), A)
    after = spread(range(4), [A, same_host, B], 2, crowded)
    assert set(after.values()) == {A, B}  # Storm's sort-slots interleaves hosts


def test_the_spread_is_the_sticky_even_assignment() -> None:
    crowded = {0: A, 1: A, 2: A, 3: A, 4: B, 5: B}
    assert spread(SIX, [A, B, C], 3, crowded) == assign(SIX, [A, B, C], 3, previous=crowded)


def _fewest_moves(tasks: list[int], slots: list[Slot], workers: int, previous: Mapping[int, Slot]) -> int:
    """Brute force: the fewest moves of any even split over the number of slots Storm would use."""
    used = min(workers, len(slots), len(tasks))
    base, extra = divmod(len(tasks), used)
    best = len(tasks)
    for placement in itertools.product(slots, repeat=len(tasks)):
        counts = sorted(Counter(placement).values(), reverse=True)
        if len(counts) == used and counts == [base + 1] * extra + [base] * (used - extra):
            best = min(best, sum(previous[t] != s for t, s in zip(tasks, placement, strict=True)))
    return best


@pytest.mark.parametrize("seed", range(25))
def test_a_spread_moves_the_fewest_tasks_an_even_split_allows(seed: int) -> None:
    rng = random.Random(seed)
    while True:  # draw until the case needs a spread (a draw that is spread already proves nothing here)
        slots = [A, B, C, D][: rng.randint(2, 4)]
        tasks = list(range(rng.randint(2, 6)))
        crowd = rng.sample(slots, rng.randint(1, len(slots) - 1))
        previous = {t: rng.choice(crowd) for t in tasks}
        workers = rng.randint(len(set(previous.values())) + 1, 5)
        if needs_spread(tasks, previous, slots, workers):
            break
    after = spread(tasks, slots, workers, previous)
    target = min(workers, len(slots), len(tasks))
    assert len(set(after.values())) == target
    assert max(loads(after)) - min(loads(after)) <= 1
    assert len(moved_tasks(previous, after)) == _fewest_moves(tasks, slots, workers, previous)


# --- the rate limit -----------------------------------------------------------------------------


def test_a_new_slot_counts_only_after_the_stability_period() -> None:
    crowded = dict.fromkeys(SIX, A)
    young = decide(crowded, {A: 100.0, B: 2.0})
    assert not young.due and "live only 2.0 s" in young.reason
    stable = decide(crowded, {A: 100.0, B: 5.0})
    assert stable.due and stable.slots == (A, B)


def test_only_stable_slots_are_offered_to_the_spread() -> None:
    crowded = dict.fromkeys(SIX, A)
    decision = decide(crowded, {A: 100.0, B: 30.0, C: 1.0})
    assert decision.due and decision.slots == (A, B)  # C is still too young
    assert loads(spread(SIX, decision.slots, 3, crowded)) == [3, 3]


def test_at_most_one_spread_per_interval() -> None:
    crowded = dict.fromkeys(SIX, A)
    assert decide(crowded, {A: 100.0, B: 30.0}, since=None).due
    too_soon = decide(crowded, {A: 100.0, B: 30.0}, since=3.0)
    assert not too_soon.due and "last spread 3.0 s ago" in too_soon.reason
    assert decide(crowded, {A: 100.0, B: 30.0}, since=10.0).due


def test_an_already_spread_topology_is_not_due() -> None:
    decision = decide({0: A, 1: B, 2: C, 3: A, 4: B, 5: C}, {A: 100.0, B: 100.0, C: 100.0, D: 100.0})
    assert not decision.due and decision.reason.startswith("already spread")


def test_a_slot_that_registers_again_starts_its_stability_over() -> None:
    slots = SlotTracker()
    slots.observe({"h1:6700": 1, "h2:6700": 2}, now=0.0)
    slots.observe({"h1:6700": 1, "h2:6700": 2}, now=10.0)
    assert slots.live_for(10.0) == {"h1:6700": 10.0, "h2:6700": 10.0}
    slots.observe({"h1:6700": 1, "h2:6700": 3}, now=11.0)  # restarted between two polls: new node
    slots.observe({"h1:6700": 1}, now=12.0)  # then gone
    slots.observe({"h1:6700": 1, "h2:6700": 4}, now=13.0)  # and back
    assert slots.live_for(14.0) == {"h1:6700": 14.0, "h2:6700": 1.0}
    assert SlotTracker.restore(slots.export()).live_for(14.0) == slots.live_for(14.0)


def _run_monitor(joins: Mapping[float, dict[str, int]], until: float, tick_s: float = 0.5) -> list[tuple[float, list[int]]]:
    """A pure monitor loop: the live slots change at the times of ``joins``; returns (time, loads) of every spread."""
    assignment: dict[int, Slot] = {}
    slots = SlotTracker()
    last_spread: float | None = None
    live: dict[str, int] = {}
    spreads = []
    for step in range(int(until / tick_s) + 1):
        now = step * tick_s
        live = joins.get(now, live)
        slots.observe(live, now)
        if not assignment:  # submitted with the first worker: everything lands on it
            assignment = dict.fromkeys(SIX, Slot.parse(next(iter(live))))
            continue
        decision = decide(assignment, slots.live_for(now), since=None if last_spread is None else now - last_spread)
        if decision.due:
            assignment = spread(SIX, decision.slots, 3, assignment)
            last_spread = now
            spreads.append((now, loads(assignment)))
    return spreads


def test_workers_joining_one_after_another_are_spread_over_within_the_limits() -> None:
    joins = {0.0: {"h1:6700": 1}, 10.0: {"h1:6700": 1, "h2:6700": 2}, 18.0: {"h1:6700": 1, "h2:6700": 2, "h3:6700": 3}}
    # h2 is stable at 15; h3 at 23, but the last spread (15) allows the next only at 25.
    assert _run_monitor(joins, until=60.0) == [(15.0, [3, 3]), (25.0, [2, 2, 2])]


def test_a_flapping_worker_causes_no_churn() -> None:
    joins: dict[float, dict[str, int]] = {0.0: {"h1:6700": 1}}
    for i, at in enumerate(range(10, 60, 3)):  # h2 re-registers every 3 s, never stable for 5 s
        joins[float(at)] = {"h1:6700": 1, "h2:6700": 100 + i}
    assert _run_monitor(joins, until=60.0) == []


# --- the setting --------------------------------------------------------------------------------


def test_a_topology_conf_overrides_the_policy() -> None:
    policy = SpreadPolicy(interval_s=10.0, stability_s=5.0)
    assert policy.for_conf({}) is policy
    assert policy.for_conf({"spread_interval_s": 30, "spread_stability_s": 1.5}) == SpreadPolicy(interval_s=30.0, stability_s=1.5)
    with pytest.raises(ConfigError, match="spread_interval_s"):
        policy.for_conf({"spread_interval_s": -1})
