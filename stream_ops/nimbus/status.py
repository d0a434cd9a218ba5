"""What a topology is doing right now: tasks, owners, heartbeat ages, committed txids, errors.

Used by ``stream-ops status`` and by the Dagster heartbeat sensor, so both report the same.
A task that failed to start or whose query failed carries its last error and whether its
worker quarantined it (from ``/errors/{id}/{task}``, see :mod:`stream_ops.runtime.task_failures`).

Heartbeat ages (``TopologyStatus.heartbeat_age_basis`` says which one a status carries):

* ``observed`` (given a :class:`~stream_ops.nimbus.monitor.HeartbeatTracker`): seconds since
  the *observer* saw the heartbeat znode change, by the observer's own clock. The nimbus
  monitor's rule: clock skew between hosts does not matter. The Dagster heartbeat sensor keeps
  its tracker in its cursor; the on-demand checks rebuild one from the sensor's observations.
  A heartbeat seen for the first time is 0 s old (the observer knows nothing earlier).
* ``worker_clock`` (no tracker, e.g. a one-shot ``stream-ops status``): the reader's wall
  clock minus the ``time`` the worker wrote into the heartbeat. Right only while the two
  clocks agree.

Either way a heartbeat counts only if written by the task's owner (or, with no owner, its
assigned worker); another worker's leftover beat is no heartbeat.

Reads are batched: :func:`read_topologies` reads everything about any number of topologies in
two rounds of pipelined multiRead requests (:meth:`~stream_ops.coordination.store.ZkStore.get_many`;
about 4 znodes per task), and :meth:`TopologyReads.describe` then builds each topology's status
without I/O. :func:`describe_topology` does both for one topology. (One synchronous read per
znode took ~1.6 s for 1,000 tasks; the heartbeat sensor's tick now takes ~0.1 s, see
``bench/sensor.py``.)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from stream_ops.coordination.paths import ZkPaths

# read_task_error's rule for a stored error record (an unreadable one counts as empty).
from stream_ops.coordination.records import (
    AssignmentRecord,
    ErrorRecord,
    HeartbeatRecord,
    OwnerRecord,
    StandbyRecord,
    StormRecord,
    TaskRecord,
    TransactionalRecord,
    WorkerRecord,
    parse_error_record,
)
from stream_ops.coordination.store import DEFAULT_BATCH_CONCURRENCY, ZkStore, ZnodeStat, decode_json
from stream_ops.errors import TopologyNotFoundError
from stream_ops.nimbus.monitor import HeartbeatTracker, heartbeat_fingerprint

Health = Literal["healthy", "degraded", "down", "inactive"]
HeartbeatAgeBasis = Literal["observed", "worker_clock"]

#: Heartbeat ages are seconds since the observer saw the heartbeat change (its own clock).
AGE_OBSERVED: HeartbeatAgeBasis = "observed"
#: Heartbeat ages are the reader's clock minus the time the worker wrote (clocks must agree).
AGE_WORKER_CLOCK: HeartbeatAgeBasis = "worker_clock"

#: What the key counts are, for reports under a ``~KEYS`` column.
STATE_KEYS_NOTE = (
    "~KEYS: RocksDB's estimate of the keys in each task's local store; overwritten and deleted keys "
    "count until it compacts them, so it can exceed the real number"
)

#: One line per basis, for reports (observations, checks, the CLI).
AGE_BASIS_TEXT: Mapping[str, str] = {
    AGE_OBSERVED: "seconds since the observer saw the heartbeat change, by its own clock",
    AGE_WORKER_CLOCK: "reader's clock minus the time the worker wrote (assumes synchronised clocks)",
}


@dataclass(frozen=True)
class StandbyStatus:
    """One standby replica of a stateful task (see :mod:`stream_ops.runtime.standby`)."""

    worker_id: str
    applied_txid: int | None
    """The committed txid its store has applied (None: it has not reported yet)."""
    lag_txids: int | None
    """Committed txids it has not applied yet (None: not reported yet)."""
    keys: int = 0


@dataclass(frozen=True)
class TaskStatus:
    """One task as seen in ZooKeeper."""

    task_id: int
    stage: int
    stage_name: str
    queue: int
    assigned_to: str | None
    owner: str | None
    owner_epoch: int | None
    heartbeat_age_s: float | None
    """Heartbeat age in seconds (see ``TopologyStatus.heartbeat_age_basis``); None: no heartbeat."""
    committed_txid: int
    txid_in_flight: int | None
    rows_per_s: float
    rows_out_per_s: float
    lag_files: int
    state_keys: int
    """RocksDB's *estimate* of the keys in the task's local store (``rocksdb.estimate-num-keys``):
    overwritten and deleted keys count until a compaction merges them (see :data:`STATE_KEYS_NOTE`)."""
    dead_letters: int
    lag_records: int | None = None
    """Input records not read yet (None where the source cannot count them)."""
    failures: int = 0
    """Consecutive failures of the task on its worker (0 once it ran long enough to be healthy)."""
    last_error: str | None = None
    """The most recent failure's reason (kept after a recovery, as history)."""
    last_error_at: float | None = None
    last_error_worker: str | None = None
    quarantined: bool = False
    """Its worker stopped trying it; delete ``/errors/{id}/{task}`` (or resubmit) to try again."""
    heartbeat_fingerprint: int | None = None
    """The heartbeat znode's mzxid (changes with every beat); None: no heartbeat that counts."""
    standbys: tuple[StandbyStatus, ...] = ()
    """The task's standby replicas, as the assignment names them, with how far each is behind."""
    committed_offsets: tuple[Any, ...] = ()
    """The source offsets recorded with the committed txid (``TransactionalRecord.offsets``; a
    Kafka source task: ``({"<topic>": {"<partition>": <end offset>}},)``); empty before the first."""

    @property
    def has_lag(self) -> bool:
        """Whether the task has input it has not read (records or files)."""
        return (self.lag_records or 0) > 0 or self.lag_files > 0

    @property
    def failing(self) -> bool:
        """Whether the task's last tries failed (backing off or quarantined)."""
        return self.failures > 0 or self.quarantined

    def alive(self, timeout_s: float) -> bool:
        """Owned, and its heartbeat is younger than ``timeout_s``."""
        return self.owner is not None and self.heartbeat_age_s is not None and self.heartbeat_age_s <= timeout_s


