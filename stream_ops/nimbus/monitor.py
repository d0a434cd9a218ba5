"""Heartbeat monitor: find dead tasks and reassign them (Nimbus's ``monitor`` loop).

Two layers:

* :class:`HeartbeatTracker` is pure (no clock reads, no I/O): it is fed what the monitor saw
  (a *fingerprint* of each task's heartbeat znode) at a time ``now`` given by the caller,
  remembers when each fingerprint last *changed* by the monitor's own clock, and decides
  which tasks are dead.
* :class:`Monitor` reads ZooKeeper once per :meth:`Monitor.tick`, feeds the tracker and
  calls :func:`~stream_ops.nimbus.assignment.reassign` for every ACTIVE topology that has
  dead or unassigned tasks.

Liveness rules (Storm's nimbus ``heartbeats-cache``):

1. A task assigned to a worker whose ephemeral ``/workers/{id}`` node is gone is dead at once
   (``"worker gone"``); no grace applies.
2. A task whose (task, worker) pairing the monitor first saw less than ``launch_grace_s``
   ago is alive whatever its heartbeat says: a worker needs time to start a Spark query, to
   wait for the previous owner's ``/owners`` node to go, and to replay state.
3. After the grace, a task is dead when its heartbeat has not changed for more than
   ``task_timeout_s`` by the monitor's clock: ``"heartbeat missing"`` when the node is absent
   (or written by another worker), ``"heartbeat stale 12.3 s"`` when it is present but not
   rewritten.

Clock skew: no time written by another process is ever compared with the monitor's clock.
Heartbeat ages are measured from the moment the *monitor* saw the fingerprint change (not
from the ``time`` field the worker wrote), and the launch grace runs from the moment the
monitor first saw the (task, worker, start time) pairing: the assignment's ``start_times``,
written by the wall clock of whichever process reassigned, are only compared for equality,
to notice a task that moved away and back between two polls. A monitor that starts (or
becomes leader) knows nothing yet, so every task gets a launch grace from that moment, as
in Storm after a nimbus restart; worker loss is still seen at once.

A slot on a live worker that has a dead task is treated as bad, as Storm does: it is left
out of that reassignment (so all its tasks move), unless no other live slot exists.

The same tracker is the liveness rule everywhere: the Dagster heartbeat sensor keeps one in
its cursor (:meth:`HeartbeatTracker.export_beats` / :meth:`HeartbeatTracker.import_beats`, fed
by its own clock), and :func:`~stream_ops.nimbus.status.describe_topology` reports heartbeat
ages from it when given one. A heartbeat's fingerprint is the ``mzxid`` of its znode
(:func:`heartbeat_fingerprint`): it changes with every write, and a node deleted and created
again has a new one.

Spreading (Storm's even scheduler for a topology that got more room): when an ACTIVE
topology has nothing dead or unassigned but uses fewer slots than it wants while other live
slots exist, :func:`~stream_ops.scheduler.decide_spread` applies the
:class:`~stream_ops.config.SpreadPolicy` (a slot counts once :class:`SlotTracker` has seen it
live for ``stability_s``; at most one spread per topology per ``interval_s``, both by the
monitor's clock) and :func:`~stream_ops.nimbus.assignment.spread_topology` moves the fewest
tasks.

Example:
    >>> tracker = HeartbeatTracker()
    >>> tracker.observe("wc-1-1", 0, ("h1:6700", 10, 11), now=100.0)
    >>> tracker.dead_tasks("wc-1-1", {0: "h1:6700"}, {0: 5.0}, {"h1:6700"}, now=100.0,
    ...                    task_timeout_s=10, launch_grace_s=0)
    {}
    >>> tracker.dead_tasks("wc-1-1", {0: "h1:6700"}, {0: 5.0}, {"h1:6700"}, now=112.5,
    ...                    task_timeout_s=10, launch_grace_s=0)
    {0: 'heartbeat stale 12.5 s'}
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from stream_ops.config import SpreadPolicy
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import AssignmentRecord, StormRecord
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import ConfigError, StreamOpsError, ZooKeeperUnavailableError
from stream_ops.nimbus.assignment import live_slot_registrations, read_assignment, reassign, spread_topology, standbys_stale
from stream_ops.scheduler import decide_spread

__all__ = [
    "REASON_HEARTBEAT_MISSING",
    "REASON_HEARTBEAT_STALE",
    "REASON_WORKER_GONE",
    "HeartbeatTracker",
    "Monitor",
    "MonitorAction",
    "SlotTracker",
    "heartbeat_fingerprint",
]

logger = logging.getLogger(__name__)

#: Reason of a task whose worker's ``/workers`` node is gone.
REASON_WORKER_GONE = "worker gone"
#: Reason of a task whose heartbeat node is absent (or belongs to another worker) too long.
REASON_HEARTBEAT_MISSING = "heartbeat missing"
#: Prefix of the reason of a task whose heartbeat node was not rewritten in time.
REASON_HEARTBEAT_STALE = "heartbeat stale"


# --- pure part ---------------------------------------------------------------------------------

#: A heartbeat fingerprint as stored in JSON (a sensor cursor): an int, a string, a list or null.
Fingerprint = Hashable | None


def heartbeat_fingerprint(data: Any, mzxid: int, worker: str | None) -> int | None:
    """The fingerprint of a heartbeat znode as the liveness rule sees it.

    Args:
        data: The znode's JSON value.
        mzxid: Its ``mzxid`` (changes with every write; a re-created node has a new one).
        worker: The worker whose heartbeat counts (the assigned worker, or the owner); None:
            any writer counts.

    Returns:
        ``mzxid``, or None when the beat was written by another worker (e.g. the previous
        owner's last beat: it says nothing about ``worker``).

    Example:
        >>> heartbeat_fingerprint({"worker_id": "h:1"}, 42, "h:1"), heartbeat_fingerprint({"worker_id": "h:2"}, 42, "h:1")
        (42, None)
    """
    beat_worker = data.get("worker_id") if isinstance(data, dict) else None
    if worker is not None and beat_worker is not None and beat_worker != worker:
        return None
    return mzxid


def _to_json_value(fingerprint: Fingerprint) -> Any:
    return list(fingerprint) if isinstance(fingerprint, tuple) else fingerprint


def _from_json_value(value: Any) -> Fingerprint:
    return tuple(value) if isinstance(value, list) else value


@dataclass(slots=True)
class _Beat:
    fingerprint: Hashable | None
    changed_at: float


@dataclass(frozen=True, slots=True)
class _Pairing:
    worker: str
    start_time: float | None
    seen_at: float


class HeartbeatTracker:
    """Remembers, by the monitor's clock, when each task's heartbeat last changed.

    Pure: every method takes ``now`` from the caller and does no I/O, so it is tested
    directly. One tracker serves many topologies. Not thread-safe (one monitor thread).

    Example:
        >>> t = HeartbeatTracker()
        >>> t.dead_tasks("t", {0: "h:1"}, {}, set(), now=0.0, task_timeout_s=10, launch_grace_s=60)
        {0: 'worker gone'}
    """

    def __init__(self) -> None:
        self._beats: dict[tuple[str, int], _Beat] = {}
        self._pairings: dict[tuple[str, int], _Pairing] = {}

    def observe(self, topology_id: str, task_id: int, fingerprint: Hashable | None, now: float) -> None:
        """Record what the monitor saw of one task's heartbeat at ``now``.

        Args:
            topology_id: Topology id.
            task_id: Task id.
            fingerprint: Anything that changes with every beat and identifies it (e.g. the
                znode's ``(worker, czxid, mzxid)``); ``None`` when there is no heartbeat node
                (or it was written by a worker other than the assigned one).
            now: The monitor's clock (any monotonic time base, used consistently).
        """
        key = (topology_id, task_id)
        beat = self._beats.get(key)
        if beat is None:
            self._beats[key] = _Beat(fingerprint, now)
        elif beat.fingerprint != fingerprint:
            beat.fingerprint = fingerprint
            beat.changed_at = now

    def export_beats(self, topology_id: str) -> dict[int, tuple[Any, float]]:
        """Task -> (fingerprint, time it last changed) of one topology, JSON-friendly.

        What a Dagster sensor keeps in its cursor between ticks (tuple fingerprints become
        lists; :meth:`import_beats` turns them back).
        """
        return {
            task: (_to_json_value(beat.fingerprint), beat.changed_at)
            for (topology, task), beat in self._beats.items()
            if topology == topology_id
        }

    def import_beats(self, topology_id: str, beats: Mapping[int, tuple[Any, float] | list[Any]]) -> None:
        """Restore what :meth:`export_beats` gave (replacing what is known of the topology's beats)."""
        for key in [k for k in self._beats if k[0] == topology_id]:
            del self._beats[key]
        for task, (fingerprint, changed_at) in beats.items():
            self._beats[(topology_id, int(task))] = _Beat(_from_json_value(fingerprint), float(changed_at))

    def heartbeat_age(self, topology_id: str, task_id: int, now: float) -> float | None:
        """Seconds since the task's heartbeat fingerprint last changed, or None if never observed."""
        beat = self._beats.get((topology_id, task_id))
        return None if beat is None else max(0.0, now - beat.changed_at)

    def dead_tasks(
        self,
        topology_id: str,
        assigned: Mapping[int, str],
        start_times: Mapping[int, float],
        live_workers: Collection[str],
        now: float,
        task_timeout_s: float,
        launch_grace_s: float,
    ) -> dict[int, str]:
        """Decide which assigned tasks are dead, with the reason.

        Also records the first time each (task, worker, start time) pairing is seen, which
        starts its launch grace; pairings of tasks no longer assigned are dropped. A task
        never passed to :meth:`observe` counts as having no heartbeat since the first call
        that saw it.

        Args:
            topology_id: Topology id.
            assigned: Task -> worker id (``host:port``) of the current assignment.
            start_times: Task -> start time from the assignment. Compared only for equality
                (it is another process's wall clock), to see a task that was reassigned.
            live_workers: Ids of the workers whose ``/workers`` node exists.
            now: The monitor's clock.
            task_timeout_s: Longest time a heartbeat may stay unchanged (or missing).
            launch_grace_s: Time after a pairing is first seen during which heartbeats
                are not required.

        Returns:
            Task -> reason: ``"worker gone"``, ``"heartbeat missing"`` or
            ``"heartbeat stale <age> s"``. Empty when every task is alive.

        Example:
            >>> t = HeartbeatTracker()
            >>> t.dead_tasks("t", {0: "h:1"}, {0: 1.0}, {"h:1"}, now=0.0, task_timeout_s=1, launch_grace_s=5)
            {}
            >>> t.dead_tasks("t", {0: "h:1"}, {0: 1.0}, {"h:1"}, now=5.5, task_timeout_s=1, launch_grace_s=5)
            {0: 'heartbeat missing'}
        """
        for key in [k for k in self._pairings if k[0] == topology_id and k[1] not in assigned]:
            del self._pairings[key]
        dead: dict[int, str] = {}
        for task_id in sorted(assigned):
            worker = assigned[task_id]
            key = (topology_id, task_id)
            start = start_times.get(task_id)
            pairing = self._pairings.get(key)
            if pairing is None or pairing.worker != worker or pairing.start_time != start:
                pairing = _Pairing(worker, start, now)
                self._pairings[key] = pairing
            beat = self._beats.get(key)
            if beat is None:
                beat = self._beats[key] = _Beat(None, now)
            if worker not in live_workers:
                dead[task_id] = REASON_WORKER_GONE
                continue
            if now - pairing.seen_at <= launch_grace_s:
                continue
            age = now - beat.changed_at
            if age > task_timeout_s:
                dead[task_id] = REASON_HEARTBEAT_MISSING if beat.fingerprint is None else f"{REASON_HEARTBEAT_STALE} {age:.1f} s"
        return dead

    def reset_heartbeat_clocks(self, now: float) -> None:
        """Restart every heartbeat age from ``now`` (launch graces are kept).

        Call after the monitor was blind (its ZooKeeper connection was SUSPENDED): workers
        may have been unable to beat too, so unchanged heartbeats prove nothing yet.
        """
        for beat in self._beats.values():
            beat.changed_at = max(beat.changed_at, now)

    def forget(self, topology_id: str) -> None:
        """Drop everything known about a topology (removed, or no longer ACTIVE).

        When it runs again, its tasks get a fresh launch grace.
        """
        for store in (self._beats, self._pairings):
            for key in [k for k in store if k[0] == topology_id]:
                del store[key]

    def topologies(self) -> set[str]:
        """Topology ids the tracker holds state for."""
        return {k[0] for k in self._beats} | {k[0] for k in self._pairings}


class SlotTracker:
    """Remembers, by the observer's clock, since when each worker slot has been live without a break.

    Pure, like :class:`HeartbeatTracker`: fed the live slots with their registration identity
    (the czxid of ``/workers/{host:port}``) at a ``now`` given by the caller. A slot that
    vanished, or registered again (new identity), starts over, so a flapping worker never
    looks stable. Used by the spreading rule (:func:`~stream_ops.scheduler.decide_spread`).

    Example:
        >>> slots = SlotTracker()
        >>> slots.observe({"h:1": 7}, now=100.0)
        >>> slots.observe({"h:1": 7, "h:2": 9}, now=104.0)
        >>> slots.live_for(now=110.0)
        {'h:1': 10.0, 'h:2': 6.0}
        >>> slots.observe({"h:1": 7, "h:2": 12}, now=111.0)  # h:2 re-registered in between
        >>> slots.live_for(now=111.0)["h:2"]
        0.0
    """

    def __init__(self) -> None:
        self._since: dict[str, tuple[Fingerprint, float]] = {}

    def observe(self, registrations: Mapping[str, Fingerprint], now: float) -> None:
        """Record the complete set of live slots seen at ``now`` (slot -> registration identity)."""
        since: dict[str, tuple[Fingerprint, float]] = {}
        for slot, identity in registrations.items():
            known = self._since.get(slot)
            since[slot] = known if known is not None and known[0] == identity else (identity, now)
        self._since = since

    def live_for(self, now: float) -> dict[str, float]:
        """Live slot -> seconds it has been live (as last observed)."""
        return {slot: max(0.0, now - seen) for slot, (_, seen) in self._since.items()}

    def export(self) -> dict[str, tuple[Any, float]]:
        """Slot -> (registration identity, live since), JSON-friendly (for a sensor cursor)."""
        return {slot: (_to_json_value(identity), seen) for slot, (identity, seen) in self._since.items()}

    @classmethod
    def restore(cls, data: Mapping[str, tuple[Any, float] | list[Any]]) -> SlotTracker:
        """A tracker holding what :meth:`export` gave."""
        tracker = cls()
        tracker._since = {slot: (_from_json_value(identity), float(seen)) for slot, (identity, seen) in data.items()}
        return tracker


# --- I/O part ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MonitorAction:
    """One reassignment the monitor made.

    Attributes:
        topology_id: The topology.
        dead: Task -> reason, for the tasks found dead.
        unassigned: Tasks that had no worker (e.g. submitted before any worker existed).
        moved: Task -> ``(previous worker or None, new worker)`` for every task that changed.
        epoch: The new assignment epoch (znode version).
        excluded_slots: Slots left out because a task on them was dead while they lived.
        spread: True when this was a spread onto free slots (nothing was dead).
    """

    topology_id: str
    dead: Mapping[int, str]
    unassigned: tuple[int, ...]
    moved: Mapping[int, tuple[str | None, str]]
    epoch: int
    excluded_slots: tuple[str, ...] = field(default=())
    spread: bool = False

    def to_json_obj(self) -> dict[str, Any]:
        """JSON-friendly form (for the CLI and logs)."""
        return {
            "topology": self.topology_id,
            "epoch": self.epoch,
            "dead": {str(t): r for t, r in sorted(self.dead.items())},
            "unassigned": list(self.unassigned),
            "moved": {str(t): {"from": f, "to": to} for t, (f, to) in sorted(self.moved.items())},
            "excluded_slots": list(self.excluded_slots),
            "spread": self.spread,
        }


class Monitor:
    """Polls heartbeats and worker nodes, reassigns the tasks of dead slots, spreads crowded topologies.

    Call :meth:`tick` periodically (``stream-ops nimbus`` does it through
    :func:`~stream_ops.nimbus.leader.run_nimbus`, only on the elected leader). The monitor
    keeps its observations between ticks; build a new one whenever it may have missed
    changes for long (e.g. after winning an election).

    Args:
        store: Connected store.
        task_timeout_s: A heartbeat unchanged (or missing) this long, after the grace, is dead.
        launch_grace_s: Time a newly (re)assigned task has before heartbeats are required.
        clock: The monitor's clock (monotonic; injectable for tests).
        spread: When a crowded topology is spread onto free slots (a topology's conf may
            override it, see :meth:`~stream_ops.config.SpreadPolicy.for_conf`).

    Example:
        >>> monitor = Monitor(store, task_timeout_s=10, launch_grace_s=60)  # doctest: +SKIP
        >>> for action in monitor.tick():  # doctest: +SKIP
        ...     print(action.topology_id, action.dead, action.epoch)
    """

    def __init__(
        self,
        store: ZkStore,
        *,
        task_timeout_s: float = 10.0,
        launch_grace_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        spread: SpreadPolicy | None = None,
    ) -> None:
        if task_timeout_s <= 0:
            raise ValueError(f"task_timeout_s must be positive, got {task_timeout_s}")
        if launch_grace_s < 0:
            raise ValueError(f"launch_grace_s must not be negative, got {launch_grace_s}")
        self.store = store
        self.task_timeout_s = task_timeout_s
        self.launch_grace_s = launch_grace_s
        self.clock = clock
        self.spread = spread if spread is not None else SpreadPolicy()
        self.tracker = HeartbeatTracker()
        self.slots = SlotTracker()
        # Monitor-clock time of each topology's last spread (the rate limit).
        self._spread_at: dict[str, float] = {}
        # What was last logged per topology, so that only changes are logged.
        self._reported_dead: dict[str, dict[int, str]] = {}
        self._reported_waiting: dict[str, int] = {}
        self._reported_stuck: dict[str, frozenset[int]] = {}
        self._reported_spread: dict[str, str] = {}

    def reset_heartbeat_clocks(self) -> None:
        """Restart heartbeat ages from now (after the monitor's session was SUSPENDED)."""
        self.tracker.reset_heartbeat_clocks(self.clock())

    def tick(self) -> list[MonitorAction]:
        """Check every ACTIVE topology once; reassign where tasks are dead or unassigned, spread where due.

        Errors of one topology (e.g. killed while being read, or a compare-and-set lost too
        often) are logged and do not stop the others; a lost connection propagates as
        :class:`~stream_ops.errors.ZooKeeperUnavailableError`.

        Returns:
            One action per topology whose assignment changed.
        """
        live = self._live_slots()
        actions: list[MonitorAction] = []
        seen: set[str] = set()
        for topology_id in self.store.children(ZkPaths.STORMS):
            found = self.store.get_json(ZkPaths.storm(topology_id))
            if found is None:
                continue
            try:
                storm = StormRecord.model_validate(found[0])
            except ValidationError as e:
                logger.warning("monitor: %s holds no valid topology record, skipped: %s", topology_id, e)
                continue
            if storm.status != "ACTIVE":
                continue
            seen.add(topology_id)
            try:
                action = self._check(storm, live)
            except ZooKeeperUnavailableError:
                raise
            except StreamOpsError as e:
                logger.warning("monitor: topology %s skipped this tick: %s", topology_id, e)
                continue
            if action is not None:
                actions.append(action)
        for topology_id in self.tracker.topologies() - seen:
            # Removed or no longer ACTIVE: when it runs again its tasks get a fresh grace.
            self.tracker.forget(topology_id)
            self._reported_dead.pop(topology_id, None)
            self._reported_waiting.pop(topology_id, None)
            self._reported_stuck.pop(topology_id, None)
            self._reported_spread.pop(topology_id, None)
            self._spread_at.pop(topology_id, None)
        return actions

    # --- one topology --------------------------------------------------------------------

    def _live_slots(self) -> set[str]:
        """The live slots now; also feeds the slot tracker (for the spreading rule)."""
        registrations = live_slot_registrations(self.store)
        self.slots.observe(registrations, self.clock())
        return set(registrations)

    def _fingerprint(self, topology_id: str, task_id: int, worker: str) -> Hashable | None:
        found = self.store.get_json(ZkPaths.heartbeat(topology_id, task_id))
        return None if found is None else heartbeat_fingerprint(found[0], found[1].mzxid, worker)

    def _check(self, storm: StormRecord, live: set[str]) -> MonitorAction | None:
        topology_id = storm.topology_id
        task_ids = sorted(int(t) for t in self.store.children(ZkPaths.tasks(topology_id)))
        current = read_assignment(self.store, topology_id)
        record, epoch = current if current is not None else (AssignmentRecord(), -1)
        known = set(task_ids)
        assigned = {t: w for t, w in record.tasks.items() if t in known}
        if not set(assigned.values()) <= live:
            # The assignment may be newer than the worker list read at the start of the tick
            # (a worker joined and got tasks meanwhile): only a fresh list proves a worker gone.
            live = self._live_slots()
        now = self.clock()
        for task_id, worker in assigned.items():
            self.tracker.observe(topology_id, task_id, self._fingerprint(topology_id, task_id, worker), now)
        dead = self.tracker.dead_tasks(
            topology_id,
            assigned,
            record.start_times,
            live,
            now,
            self.task_timeout_s,
            self.launch_grace_s,
        )
        unassigned = tuple(t for t in task_ids if t not in assigned)
        self._log_dead(topology_id, dead)
        if not dead and not unassigned:
            self._reported_stuck.pop(topology_id, None)
            if not live:
                return None
            return self._maybe_spread(storm, task_ids, assigned, record, now) or self._maybe_replace_standbys(storm, record, live)
        if not live:
            if self._reported_waiting.get(topology_id) != len(task_ids):
                logger.warning("topology %s: no live worker; %d tasks wait for one to join", topology_id, len(task_ids))
                self._reported_waiting[topology_id] = len(task_ids)
            return None
        self._reported_waiting.pop(topology_id, None)

        bad = sorted({assigned[t] for t, reason in dead.items() if reason != REASON_WORKER_GONE} & live)
        excluded = tuple(bad) if set(bad) != live else ()
        new_record, new_epoch = reassign(self.store, topology_id, exclude_slots=excluded)
        if new_epoch == epoch and new_record.tasks == record.tasks:
            stuck = frozenset(dead) | frozenset(unassigned)
            if self._reported_stuck.get(topology_id) != stuck:
                logger.warning(
                    "topology %s: tasks %s are dead or unassigned but there is no other slot to move them to "
                    "(live slots: %s); start more workers",
                    topology_id,
                    sorted(stuck),
                    sorted(live),
                )
                self._reported_stuck[topology_id] = stuck
            return None
        self._reported_stuck.pop(topology_id, None)
        moved = {t: (record.tasks.get(t), w) for t, w in sorted(new_record.tasks.items()) if record.tasks.get(t) != w}
        reported = self._reported_dead.get(topology_id)
        if reported:
            # Tasks that moved start afresh: not "alive again" when their new slot's grace begins.
            for task_id in moved:
                reported.pop(task_id, None)
        action = MonitorAction(
            topology_id=topology_id,
            dead=dict(dead),
            unassigned=unassigned,
            moved=moved,
            epoch=new_epoch,
            excluded_slots=excluded,
        )
        logger.info(
            "topology %s: reassigned at epoch %d (dead %s, unassigned %s, excluded slots %s): moved %s",
            topology_id,
            new_epoch,
            dict(dead),
            list(unassigned),
            list(excluded),
            {t: f"{f or '-'} -> {to}" for t, (f, to) in moved.items()},
        )
        return action

    def _maybe_replace_standbys(self, storm: StormRecord, record: AssignmentRecord, live: set[str]) -> MonitorAction | None:
        """Re-place standby replicas that are gone (a dead worker's) or missing (a worker joined
        since), without moving any task: a new assignment epoch with the same tasks."""
        if not standbys_stale(storm, record, live):
            return None
        new_record, new_epoch = reassign(self.store, storm.topology_id)
        if new_record.tasks != record.tasks or new_record.standbys == record.standbys:
            return None
        logger.info("topology %s: standby replicas re-placed at epoch %d: %s", storm.topology_id, new_epoch, new_record.standbys)
        return MonitorAction(topology_id=storm.topology_id, dead={}, unassigned=(), moved={}, epoch=new_epoch, excluded_slots=())

    def _policy(self, storm: StormRecord) -> SpreadPolicy:
        try:
            return self.spread.for_conf(storm.conf)
        except ConfigError as e:
            self._report_spread(storm.topology_id, f"bad spread conf, using the defaults: {e}", logging.WARNING)
            return self.spread

    def _maybe_spread(
        self,
        storm: StormRecord,
        task_ids: list[int],
        assigned: dict[int, str],
        record: AssignmentRecord,
        now: float,
    ) -> MonitorAction | None:
        """Spread a healthy topology onto free stable slots when the rate limit allows (module docstring)."""
        topology_id = storm.topology_id
        policy = self._policy(storm)
        last = self._spread_at.get(topology_id)
        decision = decide_spread(
            task_ids,
            assigned,
            self.slots.live_for(now),
            storm.workers,
            since_last_spread=None if last is None else now - last,
            interval_s=policy.interval_s,
            stability_s=policy.stability_s,
        )
        if not decision.due:
            self._report_spread(topology_id, decision.reason, logging.DEBUG)
            return None
        result = spread_topology(self.store, topology_id, slots=[str(s) for s in decision.slots])
        if result is None:
            return None
        self._spread_at[topology_id] = now
        new_record, new_epoch = result
        moved = {t: (record.tasks.get(t), w) for t, w in sorted(new_record.tasks.items()) if record.tasks.get(t) != w}
        self._reported_spread.pop(topology_id, None)
        if not moved:
            return None
        logger.info(
            "topology %s: spread at epoch %d (%s): moved %s",
            topology_id,
            new_epoch,
            decision.reason,
            {t: f"{f or '-'} -> {to}" for t, (f, to) in moved.items()},
        )
        return MonitorAction(topology_id=topology_id, dead={}, unassigned=(), moved=moved, epoch=new_epoch, spread=True)

    def _report_spread(self, topology_id: str, reason: str, level: int) -> None:
        """Log why a topology is not spread, once per reason kind (the numbers in it change every tick)."""
        kind = reason.split(" ", 2)[:2]
        key = " ".join(kind)
        if self._reported_spread.get(topology_id) != key:
            self._reported_spread[topology_id] = key
            logger.log(level, "topology %s: not spread now: %s", topology_id, reason)

    def _log_dead(self, topology_id: str, dead: dict[int, str]) -> None:
        previous = self._reported_dead.get(topology_id, {})
        newly = {t: r for t, r in dead.items() if t not in previous}
        if newly:
            logger.warning("topology %s: dead tasks %s", topology_id, newly)
        revived = sorted(set(previous) - set(dead))
        if revived:
            logger.info("topology %s: tasks %s are alive again", topology_id, revived)
        if dead:
            self._reported_dead[topology_id] = dict(dead)
        else:
            self._reported_dead.pop(topology_id, None)
