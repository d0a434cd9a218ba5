"""Compute and store a topology's assignment from the live worker slots (Nimbus's job).

The readers :func:`live_workers` and :func:`read_assignment` live in
:mod:`stream_ops.coordination.cluster_state` (workers read them too) and are re-exported here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection

from stream_ops.coordination.cluster_state import live_workers, read_assignment
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import AssignmentRecord, StormRecord
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import ConcurrentUpdateError, TopologyNotFoundError, ZnodeExistsError
from stream_ops.scheduler import Slot, assign

__all__ = ["live_workers", "read_assignment", "reassign"]

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
        if slots:
            placed = assign(
                task_ids,
                slots,
                wanted,
                previous={t: Slot.parse(w) for t, w in previous.tasks.items()},
            )
            tasks = {t: str(slot) for t, slot in placed.items()}
        else:
            logger.warning("topology %s: no live worker; its %d tasks wait unassigned", topology_id, len(task_ids))
            tasks = {}
        now = clock()
        start_times = {t: previous.start_times.get(t, now) if previous.tasks.get(t) == w else now for t, w in tasks.items()}
        record = AssignmentRecord(tasks=tasks, start_times=start_times)
        if current is not None and record.tasks == previous.tasks:
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
        logger.info("topology %s: assignment epoch %d, %d tasks placed, moved %s", topology_id, version, len(tasks), moved)
        return record, version
    raise ConcurrentUpdateError(f"assignment of {topology_id} kept changing under us; retry the rebalance")