@dataclass(frozen=True)
class TopologyStatus:
    """A topology and all its tasks."""

    topology_id: str
    name: str
    status: str
    workers_wanted: int
    workers_live: list[str]
    assignment_epoch: int | None
    tasks: list[TaskStatus] = field(default_factory=list)
    heartbeat_age_basis: HeartbeatAgeBasis = AGE_WORKER_CLOCK
    """How ``TaskStatus.heartbeat_age_s`` was measured (see the module docstring)."""

    def health(self, timeout_s: float = 10.0) -> Health:
        """healthy: every task alive; down: none alive; degraded: some."""
        if self.status != "ACTIVE":
            return "inactive"
        alive = sum(t.alive(timeout_s) for t in self.tasks)
        if self.tasks and alive == len(self.tasks):
            return "healthy"
        return "down" if alive == 0 else "degraded"

    def problems(self) -> list[str]:
        """One line per failing task, e.g. for ``stream-ops status`` (empty when none fails).

        Example:
            >>> status.problems()  # doctest: +SKIP
            ['task 4 (word_counts) quarantined after 5 failures on 127.0.0.1:6700: OperationalError: ...']
        """
        lines = []
        for t in self.tasks:
            if not t.failing:
                continue
            state = f"quarantined after {t.failures} failures" if t.quarantined else f"failing ({t.failures} in a row)"
            lines.append(f"task {t.task_id} ({t.stage_name}) {state} on {t.last_error_worker or '?'}: {t.last_error}")
        return lines

    def to_json_obj(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """The status as JSON values, with ``health``; each task's ``state_keys`` is also given as
        ``state_keys_estimate``, the name that says what it is (``state_keys`` stays for readers
        of earlier releases)."""
        data = asdict(self)
        data["health"] = self.health(timeout_s)
        for task in data["tasks"]:
            task["state_keys_estimate"] = task["state_keys"]
        return data


def standbys_text(task: TaskStatus) -> str:
    """``worker (lag N)`` per standby of ``task``, comma-separated (``?`` before it reported)."""
    return ", ".join(f"{s.worker_id} (lag {'?' if s.lag_txids is None else s.lag_txids})" for s in task.standbys)


def read_heartbeat(data: Any | None, mzxid: int, worker: str | None) -> tuple[HeartbeatRecord | None, int | None]:
    """A heartbeat znode's record and fingerprint, if it counts for ``worker`` (pure).

    Args:
        data: The znode's JSON value, None when there is no node.
        mzxid: The node's mzxid.
        worker: The task's owner (or assigned worker); None: any writer counts.

    Returns:
        ``(record, fingerprint)``, or ``(None, None)`` when there is no heartbeat that counts.

    Raises:
        pydantic.ValidationError: The node holds no heartbeat record.
    """
    if data is None:
        return None, None
    fingerprint = heartbeat_fingerprint(data, mzxid, worker)
    if fingerprint is None:
        return None, None
    return HeartbeatRecord.model_validate(data), fingerprint


def heartbeat_age(
    record: HeartbeatRecord | None,
    fingerprint: int | None,
    topology_id: str,
    task_id: int,
    now: float,
    tracker: HeartbeatTracker | None,
) -> float | None:
    """A heartbeat's age by the rule of the module docstring (pure; feeds ``tracker``).

    With a tracker: the heartbeat is observed at ``now`` and its age is the time since the
    tracker saw it change. Without: ``now`` minus the time the worker wrote.

    Example:
        >>> t = HeartbeatTracker()
        >>> beat = HeartbeatRecord(worker_id="h:1", time=5000.0, epoch=1)  # a clock far ahead
        >>> heartbeat_age(beat, 7, "t", 0, now=100.0, tracker=t), heartbeat_age(beat, 7, "t", 0, now=112.0, tracker=t)
        (0.0, 12.0)
    """
    if tracker is not None:
        tracker.observe(topology_id, task_id, fingerprint, now)
        age = tracker.heartbeat_age(topology_id, task_id, now) if fingerprint is not None else None
        return None if age is None else round(age, 3)
    return round(max(0.0, now - record.time), 3) if record is not None else None


def task_status(
    task_id: int,
    task: TaskRecord,
    *,
    assigned_to: str | None,
    owner: OwnerRecord | None,
    tx: TransactionalRecord,
    heartbeat: HeartbeatRecord | None,
    fingerprint: int | None,
    heartbeat_age_s: float | None,
    error: ErrorRecord | None,
    standbys: tuple[StandbyStatus, ...] = (),
) -> TaskStatus:
    """One task's status from its records (pure: no reads)."""
    last = error.last if error else None
    return TaskStatus(
        task_id=task_id,
        stage=task.stage,
        stage_name=task.stage_name,
        queue=task.queue,
        assigned_to=assigned_to,
        owner=owner.worker_id if owner else None,
        owner_epoch=owner.epoch if owner else None,
        heartbeat_age_s=heartbeat_age_s,
        committed_txid=tx.committed_txid,
        txid_in_flight=heartbeat.txid_in_flight if heartbeat else None,
        rows_per_s=heartbeat.rows_per_s if heartbeat else 0.0,
        rows_out_per_s=heartbeat.rows_out_per_s if heartbeat else 0.0,
        lag_files=heartbeat.lag_files if heartbeat else 0,
        lag_records=heartbeat.lag_records if heartbeat else None,
        state_keys=heartbeat.state_keys if heartbeat else 0,
        dead_letters=heartbeat.dead_letters if heartbeat else 0,
        failures=error.consecutive_failures if error else 0,
        last_error=last.reason if last else None,
        last_error_at=last.time if last else None,
        last_error_worker=last.worker_id if last else None,
        quarantined=error.quarantined if error else False,
        heartbeat_fingerprint=fingerprint,
        standbys=standbys,
        committed_offsets=tuple(tx.offsets),
    )


class TopologyReads:
    """The znodes of some topologies, read at once by :func:`read_topologies` (no I/O after).

    :meth:`describe` turns one topology's znodes into its :class:`TopologyStatus`, with exactly
    the rules of :func:`describe_topology`, and raises what it would raise for that topology
    only: one topology with an unreadable record does not spoil the others.
    """

    def __init__(
        self,
        topology_ids: Collection[str],
        children: Mapping[str, list[str] | None],
        nodes: Mapping[str, tuple[bytes | None, ZnodeStat] | None],
    ) -> None:
        self._topology_ids = tuple(dict.fromkeys(topology_ids))
        self._children = children
        self._nodes = nodes

    @property
    def topology_ids(self) -> tuple[str, ...]:
        """The topologies read (a missing one is read too: :meth:`describe` raises for it)."""
        return self._topology_ids

    def _json(self, path: str) -> tuple[Any, ZnodeStat] | None:
        """``(value, stat)`` of a znode read, as :meth:`ZkStore.get_json` returns it."""
        node = self._nodes.get(path)
        return None if node is None else (decode_json(node[0], path), node[1])

    def _value(self, path: str) -> Any | None:
        found = self._json(path)
        return None if found is None else found[0]

    def _standby(self, topology_id: str, task_id: int, worker: str, committed_txid: int) -> StandbyStatus:
        found = self._value(ZkPaths.standby(topology_id, task_id, worker))
        if found is None:
            return StandbyStatus(worker_id=worker, applied_txid=None, lag_txids=None)
        record = StandbyRecord.model_validate(found)
        lag = max(0, committed_txid - record.applied_txid)
        return StandbyStatus(worker_id=worker, applied_txid=record.applied_txid, lag_txids=lag, keys=record.keys)

    def describe(
        self,
        topology_id: str,
        *,
        clock: Callable[[], float] = time.time,
        tracker: HeartbeatTracker | None = None,
    ) -> TopologyStatus:
        """One topology's status from the znodes read (see :func:`describe_topology` for the args).

        ``clock`` is called once, now (after the reads).

        Raises:
            TopologyNotFoundError: The topology did not exist (or was not among those read).
            ValueError: A znode holds no valid record (pydantic's ValidationError).
            CoordinationError: A znode holds no JSON.
        """
        # The reads and checks of read_storm, read_assignment, live_workers and read_task_errors.
        found = self._json(ZkPaths.storm(topology_id))
        if found is None:
            raise TopologyNotFoundError(f"topology {topology_id!r} does not exist")
        storm = StormRecord.model_validate(found[0])
        found = self._json(ZkPaths.assignment(topology_id))
        assignment = (AssignmentRecord.model_validate(found[0]), found[1].version) if found is not None else None
        assigned = assignment[0].tasks if assignment else {}
        workers: dict[str, WorkerRecord] = {}
        for worker_id in self._children.get(ZkPaths.WORKERS) or []:
            found = self._json(ZkPaths.worker(worker_id))
            if found is not None:
                workers[worker_id] = WorkerRecord.model_validate(found[0])
        errors: dict[int, ErrorRecord] = {}
        for name in self._children.get(ZkPaths.errors(topology_id)) or []:
            if name.isdigit():
                path = ZkPaths.task_errors(topology_id, int(name))
                found = self._json(path)
                if found is not None:
                    errors[int(name)] = parse_error_record(path, found[0])
        now = clock()
        tasks: list[TaskStatus] = []
        for name in sorted(self._children.get(ZkPaths.tasks(topology_id)) or [], key=int):
            task_id = int(name)
            task_data = self._value(ZkPaths.task(topology_id, task_id))
            if task_data is None:
                continue
            task = TaskRecord.model_validate(task_data)
            owner_data = self._value(ZkPaths.owner(topology_id, task_id))
            owner = OwnerRecord.model_validate(owner_data) if owner_data else None
            tx_data = self._value(ZkPaths.transactional_task(topology_id, task_id))
            tx = TransactionalRecord.model_validate(tx_data) if tx_data else TransactionalRecord()
            beat = self._json(ZkPaths.heartbeat(topology_id, task_id))
            counts_for = owner.worker_id if owner else assigned.get(task_id)
            hb, fingerprint = (None, None) if beat is None else read_heartbeat(beat[0], beat[1].mzxid, counts_for)
            standbys = tuple(
                self._standby(topology_id, task_id, worker, tx.committed_txid)
                for worker in (assignment[0].standbys.get(task_id, []) if assignment else [])
            )
            tasks.append(
                task_status(
                    task_id,
                    task,
                    assigned_to=assigned.get(task_id),
                    owner=owner,
                    tx=tx,
                    heartbeat=hb,
                    fingerprint=fingerprint,
                    heartbeat_age_s=heartbeat_age(hb, fingerprint, topology_id, task_id, now, tracker),
                    error=errors.get(task_id),
                    standbys=standbys,
                )
            )
        return TopologyStatus(
            topology_id=topology_id,
            name=storm.name,
            status=storm.status,
            workers_wanted=storm.workers,
            workers_live=sorted(workers),
            assignment_epoch=assignment[1] if assignment else None,
            tasks=tasks,
            heartbeat_age_basis=AGE_OBSERVED if tracker is not None else AGE_WORKER_CLOCK,
        )


def read_topologies(
    store: ZkStore,
    topology_ids: Collection[str],
    *,
    concurrency: int = DEFAULT_BATCH_CONCURRENCY,
) -> TopologyReads:
    """Read every znode :func:`describe_topology` needs for many topologies, in two batched rounds.

    Round 1 lists the tasks and errors of every topology and the live workers; round 2 reads
    every storm record, assignment, worker record, and every task's record, owner, committed
    txid, heartbeat and error record, all at once (:meth:`ZkStore.get_many`, at most
    ``concurrency`` requests in flight). Nothing is decoded or validated here: do that per
    topology with :meth:`TopologyReads.describe`.

    Args:
        store: Connected store.
        topology_ids: The topologies (missing ones are fine: ``describe`` raises for them).
        concurrency: Most ZooKeeper requests in flight at once.

    Raises:
        ZooKeeperUnavailableError: ZooKeeper did not answer in time (nothing is returned).
        CoordinationError: ZooKeeper refused a read.

    Example:
        >>> reads = read_topologies(store, ids)  # doctest: +SKIP
        >>> statuses = {tid: reads.describe(tid) for tid in ids}  # doctest: +SKIP
    """
    ids = list(dict.fromkeys(topology_ids))
    lists = [ZkPaths.WORKERS]
    for topology_id in ids:
        lists += [ZkPaths.tasks(topology_id), ZkPaths.errors(topology_id), ZkPaths.standbys(topology_id)]
    children = store.children_many(lists, concurrency=concurrency)
    paths = [ZkPaths.worker(w) for w in children[ZkPaths.WORKERS] or []]
    for topology_id in ids:
        paths += [ZkPaths.storm(topology_id), ZkPaths.assignment(topology_id)]
        for name in children[ZkPaths.tasks(topology_id)] or []:
            if name.isdigit():
                task_id = int(name)
                paths += [
                    ZkPaths.task(topology_id, task_id),
                    ZkPaths.owner(topology_id, task_id),
                    ZkPaths.transactional_task(topology_id, task_id),
                    ZkPaths.heartbeat(topology_id, task_id),
                ]
        paths += [ZkPaths.task_errors(topology_id, int(n)) for n in children[ZkPaths.errors(topology_id)] or [] if n.isdigit()]
        paths += [f"{ZkPaths.standbys(topology_id)}/{n}" for n in children[ZkPaths.standbys(topology_id)] or []]
    return TopologyReads(ids, children, store.get_many(paths, concurrency=concurrency))


def describe_topology(
    store: ZkStore,
    topology_id: str,
    *,
    clock: Callable[[], float] = time.time,
    tracker: HeartbeatTracker | None = None,
) -> TopologyStatus:
    """Read everything ZooKeeper knows about one topology.

    The znodes are read in two batched rounds (:func:`read_topologies`); to describe many
    topologies, read them together with :func:`read_topologies` and call
    :meth:`TopologyReads.describe` for each.

    Args:
        store: Connected store.
        topology_id: The topology.
        clock: The reader's clock. With ``tracker`` it is the tracker's clock (any time base,
            used consistently); without, unix time compared with the workers' timestamps.
        tracker: The observer's heartbeat tracker: every task's heartbeat is fed to it, and
            ages are "seconds since the observer saw it change" (``heartbeat_age_basis``
            ``observed``). Without one, ages are by the worker's clock (``worker_clock``).

    Raises:
        TopologyNotFoundError: The topology does not exist.
    """
    return read_topologies(store, [topology_id]).describe(topology_id, clock=clock, tracker=tracker)


def lost_tasks_now(
    store: ZkStore,
    topology_id: str,
    lost: Collection[int],
    *,
    seen: Mapping[int, int | None],
    timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    poll_s: float = 0.5,
) -> list[TaskStatus]:
    """Which of the tasks an observer reported lost are still lost, by the tracker's rule.

    No clock written by a worker is read. A task is alive again when it is owned and its
    heartbeat changed since the observer saw it (``seen``: task -> fingerprint the observer
    last saw, None for no heartbeat). For a task the observer gave no fingerprint for (a
    rebalance started by hand with ``lost_tasks`` only), this call watches the heartbeat itself
    for up to ``timeout_s`` by ``clock``: a task whose heartbeat changes meanwhile is alive.

    Args:
        store: Connected store.
        topology_id: The topology.
        lost: Task ids reported lost.
        seen: Task -> the heartbeat fingerprint the observer saw when it judged it lost.
        timeout_s: How long to watch tasks without a fingerprint in ``seen``.
        clock: Monotonic clock of the watch.
        sleep: Sleeper between polls.
        poll_s: Seconds between polls.

    Returns:
        The tasks of ``lost`` still lost, as read last.

    Example:
        >>> [t.task_id for t in lost_tasks_now(store, topology_id, [0, 3], seen={0: None, 3: 7711}, timeout_s=10)]  # doctest: +SKIP
        [3]
    """
    wanted = set(lost)
    unknown = wanted - set(seen)
    baseline: dict[int, int | None] = {t: seen[t] for t in wanted & set(seen)}
    deadline = clock() + timeout_s
    first = True
    while True:
        tasks = [t for t in describe_topology(store, topology_id).tasks if t.task_id in wanted]
        for t in tasks:
            if first and t.task_id in unknown:
                baseline[t.task_id] = t.heartbeat_fingerprint
        first = False
        still = [t for t in tasks if not _beat_since(t, baseline.get(t.task_id))]
        watching = [t for t in still if t.task_id in unknown]
        if not watching or clock() >= deadline:
            return still
        sleep(min(poll_s, max(0.0, deadline - clock())))


def _beat_since(task: TaskStatus, fingerprint: int | None) -> bool:
    """Owned, with a heartbeat other than ``fingerprint`` (it beat since then)."""
    return task.owner is not None and task.heartbeat_fingerprint is not None and task.heartbeat_fingerprint != fingerprint
