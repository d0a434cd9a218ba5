"""Wait until a topology runs: every task on a live worker, owned by it and heartbeating.

``stream-ops wait`` and ``stream-ops submit --wait`` call :func:`wait_until_running`, and a
script or a Dagster op can too. It reads what ``stream-ops status`` reads
(:func:`~stream_ops.nimbus.status.describe_topology`), with a
:class:`~stream_ops.nimbus.monitor.HeartbeatTracker` of its own, so heartbeats are judged by
the nimbus's rule (a heartbeat counts while it keeps changing, by this process's clock; a first
sighting is 0 s old), until every task is

1. assigned to a live worker (``/assignments/{id}`` names a worker registered in ``/workers``),
2. owned by that worker (its ``/owners/{id}/{task}`` node),
3. heartbeating (a beat of that owner, changed within ``heartbeat_timeout_s``),
4. and, when asked, has committed a batch (``/transactional/{id}/{task}``).

A submission before any worker registered leaves the tasks assigned to nobody, and only a
nimbus (``stream-ops nimbus``, or the one ``stream-ops dev`` runs), a rebalance or the Dagster
heartbeat sensor assigns them once workers come. So at the timeout the error names what is
missing and what to do: no live worker; tasks assigned to nobody alive, and whether a nimbus is
in its election; tasks not started by their worker; no heartbeat; no commit yet; the failing
tasks. It fails at once where waiting cannot help: the topology is deactivated or being killed,
or a task is quarantined by its worker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from stream_ops.coordination.cluster_state import find_topology_id
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import TopologyNotFoundError, TopologyNotRunningError
from stream_ops.nimbus.leader import current_leader
from stream_ops.nimbus.monitor import HeartbeatTracker
from stream_ops.nimbus.status import TaskStatus, TopologyStatus, describe_topology

logger = logging.getLogger(__name__)

_MAX_IDS = 12


@dataclass(frozen=True)
class Pending:
    """The tasks of a topology that do not run yet, by the first condition each misses."""

    unassigned: tuple[TaskStatus, ...] = ()
    """Assigned to no worker, or to one not registered in ``/workers``."""
    not_owned: tuple[TaskStatus, ...] = ()
    """Assigned to a live worker that does not own them (not started, or the old owner holds on)."""
    no_heartbeat: tuple[TaskStatus, ...] = ()
    """Owned, but their heartbeat is missing or did not change within the timeout."""
    not_committed: tuple[TaskStatus, ...] = ()
    """Running, but no batch committed yet (only when commits are waited for)."""

    @property
    def done(self) -> bool:
        """Whether every task runs."""
        return not (self.unassigned or self.not_owned or self.no_heartbeat or self.not_committed)

    def summary(self) -> str:
        """A few words for progress logs, e.g. ``4 tasks unassigned``."""
        parts = [
            f"{len(tasks)} {label}"
            for tasks, label in (
                (self.unassigned, "unassigned"),
                (self.not_owned, "not started"),
                (self.no_heartbeat, "without heartbeat"),
                (self.not_committed, "not committed yet"),
            )
            if tasks
        ]
        return ", ".join(parts) or "running"


def pending_tasks(status: TopologyStatus, *, heartbeat_timeout_s: float, committed: bool) -> Pending:
    """Which tasks of ``status`` do not run yet, and why (pure; see the module docstring)."""
    live = set(status.workers_live)
    unassigned, not_owned, no_heartbeat, not_committed = [], [], [], []
    for task in status.tasks:
        if task.assigned_to is None or task.assigned_to not in live:
            unassigned.append(task)
        elif task.owner != task.assigned_to:
            not_owned.append(task)
        elif not task.alive(heartbeat_timeout_s):
            no_heartbeat.append(task)
        elif committed and task.committed_txid < 0:
            not_committed.append(task)
    return Pending(tuple(unassigned), tuple(not_owned), tuple(no_heartbeat), tuple(not_committed))


def _tasks_text(tasks: Sequence[TaskStatus]) -> str:
    ids = [str(t.task_id) for t in tasks]
    shown = ", ".join(ids[:_MAX_IDS]) + (f" and {len(ids) - _MAX_IDS} more" if len(ids) > _MAX_IDS else "")
    return f"task {shown}" if len(ids) == 1 else f"tasks {shown}"


def explain(
    status: TopologyStatus, pending: Pending, *, name: str, nimbus_leader: str | None, heartbeat_timeout_s: float
) -> list[str]:
    """What is missing for ``status`` to run and what to do, one sentence each (pure).

    Args:
        status: The topology as read last.
        pending: :func:`pending_tasks` of it.
        name: The topology as the user named it (for the commands suggested).
        nimbus_leader: The nimbus leading its election, None when none runs.
        heartbeat_timeout_s: The heartbeat timeout of ``pending``.
    """
    lines: list[str] = []
    no_nimbus = (
        f"no nimbus is running to assign them (none in its election): start `stream-ops nimbus` (it keeps "
        f"reassigning as workers come and go), or assign them once with `stream-ops rebalance {name}`"
    )
    if not status.workers_live:
        lines.append(
            "no worker is registered (nothing in /workers): start one, e.g. `stream-ops worker --port 6700` "
            "(with --insecure on a ZooKeeper without credentials)"
        )
        if pending.unassigned and nimbus_leader is None:
            lines.append(f"and once one runs, {_tasks_text(pending.unassigned)} need assigning: {no_nimbus}")
    elif pending.unassigned:
        if nimbus_leader is None:
            lines.append(f"{_tasks_text(pending.unassigned)} are assigned to no live worker and {no_nimbus}")
        else:
            lines.append(
                f"{_tasks_text(pending.unassigned)} are assigned to no live worker yet; the nimbus ({nimbus_leader}) "
                "moves them when it judges their old worker dead (its --task-timeout) or a worker joins"
            )
    if pending.not_owned:
        workers = ", ".join(sorted({t.assigned_to or "?" for t in pending.not_owned}))
        lines.append(
            f"{_tasks_text(pending.not_owned)} are assigned to {workers} but not started there yet (Spark starting, "
            "state being rebuilt, the previous owner not gone yet, or the start failing): see `stream-ops status "
            f"{name}` and that worker's log"
        )
    if pending.no_heartbeat:
        lines.append(
            f"{_tasks_text(pending.no_heartbeat)} are owned but their heartbeat is missing or unchanged for more "
            f"than {heartbeat_timeout_s:g} s: is their worker stuck? see its log"
        )
    if pending.not_committed:
        lines.append(
            f"{_tasks_text(pending.not_committed)} have not committed a batch yet: they had no input yet, or their "
            "batches fail (see the worker's log)"
        )
    lines.extend(status.problems())
    return lines


def _hopeless(status: TopologyStatus, name: str) -> str | None:
    """Why waiting cannot make ``status`` run without an operator, None when it can."""
    if status.status == "INACTIVE":
        return f"topology {status.topology_id} is deactivated (INACTIVE): `stream-ops activate {name}` first"
    if status.status == "KILLED":
        return f"topology {status.topology_id} is being killed"
    stuck = [t for t in status.tasks if t.quarantined and t.last_error_worker == t.assigned_to]
    if stuck:
        return (
            f"{_tasks_text(stuck)} of {status.topology_id} are quarantined by their worker after repeated failures; "
            f"fix the cause, then `stream-ops clear-errors {name} TASK` for each: " + "; ".join(status.problems())
        )
    return None


def wait_until_running(
    store: ZkStore,
    topology: str,
    *,
    timeout_s: float,
    committed: bool = False,
    heartbeat_timeout_s: float = 10.0,
    poll_s: float = 0.25,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> TopologyStatus:
    """Wait until every task of ``topology`` runs (see the module docstring).

    Args:
        store: Connected store.
        topology: The topology's name or id.
        timeout_s: How long to wait.
        committed: Also wait until every task committed a batch.
        heartbeat_timeout_s: A heartbeat unchanged this long (by ``clock``) does not count.
        poll_s: Seconds between reads of the topology.
        clock: Monotonic clock of the wait and of the heartbeat ages.
        sleep: Sleeper between reads.

    Returns:
        The topology's status once it runs.

    Raises:
        TopologyNotFoundError: No running topology has that name or id.
        TopologyNotRunningError: Not running at the timeout, or it cannot without an operator;
            the message says what is missing and what to do.

    Example:
        >>> status = wait_until_running(store, "wordcount", timeout_s=60, committed=True)  # doctest: +SKIP
        >>> status.health()  # doctest: +SKIP
        'healthy'
    """
    topology_id = find_topology_id(store, topology)
    assert topology_id is not None  # find_topology_id raises for a missing one
    tracker = HeartbeatTracker()
    deadline = clock() + timeout_s
    said = ""
    while True:
        try:
            status = describe_topology(store, topology_id, clock=clock, tracker=tracker)
        except TopologyNotFoundError as e:
            raise TopologyNotRunningError(f"topology {topology_id} was killed while waiting for it to run") from e
        hopeless = _hopeless(status, topology)
        if hopeless is not None:
            raise TopologyNotRunningError(hopeless)
        pending = pending_tasks(status, heartbeat_timeout_s=heartbeat_timeout_s, committed=committed)
        if pending.done:
            logger.info("%s runs: %d tasks on %d workers", topology_id, len(status.tasks), len(status.workers_live))
            return status
        summary = pending.summary()
        if summary != said:
            logger.info("waiting for %s to run: %s", topology_id, summary)
            said = summary
        remaining = deadline - clock()
        if remaining <= 0:
            lines = explain(
                status,
                pending,
                name=topology,
                nimbus_leader=current_leader(store),
                heartbeat_timeout_s=heartbeat_timeout_s,
            )
            raise TopologyNotRunningError(
                f"topology {topology_id} is not running after {timeout_s:g} s ({summary}): " + "; ".join(lines)
            )
        sleep(min(poll_s, remaining))
