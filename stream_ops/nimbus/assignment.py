"""Compute and store a topology's assignment from the live worker slots (Nimbus's job).

* :func:`reassign`: the sticky even split over the live slots (failover, ``storm rebalance``).
* :func:`spread_topology`: Storm's spreading of a crowded topology onto free slots, the one
  function both the nimbus monitor and the Dagster rebalance op call once their rate limit
  (:func:`~stream_ops.scheduler.decide_spread`) says it is due.
* :func:`hand_over_to_standbys`: the one assignment write that is not the nimbus's: a worker
  that stops cleanly moves the tasks it owns onto their live standby replicas itself, so they
  do not wait for the nimbus to notice it leaving (DESIGN section 3, "Who writes
  ``/assignments``").

The readers :func:`live_workers` and :func:`read_assignment` live in
:mod:`stream_ops.coordination.cluster_state` (workers read them too) and are re-exported here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from stream_ops.coordination.cluster_state import live_workers, read_assignment
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import AssignmentRecord, StormRecord, WorkerRecord
from stream_ops.coordination.store import ZkStore, encode_json
from stream_ops.errors import ConcurrentUpdateError, TopologyNotFoundError, TransactionFailedError, ZnodeExistsError
from stream_ops.scheduler import Slot, assign, needs_spread, place_standbys

__all__ = [
    "Handover",
    "commit_handover",
    "hand_over_to_standbys",
    "handover_record",
    "live_slot_registrations",
    "live_workers",
    "plan_handover",
    "read_assignment",
    "reassign",
    "spread_topology",
    "standbys_stale",
]

logger = logging.getLogger(__name__)


def reassign(
    store: ZkStore,
    topology_id: str,
    *,
    num_workers: int | None = None,
    clock: Callable[[], float] = time.time,
    retries: int = 10,
    exclude_slots: Collection[str] = (),
) -> tuple[AssignmentRecord, int]:
    """Re-deal a topology's tasks over the live slots, keeping healthy placements.

    Tasks on live slots stay where the even split allows; tasks of vanished slots and new
    tasks go to slots with room. Written with compare-and-set; the new znode version is the
    new assignment epoch. With no live worker the assignment is left empty until one joins.
    An assignment that would not change is not rewritten (the epoch stays).

    Args:
        store: Connected store.
        topology_id: The topology.
        num_workers: Most slots to use; default the ``workers`` wanted in ``/storms``.
        clock: Wall clock for the start times of tasks that move (only compared for
            equality by the monitor, so skew between writers does not matter).
        retries: Compare-and-set attempts before giving up.
        exclude_slots: Live slots (``host:port``) not to use this time, e.g. a slot where a
            task's heartbeat went stale (Storm treats it as bad): all its tasks move.
            Ignored when it would leave no slot at all.

    Returns:
        The assignment now stored and its epoch (znode version).

    Raises:
        TopologyNotFoundError: The topology is not in ``/storms``.
        ConcurrentUpdateError: Other writers changed the assignment ``retries`` times.

    Example:
        >>> record, epoch = reassign(store, "wordcount-1-1700000000", exclude_slots=["h1:6700"])  # doctest: +SKIP
    """
    found = store.get_json(ZkPaths.storm(topology_id))
    if found is None:
        raise TopologyNotFoundError(f"topology {topology_id!r} does not exist; see 'stream-ops list'")
    storm = StormRecord.model_validate(found[0])
    wanted = num_workers if num_workers is not None else storm.workers
    excluded = {str(Slot.parse(s)) for s in exclude_slots}
    task_ids = sorted(int(t) for t in store.children(ZkPaths.tasks(topology_id)))
    for _ in range(retries):
        current = read_assignment(store, topology_id)
        previous = current[0] if current is not None else AssignmentRecord()
        slots = [Slot(w.host, w.port) for w in live_workers(store).values()]
        if excluded:
            usable = [slot for slot in slots if str(slot) not in excluded]
            if usable:
                slots = usable
            else:
                logger.warning("topology %s: every live slot is excluded (%s); using them all", topology_id, sorted(excluded))
        standbys: dict[int, list[str]] = {}
        if slots:
            placed = assign(
                task_ids,
                slots,
                wanted,
                previous={t: Slot.parse(w) for t, w in previous.tasks.items()},
                preferred=previous.standbys,  # a moving task goes to a warm standby where the split allows
            )
            tasks = {t: str(slot) for t, slot in placed.items()}
            if storm.standby_replicas > 0:
                chosen = place_standbys(storm.stateful_tasks, placed, slots, storm.standby_replicas, previous.standbys)
                standbys = {t: [str(s) for s in sb] for t, sb in chosen.items() if sb}
        else:
            logger.warning("topology %s: no live worker; its %d tasks wait unassigned", topology_id, len(task_ids))
            tasks = {}
        now = clock()
        start_times = {t: previous.start_times.get(t, now) if previous.tasks.get(t) == w else now for t, w in tasks.items()}
        record = AssignmentRecord(tasks=tasks, start_times=start_times, standbys=standbys)
        if current is not None and record.tasks == previous.tasks and record.standbys == previous.standbys:
            return previous, current[1]
        try:
            if current is None:
                store.create_json(ZkPaths.assignment(topology_id), record.to_json_obj())
                version = 0
            else:
                version = store.set_json(ZkPaths.assignment(topology_id), record.to_json_obj(), version=current[1]).version
        except (ConcurrentUpdateError, ZnodeExistsError):  # another writer won the compare-and-set or the create
            continue
        moved = sorted(t for t in tasks if previous.tasks.get(t) != tasks[t])
        onto_standby = sorted(t for t in moved if tasks[t] in previous.standbys.get(t, ()))
        logger.info(
            "topology %s: assignment epoch %d, %d tasks placed, moved %s (onto a standby: %s)",
            topology_id,
            version,
            len(tasks),
            moved,
            onto_standby,
        )
        return record, version
    raise ConcurrentUpdateError(f"assignment of {topology_id} kept changing under us; retry the rebalance")


def standbys_stale(storm: StormRecord, record: AssignmentRecord, live: Collection[str]) -> bool:
    """Whether the standby replicas of ``record`` differ from what placing them again over the
    ``live`` slots gives (a standby's worker died, or a worker joined where one is missing).

    Placement is sticky, so a healthy placement is never stale.
    """
    if storm.standby_replicas <= 0:
        return False
    owners = {t: Slot.parse(w) for t, w in record.tasks.items() if w in live}
    placed = place_standbys(storm.stateful_tasks, owners, [Slot.parse(s) for s in live], storm.standby_replicas, record.standbys)
    wanted = {t: [str(s) for s in sb] for t, sb in placed.items() if sb}
    return wanted != {t: sb for t, sb in record.standbys.items() if sb}


def live_slot_registrations(store: ZkStore) -> dict[str, int]:
    """Live slot (``host:port``) -> the czxid of its ``/workers`` node.

    The czxid identifies one registration: a worker that restarts (or whose session expired)
    registers a new node, so an observer polling now and then still notices that its slot
    was gone in between (see :class:`~stream_ops.nimbus.monitor.SlotTracker`).
    """
    registrations: dict[str, int] = {}
    for worker_id in store.children(ZkPaths.WORKERS):
        found = store.get_json(ZkPaths.worker(worker_id))
        if found is not None:
            record = WorkerRecord.model_validate(found[0])
            registrations[str(Slot(record.host, record.port))] = found[1].czxid
    return registrations


def spread_topology(
    store: ZkStore,
    topology_id: str,
    *,
    slots: Collection[str],
    clock: Callable[[], float] = time.time,
    retries: int = 10,
) -> tuple[AssignmentRecord, int] | None:
    """Spread an ACTIVE topology that uses fewer slots than it wants over free ``slots``.

    Storm's even scheduler, sticky: the slots the topology already uses keep the tasks that
    fit their share of an even split, only their surplus moves to the free slots among
    ``slots`` (:func:`~stream_ops.scheduler.spread`). The caller decides *when* (rate limit,
    slot stability: :func:`~stream_ops.scheduler.decide_spread`) and names the slots it judged
    stable; this function checks the rule again against what ZooKeeper holds now and writes
    the new assignment through :func:`reassign` (compare-and-set, a new assignment epoch),
    with every other live slot excluded. Moved tasks then change owners through the usual
    protocol: the old owner sees the new assignment and releases, the new one takes the task
    under a higher owner epoch.

    Args:
        store: Connected store.
        topology_id: The topology.
        slots: Live slots (``host:port``) the spread may use; the slots the topology already
            uses are always allowed. Slots no longer live are ignored.
        clock: Wall clock for the start times of moved tasks (see :func:`reassign`).
        retries: Compare-and-set attempts.

    Returns:
        The new assignment and its epoch, or None when there is nothing to spread (the
        topology is not ACTIVE, has tasks to place first, or already uses every slot it can).

    Raises:
        TopologyNotFoundError: The topology is not in ``/storms``.
        ConcurrentUpdateError: Other writers changed the assignment ``retries`` times.

    Example:
        >>> spread_topology(store, "wordcount-1-1700000000", slots=["h1:6701", "h2:6700"])  # doctest: +SKIP
        (AssignmentRecord(tasks={0: 'h1:6700', 1: 'h2:6700', ...}, ...), 3)
    """
    found = store.get_json(ZkPaths.storm(topology_id))
    if found is None:
        raise TopologyNotFoundError(f"topology {topology_id!r} does not exist; see 'stream-ops list'")
    storm = StormRecord.model_validate(found[0])
    if storm.status != "ACTIVE":
        return None
    current = read_assignment(store, topology_id)
    if current is None:
        return None
    task_ids = sorted(int(t) for t in store.children(ZkPaths.tasks(topology_id)))
    live = set(live_slot_registrations(store))
    used = {w for t, w in current[0].tasks.items() if t in set(task_ids)}
    allowed = sorted(({str(Slot.parse(s)) for s in slots} | used) & live)
    if not needs_spread(task_ids, current[0].tasks, [Slot.parse(s) for s in allowed], storm.workers):
        return None
    logger.info(
        "topology %s uses %d of the %d slots it wants; spreading it over %s", topology_id, len(used), storm.workers, allowed
    )
    return reassign(store, topology_id, clock=clock, retries=retries, exclude_slots=sorted(live - set(allowed)))


# --- a stopping worker's handover to its standbys ----------------------------------------


@dataclass(frozen=True)
class Handover:
    """A stopping worker's move of its tasks onto their standbys, planned from one assignment version.

    Attributes:
        topology_id: The topology.
        worker_id: The stopping worker (``host:port``).
        moves: Task -> the standby's worker that takes it.
        record: The assignment to write.
        version: The assignment version it was planned from; the write is refused unless the
            assignment still has it.
    """

    topology_id: str
    worker_id: str
    moves: dict[int, str]
    record: AssignmentRecord
    version: int


def handover_record(
    record: AssignmentRecord,
    worker_id: str,
    tasks: Collection[int],
    placed: Mapping[int, str],
    ready: Collection[tuple[int, str]],
    now: float,
) -> tuple[AssignmentRecord, dict[int, str]] | None:
    """The assignment with those of ``tasks`` that can go to a ready standby moved there (pure).

    A task moves when ``worker_id`` holds it, ``placed`` (the nimbus's placement once the
    worker is gone) sends it to one of its standbys, and that standby is ready. Following the
    nimbus's placement means the nimbus keeps the move when it reassigns the worker's other
    tasks, instead of moving the task a second time to even the split. A moved task's new
    owner leaves its standby list (a standby is never the owner) and gets ``now`` as its start
    time (a new launch grace); nothing else changes.

    Args:
        record: The current assignment.
        worker_id: The stopping worker.
        tasks: The tasks it owns.
        placed: Task -> slot (``host:port``) the sticky scheduler gives it without ``worker_id``.
        ready: (task, worker) pairs whose standby replica is live (its record exists and its
            worker is registered).
        now: Wall-clock time for the moved tasks' start times.

    Returns:
        The new record and the moves (task -> new worker), or None when no task can move.

    Example:
        >>> record = AssignmentRecord(
        ...     tasks={0: "h:1", 1: "h:1", 2: "h:1"}, start_times={0: 1.0, 1: 1.0, 2: 1.0}, standbys={1: ["h:2"], 2: ["h:2"]}
        ... )
        >>> placed = {0: "h:2", 1: "h:2", 2: "h:3"}  # the even split sends task 2 elsewhere
        >>> new, moves = handover_record(record, "h:1", [0, 1, 2], placed, {(1, "h:2"), (2, "h:2")}, now=5.0)
        >>> moves, new.tasks, new.standbys, new.start_times
        ({1: 'h:2'}, {0: 'h:1', 1: 'h:2', 2: 'h:1'}, {2: ['h:2']}, {0: 1.0, 1: 5.0, 2: 1.0})
    """
    moves: dict[int, str] = {}
    for task_id in sorted(tasks):
        target = placed.get(task_id)
        if (
            record.tasks.get(task_id) == worker_id
            and target is not None
            and target != worker_id
            and target in record.standbys.get(task_id, ())
            and (task_id, target) in ready
        ):
            moves[task_id] = target
    if not moves:
        return None
    standbys = {t: [w for w in sb if w != moves.get(t)] for t, sb in record.standbys.items()}
    new = record.model_copy(
        update={
            "tasks": {**record.tasks, **moves},
            "start_times": {**record.start_times, **dict.fromkeys(moves, now)},
            "standbys": {t: sb for t, sb in standbys.items() if sb},
        }
    )
    return new, moves


def plan_handover(
    store: ZkStore,
    topology_id: str,
    worker_id: str,
    tasks: Collection[int],
    *,
    clock: Callable[[], float] = time.time,
) -> Handover | None:
    """Read what a handover of ``tasks`` needs and plan it (see :func:`hand_over_to_standbys`).

    A standby is live when its ``/standbys/{id}/{task}@{worker}`` record exists (its worker
    keeps it, and has synced it at least once) and its worker's ``/workers`` node exists. The
    placement is the one :func:`reassign` makes once ``worker_id``'s slot is gone.

    Returns:
        The planned handover, or None when there is no assignment or no task can move.
    """
    current = read_assignment(store, topology_id)
    if current is None:
        return None
    record, version = current
    if not any(record.standbys.get(t) for t in tasks):
        return None
    found = store.get_json(ZkPaths.storm(topology_id))
    if found is None:
        return None
    storm = StormRecord.model_validate(found[0])
    live = {w for w in store.children(ZkPaths.WORKERS) if w != worker_id}
    standbys = [ZkPaths.parse_standby(name) for name in store.children(ZkPaths.standbys(topology_id))]
    ready = {entry for entry in standbys if entry is not None and entry[1] in live}
    if not ready:
        return None
    task_ids = sorted(int(t) for t in store.children(ZkPaths.tasks(topology_id)))
    slots = [Slot.parse(w) for w in live]
    placed = assign(
        task_ids,
        slots,
        storm.workers,
        previous={t: Slot.parse(w) for t, w in record.tasks.items()},
        preferred=record.standbys,
    )
    planned = handover_record(record, worker_id, tasks, {t: str(s) for t, s in placed.items()}, ready, clock())
    if planned is None:
        return None
    return Handover(topology_id, worker_id, planned[1], planned[0], version)


def commit_handover(store: ZkStore, handover: Handover) -> int | None:
    """Write a planned handover in one transaction, or nothing.

    The transaction checks that every receiving worker is still registered and sets the
    assignment at the version it was planned from. When the nimbus (or a Dagster rebalance)
    changed the assignment meanwhile, or a receiving worker left, it is rolled back and the
    assignment is left to the nimbus, which reassigns the stopping worker's tasks once it
    sees the worker go.

    Returns:
        The new assignment epoch, or None when the transaction was refused.
    """
    tx = store.transaction()
    for target in sorted(set(handover.moves.values())):
        tx.check(ZkPaths.worker(target), -1)  # -1: any version, i.e. the node exists
    tx.set_data(ZkPaths.assignment(handover.topology_id), encode_json(handover.record.to_json_obj()), version=handover.version)
    try:
        store.commit_transaction(tx)
    except TransactionFailedError as e:
        logger.info(
            "topology %s: worker %s did not hand %s over to their standbys (%s); the nimbus reassigns them",
            handover.topology_id,
            handover.worker_id,
            sorted(handover.moves),
            e,
        )
        return None
    epoch = handover.version + 1
    logger.info(
        "topology %s: worker %s handed its tasks over to their standbys at assignment epoch %d: %s",
        handover.topology_id,
        handover.worker_id,
        epoch,
        {t: f"{handover.worker_id} -> {w}" for t, w in sorted(handover.moves.items())},
    )
    return epoch


def hand_over_to_standbys(
    store: ZkStore,
    topology_id: str,
    worker_id: str,
    tasks: Collection[int],
    *,
    clock: Callable[[], float] = time.time,
) -> Handover | None:
    """Move the ``tasks`` a stopping worker owns onto their live standby replicas, without the nimbus.

    The one exception to the nimbus being the only writer of ``/assignments`` (DESIGN
    section 3): a worker that stops cleanly calls it before it stops its tasks, so each
    standby's worker, watching the assignment, waits on the task's ``/owners`` node and takes
    the task the moment the old owner releases it (under a higher owner epoch, as after any
    reassignment) instead of after the nimbus noticed the worker leave. Only tasks assigned to
    ``worker_id`` with a live standby on another registered worker move, and only where the
    nimbus's even split without ``worker_id`` places them on that standby too (so the nimbus
    keeps them there when it reassigns the rest); the write is a
    compare-and-set (:func:`commit_handover`), so a concurrent change by the nimbus wins and
    the nimbus then does what it always does. Tasks without a live standby stay assigned to
    the stopping worker until the nimbus reassigns them.

    Args:
        store: Connected store.
        topology_id: The topology.
        worker_id: The stopping worker (``host:port``).
        tasks: The tasks it owns (runs) now.
        clock: Wall clock for the moved tasks' start times (see :func:`reassign`).

    Returns:
        The handover written, or None when nothing moved (no live standby, or refused).

    Example:
        >>> hand_over_to_standbys(store, "wordcount-1-1700000000", "h1:6700", [2, 3])  # doctest: +SKIP
        Handover(topology_id='wordcount-1-1700000000', worker_id='h1:6700', moves={3: 'h2:6700'}, ...)
    """
    handover = plan_handover(store, topology_id, worker_id, tasks, clock=clock)
    if handover is None or commit_handover(store, handover) is None:
        return None
    return handover
