"""``storm rebalance``: quiesce a topology, spread its tasks over the current slots, resume.

Storm's rebalance moves the topology to REBALANCING for a wait (so in-flight work drains),
then frees all its slots and schedules it from scratch. Here:

1. ``/storms/{id}`` gets status REBALANCING, and the new number of ``workers`` wanted if one
   is given, in one compare-and-set. Workers only run tasks of ACTIVE topologies, so they
   stop this topology's tasks (releasing ownership); the heartbeat monitor leaves it alone.
2. After ``wait_s`` seconds, :func:`~stream_ops.nimbus.assignment.reassign` spreads the tasks
   evenly over the live slots, over at most ``workers`` of them. Unlike Storm, placements are
   sticky: the scheduler moves the fewest tasks an even split allows (each move costs a
   state replay).
3. The status goes back to what it was (ACTIVE, or INACTIVE for a deactivated topology, as in
   Storm); a topology killed meanwhile stays killed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import AssignmentRecord
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import (
    ConcurrentUpdateError,
    SchedulingError,
    StreamOpsError,
    TopologyNotFoundError,
    ZnodeNotFoundError,
)
from stream_ops.nimbus.assignment import reassign
from stream_ops.nimbus.submission import find_topology_id

__all__ = ["rebalance"]

logger = logging.getLogger(__name__)


def rebalance(
    store: ZkStore,
    name_or_id: str,
    *,
    workers: int | None = None,
    wait_s: float = 0.0,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[AssignmentRecord, int]:
    """Rebalance a topology over the current live slots, moving as few tasks as possible.

    Args:
        store: Connected store.
        name_or_id: Topology name or id.
        workers: New number of workers wanted (stored in ``/storms``); default: unchanged.
        wait_s: Seconds to stay REBALANCING before reassigning (Storm's ``-w``), so that
            workers stop the topology's tasks and in-flight batches finish.
        sleep: Sleeper for the wait (injectable for tests).

    Returns:
        The new assignment and its epoch (unchanged epoch if nothing had to move).

    Raises:
        SchedulingError: ``workers < 1`` or ``wait_s < 0``.
        TopologyNotFoundError: No live topology of that name, or it was killed meanwhile.

    Example:
        >>> record, epoch = rebalance(store, "wordcount", workers=3, wait_s=5)  # doctest: +SKIP
        >>> sorted(set(record.tasks.values()))  # doctest: +SKIP
        ['h1:6700', 'h1:6701', 'h2:6700']
    """
    if workers is not None and workers < 1:
        raise SchedulingError(f"workers must be at least 1, got {workers}")
    if wait_s < 0:
        raise SchedulingError(f"wait_s must not be negative, got {wait_s}")
    topology_id = find_topology_id(store, name_or_id)
    assert topology_id is not None
    path = ZkPaths.storm(topology_id)
    before: dict[str, Any] = {}

    def begin(data: Any) -> Any:
        if data.get("status") == "KILLED":
            raise TopologyNotFoundError(f"topology {topology_id} was killed; nothing to rebalance")
        before["status"] = data.get("status")
        before["workers"] = data.get("workers")
        changed = {**data, "status": "REBALANCING"}
        if workers is not None:
            changed["workers"] = workers
        return changed

    try:
        store.update_json(path, begin)
    except ZnodeNotFoundError as e:
        raise TopologyNotFoundError(f"topology {topology_id} was removed; nothing to rebalance") from e
    resume = "INACTIVE" if before["status"] == "INACTIVE" else "ACTIVE"
    logger.info(
        "topology %s is REBALANCING (workers %s -> %s, wait %.1f s)",
        topology_id,
        before["workers"],
        workers if workers is not None else before["workers"],
        wait_s,
    )
    try:
        if wait_s > 0:
            sleep(wait_s)
        result = reassign(store, topology_id)
    except BaseException:
        try:
            _finish(store, topology_id, resume)
        except StreamOpsError as e:
            logger.warning("topology %s: could not leave REBALANCING after a failure: %s", topology_id, e)
        raise
    _finish(store, topology_id, resume)
    record, epoch = result
    logger.info(
        "topology %s rebalanced at epoch %d over %d slots; now %s",
        topology_id,
        epoch,
        len(set(record.tasks.values())),
        resume,
    )
    return result


def _finish(store: ZkStore, topology_id: str, resume: str, *, retries: int = 20) -> None:
    """Set the status back to ``resume`` if it is still REBALANCING (compare-and-set).

    Raises:
        TopologyNotFoundError: The topology was killed (or removed) during the rebalance.
        ConcurrentUpdateError: Other writers changed ``/storms/{id}`` every time.
    """
    path = ZkPaths.storm(topology_id)
    for _ in range(retries):
        found = store.get_json(path)
        if found is None:
            raise TopologyNotFoundError(f"topology {topology_id} was removed during the rebalance")
        data, stat = found
        status = data.get("status")
        if status == "KILLED":
            raise TopologyNotFoundError(f"topology {topology_id} was killed during the rebalance")
        if status != "REBALANCING":
            logger.info("topology %s became %s during the rebalance; left as it is", topology_id, status)
            return
        try:
            store.set_json(path, {**data, "status": resume}, version=stat.version)
            return
        except ConcurrentUpdateError:
            continue  # another verb or rebalance changed it meanwhile: look again
        except ZnodeNotFoundError as e:
            raise TopologyNotFoundError(f"topology {topology_id} was removed during the rebalance") from e
    raise ConcurrentUpdateError(f"could not set {topology_id} back to {resume}: /storms kept changing; run 'stream-ops activate'")
