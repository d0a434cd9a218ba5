"""Task placement: Storm's default (even) scheduler, made sticky. Pure: no I/O, no clock.

A *slot* is a worker port on a host (Storm's ``host:port``). :func:`assign` spreads the
tasks of one topology over at most ``num_workers`` slots so that

* the used slots differ by at most one task (an even split),
* hosts interleave: slots are taken in :func:`sort_slots` order, which alternates hosts,
* a fresh placement deals the sorted tasks round-robin over the sorted slots, exactly like
  Storm's ``DefaultScheduler``/``EvenScheduler``.

How it differs from Storm: Storm keeps the assignment of a topology whose slots are all
alive, but when a slot dies or ``storm rebalance`` runs it frees *all* the topology's slots
and places every task from scratch, so most tasks move (and, here, each move means a RocksDB
state replay). :func:`assign` instead takes the ``previous`` assignment and moves the fewest
tasks that still leave an even split: healthy placements stay, only the tasks of dead slots,
new tasks and the surplus of over-full slots move. A healthy assignment is returned unchanged.

Example:
    >>> slots = [Slot("h1", 6700), Slot("h1", 6701), Slot("h2", 6700)]
    >>> [str(s) for s in sort_slots(slots)]
    ['h1:6700', 'h2:6700', 'h1:6701']
    >>> a = assign(range(4), slots, num_workers=2)
    >>> {t: str(s) for t, s in sorted(a.items())}
    {0: 'h1:6700', 1: 'h2:6700', 2: 'h1:6700', 3: 'h2:6700'}
    >>> b = assign(range(4), [Slot("h1", 6700), Slot("h1", 6701)], 2, previous=a)
    >>> sorted(moved_tasks(a, b))  # only the tasks of the dead h2:6700 move
    [1, 3]

Spreading (Storm's ``Cluster.needsScheduling`` + ``DefaultScheduler``): a topology whose tasks
all sit on live slots is scheduled again only when it uses fewer slots than it could
(:func:`needs_spread`: fewer than ``min(num_workers, live slots, tasks)``), e.g. because it was
submitted while one worker was up and more joined later. Storm then frees the slots whose task
count does not fit the even split and re-deals their executors; :func:`spread` does the same
stickily (the over-full slots keep what fits, only their surplus moves), and
:func:`decide_spread` adds the rate limit the callers need so a flapping worker causes no
churn: a new slot counts only after a stability period, and a topology is spread at most once
per interval.

    >>> crowded = {t: Slot("h1", 6700) for t in range(6)}
    >>> three = [Slot("h1", 6700), Slot("h2", 6700), Slot("h3", 6700)]
    >>> needs_spread(range(6), crowded, three, num_workers=3)
    True
    >>> spread_out = spread(range(6), three, 3, crowded)
    >>> sorted(Counter(str(s) for s in spread_out.values()).values()), len(moved_tasks(crowded, spread_out))
    ([2, 2, 2], 4)
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from stream_ops.errors import SchedulingError

__all__ = [
    "Slot",
    "SpreadDecision",
    "assign",
    "decide_spread",
    "moved_tasks",
    "needs_spread",
    "place_standbys",
    "sort_slots",
    "spread",
]


@dataclass(frozen=True, order=True, slots=True)
class Slot:
    """A worker slot: one port on one host. Ordered by host, then port.

    Example:
        >>> Slot.parse("10.0.0.5:6700")
        Slot(host='10.0.0.5', port=6700)
        >>> str(Slot("h1", 6701))
        'h1:6701'
    """

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, text: str) -> Slot:
        """Parse ``"host:port"`` (the last ``:`` separates the port, so IPv6 hosts work).

        Raises:
            SchedulingError: ``text`` is not ``host:port`` with a port in 0..65535.
        """
        host, sep, port = text.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise SchedulingError(f"slot {text!r} must be written host:port, e.g. 10.0.0.5:6700")
        return cls(host, int(port))


def _as_slot(value: Slot | str) -> Slot:
    return value if isinstance(value, Slot) else Slot.parse(value)


def sort_slots(slots: Iterable[Slot]) -> list[Slot]:
    """Order slots so that consecutive slots are on different hosts (Storm's ``sort-slots``).

    Slots are grouped by host; hosts with more slots come first (ties by host name); ports
    ascend within a host. The result takes the first slot of every host in that order, then
    the second of every host, and so on. Duplicates are dropped.

    Example:
        >>> [str(s) for s in sort_slots([Slot("b", 2), Slot("a", 1), Slot("b", 1)])]
        ['b:1', 'a:1', 'b:2']
    """
    by_host: dict[str, list[int]] = defaultdict(list)
    for slot in set(slots):
        by_host[slot.host].append(slot.port)
    hosts = sorted(by_host, key=lambda h: (-len(by_host[h]), h))
    ports = [sorted(by_host[h]) for h in hosts]
    ordered: list[Slot] = []
    # Hosts are sorted by slot count descending, so the hosts still having a slot at
    # depth ``i`` are always a prefix of ``hosts``.
    active = len(hosts)
    depth = 0
    while active:
        while active and len(ports[active - 1]) <= depth:
            active -= 1
        for h in range(active):
            ordered.append(Slot(hosts[h], ports[h][depth]))
        depth += 1
    return ordered


def assign(
    tasks: Iterable[int],
    slots: Iterable[Slot],
    num_workers: int,
    previous: Mapping[int, Slot | str] | None = None,
    preferred: Mapping[int, Sequence[Slot | str]] | None = None,
) -> dict[int, Slot]:
    """Place ``tasks`` on ``slots`` evenly, over at most ``num_workers`` slots, moving few tasks.

    Steps:

    1. ``used = min(num_workers, len(slots), len(tasks))`` slots will hold tasks; each gets
       ``len(tasks) // used`` or one more.
    2. The target slots are the live slots the ``previous`` assignment already uses (those
       holding the most tasks first), then the other slots in :func:`sort_slots` order.
    3. The larger capacities go to the target slots that already hold the most tasks.
    4. Each target slot keeps its previous tasks up to its capacity (lowest task ids first).
    5. All other tasks (surplus, tasks of dead or dropped slots, new tasks) go, in ascending
       order, to the first of their ``preferred`` slots that is a target with spare capacity
       (a slot keeping a standby replica of the task's state, so the move replays only a
       tail); the rest are dealt round-robin over the target slots with spare capacity in
       :func:`sort_slots` order.

    Without ``previous`` this is Storm's placement: sorted task ``i`` goes to sorted slot
    ``i % used``. With a ``previous`` assignment that already satisfies the rules, the result
    equals it. The number of tasks that move is the minimum any even split over ``used``
    slots allows. The result depends only on the inputs (not on their iteration order).
    Runs in O((tasks + slots) log(tasks + slots)).

    Args:
        tasks: Task ids (no duplicates).
        slots: Live slots; duplicates are ignored.
        num_workers: Most slots to use (Storm's ``topology.workers``); >= 1.
        previous: Current assignment task -> slot (``Slot`` or ``"host:port"``); tasks no
            longer in ``tasks`` and slots no longer in ``slots`` are ignored.
        preferred: Task -> slots to place it on if it has to move, best first (its standby
            replicas); does not change how many tasks move or the even split.

    Returns:
        Task -> slot for every task.

    Raises:
        SchedulingError: ``num_workers < 1``, duplicate tasks, or tasks but no slots.

    Example:
        >>> a = assign([0, 1, 2, 3], [Slot("host1", 1), Slot("host2", 1)], num_workers=2)
        >>> sorted(str(s) for s in a.values())
        ['host1:1', 'host1:1', 'host2:1', 'host2:1']
    """
    if num_workers < 1:
        raise SchedulingError(f"num_workers must be at least 1, got {num_workers}")
    task_list = list(tasks)
    task_set = set(task_list)
    if len(task_set) != len(task_list):
        dupes = sorted(t for t, n in Counter(task_list).items() if n > 1)
        raise SchedulingError(f"duplicate task ids {dupes[:10]}: every task must appear once")
    if not task_list:
        return {}
    ordered = sort_slots(slots)
    if not ordered:
        raise SchedulingError(
            f"no worker slots to place {len(task_list)} tasks on: start workers (or supervisors) "
            "so that they register their slots, then rebalance"
        )
    used = min(num_workers, len(ordered), len(task_list))
    rank = {slot: i for i, slot in enumerate(ordered)}

    # Previous placements that can stay: task still wanted, slot still alive.
    kept: dict[Slot, list[int]] = defaultdict(list)
    if previous:
        for task, raw_slot in previous.items():
            if task in task_set:
                slot = _as_slot(raw_slot)
                if slot in rank:
                    kept[slot].append(task)

    # 2. Target slots: busiest previously-used slots first, then fresh slots in sort order
    #    (those most homeless tasks prefer first: any fresh slot gives the same even split).
    prior = sorted(kept, key=lambda s: (-len(kept[s]), rank[s]))[:used]
    chosen = set(prior)
    votes: Counter[Slot] = Counter()
    if preferred:
        housed = {t for tasks_of in kept.values() for t in tasks_of}
        for task in task_set - housed:
            votes.update({_as_slot(s) for s in preferred.get(task, ())})
    fresh = sorted((s for s in ordered if s not in chosen), key=lambda s: (-votes[s], rank[s]))
    targets = prior + fresh[: used - len(prior)]

    # 3. Capacities: ceil to the slots holding the most kept tasks (ties by sort order).
    base, extra = divmod(len(task_list), used)
    by_load = sorted(targets, key=lambda s: (-len(kept.get(s, ())), rank[s]))
    capacity = {slot: base + (1 if i < extra else 0) for i, slot in enumerate(by_load)}

    # 4. Keep what fits.
    result: dict[int, Slot] = {}
    for slot in targets:
        mine = kept.get(slot)
        if mine:
            mine.sort()
            for task in mine[: capacity[slot]]:
                result[task] = slot

    # 5. Preferred slots first, then deal the rest round-robin over slots with spare capacity.
    rooms = {slot: capacity[slot] - min(len(kept.get(slot, ())), capacity[slot]) for slot in targets}
    for task in sorted(t for t in task_list if t not in result):
        for raw_slot in (preferred or {}).get(task, ()):
            slot = _as_slot(raw_slot)
            if rooms.get(slot, 0) > 0:
                result[task] = slot
                rooms[slot] -= 1
                break
    pool = sorted(t for t in task_list if t not in result)
    spare: list[tuple[Slot, int]] = [(slot, rooms[slot]) for slot in sorted(targets, key=rank.__getitem__) if rooms[slot] > 0]
    next_task = 0
    while next_task < len(pool):
        still: list[tuple[Slot, int]] = []
        for slot, room in spare[: len(pool) - next_task]:
            result[pool[next_task]] = slot
            next_task += 1
            if room > 1:
                still.append((slot, room - 1))
        spare = still
    return result


def moved_tasks(previous: Mapping[int, Slot | str], new: Mapping[int, Slot | str]) -> set[int]:
    """Tasks present in both assignments whose slot changed (new and removed tasks excluded).

    Example:
        >>> moved_tasks({1: Slot("a", 1), 2: Slot("a", 1)}, {1: Slot("a", 1), 2: Slot("b", 1), 3: Slot("b", 1)})
        {2}
    """
    return {task for task, slot in new.items() if task in previous and _as_slot(previous[task]) != _as_slot(slot)}


# --- spreading ---------------------------------------------------------------------------------


def _used_slots(assignment: Mapping[int, Slot | str], tasks: Collection[int]) -> set[Slot]:
    return {_as_slot(slot) for task, slot in assignment.items() if task in tasks}


def needs_spread(
    tasks: Iterable[int],
    assignment: Mapping[int, Slot | str],
    slots: Iterable[Slot],
    num_workers: int,
) -> bool:
    """Whether a fully placed topology uses fewer slots than it could (Storm's ``needsScheduling``).

    Only for a topology whose every task sits on one of ``slots``: a task without a slot, or on
    a slot not in ``slots``, is the failover path's business (:func:`assign` places it), so the
    answer is False.

    Args:
        tasks: The topology's task ids.
        assignment: Current task -> slot.
        slots: The live slots a spread may use.
        num_workers: Slots the topology wants (``workers`` at submission).

    Returns:
        True when the topology uses fewer than ``min(num_workers, len(slots), len(tasks))`` slots.

    Example:
        >>> needs_spread([0, 1], {0: "h:1", 1: "h:1"}, [Slot("h", 1), Slot("h", 2)], 2)
        True
        >>> needs_spread([0, 1], {0: "h:1", 1: "h:2"}, [Slot("h", 1), Slot("h", 2), Slot("h", 3)], 3)
        False
    """
    task_set = set(tasks)
    live = set(slots)
    if not task_set or any(t not in assignment or _as_slot(assignment[t]) not in live for t in task_set):
        return False
    return len(_used_slots(assignment, task_set)) < min(num_workers, len(live), len(task_set))


def spread(
    tasks: Iterable[int],
    slots: Iterable[Slot],
    num_workers: int,
    previous: Mapping[int, Slot | str],
) -> dict[int, Slot]:
    """Spread a crowded topology over free ``slots`` the way Storm's even scheduler does, stickily.

    When :func:`needs_spread` holds, the result is :func:`assign` over ``slots`` from
    ``previous``: an even split over ``min(num_workers, len(slots), len(tasks))`` slots in which
    every used slot keeps the tasks that fit its share (lowest ids first) and only the surplus
    moves, round-robin over the free slots in :func:`sort_slots` order. That is the fewest
    moves any even split allows. Otherwise ``previous`` is returned unchanged (as slots).

    Example:
        >>> crowded = {0: "a:1", 1: "a:1", 2: "a:1", 3: "b:1"}
        >>> after = spread(range(4), [Slot("a", 1), Slot("b", 1), Slot("c", 1)], 3, crowded)
        >>> {t: str(s) for t, s in sorted(after.items())}
        {0: 'a:1', 1: 'a:1', 2: 'c:1', 3: 'b:1'}
    """
    task_list = list(tasks)
    slot_list = list(slots)
    if not needs_spread(task_list, previous, slot_list, num_workers):
        return {t: _as_slot(s) for t, s in previous.items() if t in set(task_list)}
    return assign(task_list, slot_list, num_workers, previous=previous)


@dataclass(frozen=True, slots=True)
class SpreadDecision:
    """Whether to spread a topology now, and over which slots.

    Attributes:
        due: Spread now.
        reason: Why (or why not), for logs: e.g. ``"uses 1 of 3 slots it could use"``,
            ``"already spread"``, ``"slot h:6701 live only 2.0 s (stability 5 s)"``,
            ``"last spread 3.0 s ago (interval 10 s)"``.
        slots: When due, the slots to spread over: those already used plus the free slots
            live for the stability period, in :func:`sort_slots` order.
    """

    due: bool
    reason: str
    slots: tuple[Slot, ...] = ()


def decide_spread(
    tasks: Iterable[int],
    assignment: Mapping[int, Slot | str],
    slot_live_for: Mapping[Slot, float] | Mapping[str, float],
    num_workers: int,
    *,
    since_last_spread: float | None,
    interval_s: float,
    stability_s: float,
) -> SpreadDecision:
    """The spreading rule with its rate limit (pure; the caller measures the times on its own clock).

    1. Nothing to do unless the topology uses fewer slots than ``min(num_workers, live slots,
       tasks)`` (:func:`needs_spread`).
    2. Free slots count only once live for ``stability_s`` (a flapping worker never does).
    3. A topology is spread at most once per ``interval_s``.

    Args:
        tasks: The topology's task ids.
        assignment: Current task -> slot.
        slot_live_for: Every live slot -> seconds the caller has seen it live without a break.
        num_workers: Slots the topology wants.
        since_last_spread: Seconds since the caller last spread this topology (None: never).
        interval_s: Least time between two spreads of a topology.
        stability_s: Time a free slot must have been live.

    Returns:
        The decision; when due, :func:`spread` over ``decision.slots`` gives the new assignment.

    Example:
        >>> crowded = {0: "a:1", 1: "a:1"}
        >>> decide_spread([0, 1], crowded, {"a:1": 60.0, "b:1": 1.0}, 2,
        ...               since_last_spread=None, interval_s=10, stability_s=5).reason
        'slot b:1 live only 1.0 s (stability 5 s)'
        >>> decide_spread([0, 1], crowded, {"a:1": 60.0, "b:1": 6.0}, 2,
        ...               since_last_spread=None, interval_s=10, stability_s=5).due
        True
    """
    task_list = list(tasks)
    live_for = {_as_slot(slot): seconds for slot, seconds in slot_live_for.items()}
    if not needs_spread(task_list, assignment, live_for, num_workers):
        return SpreadDecision(False, "already spread (or tasks to place first)")
    used = _used_slots(assignment, set(task_list))
    stable = used | {slot for slot, seconds in live_for.items() if seconds >= stability_s}
    if not needs_spread(task_list, assignment, stable, num_workers):
        young = sorted((s for s in live_for if s not in stable), key=lambda s: -live_for[s])
        return SpreadDecision(False, f"slot {young[0]} live only {live_for[young[0]]:.1f} s (stability {stability_s:g} s)")
    if since_last_spread is not None and since_last_spread < interval_s:
        return SpreadDecision(False, f"last spread {since_last_spread:.1f} s ago (interval {interval_s:g} s)")
    target = min(num_workers, len(stable), len(task_list))
    return SpreadDecision(True, f"uses {len(used)} of {target} slots it could use", tuple(sort_slots(stable)))


def place_standbys(
    tasks: Iterable[int],
    owners: Mapping[int, Slot | str],
    slots: Iterable[Slot],
    replicas: int,
    previous: Mapping[int, Sequence[Slot | str]] | None = None,
) -> dict[int, list[Slot]]:
    """Choose the slots that keep a standby replica of each stateful task's store.

    Kafka Streams' rule for ``num.standby.replicas``: a standby is never on the task's owner,
    and goes to another host than the owner's (and than the task's other standbys) when there
    is one. Among equal candidates the slot holding the fewest of the topology's tasks plus
    standbys so far wins (an idle slot first: a failover fills free slots first, so that is
    where the task will go), then :func:`sort_slots` order, so standbys spread evenly. Placement is sticky: a previous
    standby that is still live and not the owner stays (its store is warm). With fewer live
    slots than ``replicas + 1`` a task gets as many standbys as there are other slots.

    Args:
        tasks: The stateful task ids.
        owners: Task -> its owner slot (tasks without an owner get no standby).
        slots: Live slots.
        replicas: Standbys per task (0: none).
        previous: Task -> its current standby slots.

    Returns:
        Task -> its standby slots (possibly empty), for every task with an owner.

    Raises:
        SchedulingError: ``replicas`` is negative.

    Example:
        >>> owners = {0: Slot("h1", 1), 1: Slot("h2", 1)}
        >>> live = [Slot("h1", 1), Slot("h1", 2), Slot("h2", 1)]
        >>> {t: [str(s) for s in sb] for t, sb in place_standbys([0, 1], owners, live, 1).items()}
        {0: ['h2:1'], 1: ['h1:2']}
    """
    if replicas < 0:
        raise SchedulingError(f"standby replicas must be 0 or more, got {replicas}")
    ordered = sort_slots(slots)
    rank = {slot: i for i, slot in enumerate(ordered)}
    load: Counter[Slot] = Counter(_as_slot(s) for s in owners.values())
    placed: dict[int, list[Slot]] = {}
    task_list = sorted(t for t in set(tasks) if t in owners)
    for task in task_list:  # sticky part first, so the load counts what stays
        owner = _as_slot(owners[task])
        kept: list[Slot] = []
        for raw in (previous or {}).get(task, ()):
            slot = _as_slot(raw)
            if slot in rank and slot != owner and slot not in kept and len(kept) < replicas:
                kept.append(slot)
                load[slot] += 1
        placed[task] = kept
    for task in task_list:
        owner = _as_slot(owners[task])
        chosen = placed[task]
        while len(chosen) < replicas:
            hosts = {owner.host, *(s.host for s in chosen)}
            candidates = [s for s in ordered if s != owner and s not in chosen]
            if not candidates:
                break
            best = min(candidates, key=lambda s: (s.host in hosts, load[s], rank[s]))
            chosen.append(best)
            load[best] += 1
    return placed
