"""The heartbeat sensor, and the run-failure sensor that relaunches worker runs.

Heartbeat sensor. Each tick opens one ZooKeeper session through the ``zookeeper`` resource,
finds the live submission of each configured topology name, reads each topology's status
(:func:`~stream_ops.nimbus.status.describe_topology`'s, read for up to 16 topologies at a time
with :func:`~stream_ops.nimbus.status.read_topologies`: batched multiRead requests, not one
read per znode; ~0.1 s per tick at 1,000 tasks, ~1 s at 10,000, ``bench/sensor.py``) and records

* one :class:`dagster.AssetObservation` per stage (:func:`observe_topology`), and
* the ``heartbeat_freshness`` and ``txid_progress`` check evaluations of every stage
  (:mod:`stream_ops.orchestration.checks`), as ``AssetCheckEvaluation`` asset events, and
* a materialization of each Parquet sink whose tasks committed new files since its last one
  (:mod:`stream_ops.orchestration.sinks`), and
* with ``report_health``, a materialization of each topology's health asset (one-word health,
  tasks table, numeric totals) and its ``topology_health`` check evaluation
  (:mod:`stream_ops.orchestration.health`), and
* for each Kafka topic an observed topology reads, one merged observation of its source asset
  with the consumer lag per partition and its ``consumer_lag`` check evaluation
  (:mod:`stream_ops.orchestration.consumer_lag`). The end offsets come from the brokers through
  the sensor's :class:`~stream_ops.kafka.offsets.EndOffsets` (one client per
  bootstrap, kept across ticks, each read bounded by ``kafka_timeout_s``); a broker that does
  not answer is reported in the observation and the check, never fails the tick. A code
  location without Kafka sources does none of this.

Its targets include the job observing the stream assets (``observe_job``), so Dagster lists
the sensor under each stream asset's "Automation details"; the sensor never requests that job.

It also requests runs:

* a **rebalance** run when tasks of an ACTIVE topology are lost (no fresh heartbeat, or not
  assigned) and the current assignment epoch has been in place for ``launch_grace_s`` (so a
  fresh assignment gets time to start). Its run key names the topology, the lost tasks, the
  epoch and the number of live slots (``rebalance-<id>-tasks-1-3-epoch-<n>-slots-<k>``), so
  Dagster requests each loss once, and again only when the assignment or the slots changed.
* **worker** runs when fewer workers are live than the ACTIVE topologies want (the largest
  ``workers`` wanted), minus worker runs already queued or starting.
* a **spread** (a rebalance run with ``spread_slots``) when an ACTIVE topology with nothing
  lost uses fewer slots than it wants while free slots have been live for the stability
  period, at most once per interval (:class:`~stream_ops.config.SpreadPolicy`, the nimbus
  monitor's rule: :func:`~stream_ops.scheduler.decide_spread`; the op calls
  :func:`~stream_ops.nimbus.assignment.spread_topology` as the monitor does). Run key
  ``spread-<id>-epoch-<n>-slots-<k>``.

Liveness is the nimbus monitor's rule: a heartbeat's age is the time since *this sensor* saw
its znode change, by the sensor's own clock, never the time the worker wrote into it (so a
worker with a skewed clock is judged as the nimbus judges it). The
:class:`~stream_ops.nimbus.monitor.HeartbeatTracker` doing that lives in the cursor between
ticks; on the first tick after a (re)submission or a cursor reset every heartbeat seen is
fresh (as after a nimbus restart).

The cursor (:class:`HeartbeatCursor`) remembers per topology the committed txids (progress
between ticks), when each txid last advanced, lost tasks, the assignment epoch, the heartbeat
tracker's state and the last spread; and since when each worker slot has been live.

A tick is bounded in wall-clock time: once ``tick_budget_s`` has passed, the remaining
topologies are left for the next tick, which starts with the least recently observed ones.

Run-failure sensor. :func:`build_worker_relaunch_sensor` watches the worker job only and
requests a new worker run (same configuration) for each failed one, up to ``max_relaunches``
in a row. A terminated (canceled) worker run is not a failure and is not relaunched.

Note: this module does not use ``from __future__ import annotations`` because Dagster reads
the resource parameters' annotations of the decorated function at definition time.
"""

import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

import dagster as dg

from stream_ops.config import SpreadPolicy
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import StormRecord, WorkerRecord
from stream_ops.coordination.store import ZkStore, decode_json
from stream_ops.errors import ConfigError, CoordinationError, StreamOpsError, TopologyNotFoundError
from stream_ops.kafka.offsets import EndOffsets
from stream_ops.nimbus.assignment import live_slot_registrations, live_workers
from stream_ops.nimbus.monitor import HeartbeatTracker, SlotTracker
from stream_ops.nimbus.status import TopologyReads, TopologyStatus, describe_topology, read_topologies
from stream_ops.nimbus.submission import find_topology_id, read_storm
from stream_ops.orchestration.checks import evaluate_topology_checks
from stream_ops.orchestration.consumer_lag import KafkaSourceWatch, TopologyLag, consumer_lag_events
from stream_ops.orchestration.cursor import HeartbeatCursor, TopologyCursor
from stream_ops.orchestration.health import absent_health_events, health_events
from stream_ops.orchestration.kafka_offsets import TickOffsets, read_topology_lags
from stream_ops.orchestration.observations import observe_absent_topology, observe_topology
from stream_ops.orchestration.resources import ZooKeeperResource
from stream_ops.orchestration.run_config import ROLE_TAG, TOPOLOGY_TAG, rebalance_run_config
from stream_ops.orchestration.sinks import ParquetSinkWatch, latest_sink_txids, observe_parquet_sinks
from stream_ops.orchestration.stream_observer import ObserveJob
from stream_ops.orchestration.translator import StreamOpsTranslator
from stream_ops.scheduler import Slot, decide_spread, needs_spread

__all__ = [
    "DEFAULT_HEARTBEAT_SENSOR_NAME",
    "DEFAULT_RELAUNCH_SENSOR_NAME",
    "HeartbeatTick",
    "RebalanceNeed",
    "SpreadNeed",
    "build_heartbeat_sensor",
    "build_worker_relaunch_sensor",
    "observe_tick",
    "rebalance_run_key",
    "spread_run_key",
    "workers_to_launch",
]

logger = logging.getLogger(__name__)

DEFAULT_HEARTBEAT_SENSOR_NAME = "stream_ops_heartbeat_sensor"
DEFAULT_RELAUNCH_SENSOR_NAME = "stream_ops_worker_relaunch_sensor"

#: Run tag on a relaunched worker run: how many relaunches in a row led to it.
RELAUNCH_ATTEMPT_TAG = "stream_ops/relaunch_attempt"
#: Run tag on a relaunched worker run: the failed run it replaces.
RELAUNCH_OF_TAG = "stream_ops/relaunch_of"

#: Run statuses of a worker run that has not registered its worker yet (or is about to).
_PENDING_STATUSES = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


@dataclass(frozen=True)
class RebalanceNeed:
    """Tasks of one topology lost long enough that a rebalance run should be requested.

    Attributes:
        topology_name: The topology's name.
        topology_id: Its live submission.
        lost_tasks: Ids of the tasks without a fresh heartbeat (or unassigned), sorted.
        epoch: The assignment epoch they are lost under (-1 if there is no assignment).
        live_slots: Number of live worker slots when the loss was seen.
        heartbeats: (task, heartbeat fingerprint seen, None for none) of each lost task, so
            the rebalance op can tell which beat again since, without reading any clock.
    """

    topology_name: str
    topology_id: str
    lost_tasks: tuple[int, ...]
    epoch: int
    live_slots: int
    heartbeats: tuple[tuple[int, int | None], ...] = ()

    @property
    def run_key(self) -> str:
        """``rebalance-<topology_id>-tasks-<t1>-<t2>-epoch-<n>-slots-<k>``."""
        return rebalance_run_key(self.topology_id, self.lost_tasks, self.epoch, self.live_slots)


def rebalance_run_key(topology_id: str, lost_tasks: Sequence[int], epoch: int, live_slots: int) -> str:
    """The run key of a rebalance for ``lost_tasks`` under assignment ``epoch``.

    Example:
        >>> rebalance_run_key("wordcount-1-1700000000", [3, 1], 4, 2)
        'rebalance-wordcount-1-1700000000-tasks-1-3-epoch-4-slots-2'
    """
    tasks = "-".join(str(t) for t in sorted(lost_tasks))
    return f"rebalance-{topology_id}-tasks-{tasks}-epoch-{epoch}-slots-{live_slots}"


@dataclass(frozen=True)
class SpreadNeed:
    """A topology crowded on fewer slots than it wants while free stable slots exist.

    Attributes:
        topology_name: The topology's name.
        topology_id: Its live submission.
        slots: The slots to spread over (those it uses plus the free stable ones).
        epoch: The assignment epoch seen.
        reason: Why it is due, for logs.
    """

    topology_name: str
    topology_id: str
    slots: tuple[str, ...]
    epoch: int
    reason: str

    @property
    def run_key(self) -> str:
        """``spread-<topology_id>-epoch-<n>-slots-<k>``."""
        return spread_run_key(self.topology_id, self.epoch, len(self.slots))


def spread_run_key(topology_id: str, epoch: int, slots: int) -> str:
    """The run key of a spread of ``topology_id`` at assignment ``epoch`` over ``slots`` slots.

    Example:
        >>> spread_run_key("wordcount-1-1700000000", 2, 3)
        'spread-wordcount-1-1700000000-epoch-2-slots-3'
    """
    return f"spread-{topology_id}-epoch-{epoch}-slots-{slots}"


@dataclass(frozen=True)
class HeartbeatTick:
    """The outcome of one heartbeat tick.

    Attributes:
        asset_events: Observations (in topology then stage order), then check evaluations.
        cursor: The cursor to store for the next tick.
        observed: Topology names observed (live submission found and read).
        absent: Topology names without a live submission.
        deferred: Topology names left for the next tick because the time budget ran out.
        failed: Topology name -> error message for topologies that could not be read.
        rebalances: Topologies whose lost tasks call for a rebalance run.
        workers_wanted: Most workers any observed ACTIVE topology wants (0 if none).
        spreads: Topologies to spread onto free slots.
        health_events: With ``report_health``, each observed (or newly absent) topology's health
            asset materialization and ``topology_health`` check evaluation.
    """

    asset_events: list[dg.AssetObservation | dg.AssetCheckEvaluation]
    cursor: HeartbeatCursor
    observed: list[str] = field(default_factory=list)
    absent: list[str] = field(default_factory=list)
    deferred: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    rebalances: list[RebalanceNeed] = field(default_factory=list)
    workers_wanted: int = 0
    spreads: list[SpreadNeed] = field(default_factory=list)
    health_events: list[dg.AssetMaterialization | dg.AssetCheckEvaluation] = field(default_factory=list)

    @property
    def observations(self) -> list[dg.AssetObservation]:
        """Only the observations of :attr:`asset_events`."""
        return [e for e in self.asset_events if isinstance(e, dg.AssetObservation)]

    @property
    def check_evaluations(self) -> list[dg.AssetCheckEvaluation]:
        """Only the check evaluations of :attr:`asset_events`."""
        return [e for e in self.asset_events if isinstance(e, dg.AssetCheckEvaluation)]


def observe_tick(
    store: ZkStore,
    cursor: HeartbeatCursor,
    *,
    topology_names: Sequence[str],
    translator: StreamOpsTranslator,
    heartbeat_timeout_s: float,
    tick_budget_s: float,
    progress_timeout_s: float = 60.0,
    launch_grace_s: float = 30.0,
    spread: SpreadPolicy | None = None,
    clock: Callable[[], float] = time.monotonic,
    wall_clock: Callable[[], float] = time.time,
    log: logging.Logger | logging.LoggerAdapter = logger,
    report_health: bool = False,
    kafka_sources: Sequence[KafkaSourceWatch] = (),
    end_offsets: EndOffsets | None = None,
) -> HeartbeatTick:
    """Observe the given topologies once (the body of a heartbeat sensor tick).

    Args:
        store: A connected store.
        cursor: The previous tick's cursor.
        topology_names: Topologies to observe, by name.
        translator: Maps (topology, stage) to asset keys.
        heartbeat_timeout_s: A task is alive if owned and the sensor saw its heartbeat change
            at most this long ago.
        tick_budget_s: Stop starting new topologies once this much time has passed.
        progress_timeout_s: The txid-progress check fails for a task with unprocessed input
            that committed nothing for longer than this.
        launch_grace_s: Lost tasks call for a rebalance only once the assignment epoch has
            been in place (as seen by the sensor) for this long.
        spread: When to spread crowded topologies onto free slots; None: never.
        clock: Monotonic clock for the budget (injectable for tests).
        wall_clock: The sensor's own clock (unix time): heartbeat ages, slot liveness and the
            cursor's timestamps. Never compared with a time a worker wrote.
        log: Where to log state changes (the sensor passes ``context.log``).
        report_health: Also report each topology's health asset
            (:func:`~stream_ops.orchestration.health.health_events`).
        kafka_sources: The Kafka topics the topologies read: each observed topology's lag on
            them is read, and each source asset gets one merged observation and its
            ``consumer_lag`` check evaluation (after the topologies' own events).
        end_offsets: Reads the brokers' offsets (keep one across ticks); default a new one
            (2 s timeout) when ``kafka_sources`` is not empty.

    Returns:
        The observations, check evaluations, health events, rebalance and spread needs and the
        new cursor.
    """
    started = clock()
    # Least recently observed first, so a topology deferred by the budget goes first next time.
    order = sorted(
        topology_names,
        key=lambda n: cursor.topologies[n].observed_at if n in cursor.topologies else float("-inf"),
    )
    events: list[dg.AssetObservation] = []
    checks: list[dg.AssetCheckEvaluation] = []
    rebalances: list[RebalanceNeed] = []
    spreads: list[SpreadNeed] = []
    workers_wanted = 0
    observed: list[str] = []
    absent: list[str] = []
    deferred: list[str] = []
    failed: dict[str, str] = {}
    health_reports: list[dg.AssetMaterialization | dg.AssetCheckEvaluation] = []
    new_cursor = cursor
    slots = _observe_slots(store, cursor, wall_clock()) if spread is not None else None
    if slots is not None:
        new_cursor = new_cursor.model_copy(update={"slots": slots.export()})
    live_ids = _live_submissions(store, log)
    reads = _ReadAhead(store, order, live_ids)
    kafka_by_topology: dict[str, list[KafkaSourceWatch]] = {}
    for watch in kafka_sources:
        kafka_by_topology.setdefault(watch.topology_name, []).append(watch)
    tick_offsets = TickOffsets(end_offsets or EndOffsets()) if kafka_by_topology else None
    lags: list[TopologyLag] = []
    for index, name in enumerate(order):
        if clock() - started >= tick_budget_s:
            deferred.extend(order[index:])
            log.warning(
                f"heartbeat tick used its {tick_budget_s:g}s budget; {len(deferred)} topologies "
                f"left for the next tick: {', '.join(deferred)}"
            )
            break
        previous = new_cursor.topologies.get(name)
        tracker = HeartbeatTracker()
        try:
            topology_id = live_ids.get(name) if live_ids is not None else find_topology_id(store, name, missing_ok=True)
            if topology_id and previous is not None and previous.topology_id == topology_id:
                tracker.import_beats(topology_id, previous.heartbeats)
            status = reads.describe(index, topology_id, clock=wall_clock, tracker=tracker) if topology_id else None
        except TopologyNotFoundError:
            status = None  # killed between the lookup and the read
        except (StreamOpsError, ValueError) as e:  # ValueError: a znode with an unexpected record
            failed[name] = str(e)
            log.warning(f"cannot read topology {name!r} from ZooKeeper: {e}; keeping its last cursor")
            continue
        if status is None:
            absent.append(name)
            if previous is not None:
                log.info(f"topology {name!r} ({previous.topology_id}) has no live submission any more")
                events.extend(
                    observe_absent_topology(name, previous.stages, last_topology_id=previous.topology_id, translator=translator)
                )
                if report_health:
                    health_reports.extend(
                        absent_health_events(name, last_topology_id=previous.topology_id, translator=translator)
                    )
                new_cursor = new_cursor.with_topology(name, None)
            continue

        same_submission = previous is not None and previous.topology_id == status.topology_id
        events.extend(
            observe_topology(
                status,
                translator=translator,
                heartbeat_timeout_s=heartbeat_timeout_s,
                previous_txids=previous.committed_txids if same_submission and previous else None,
            )
        )
        if report_health:
            health_reports.extend(health_events(status, translator=translator, heartbeat_timeout_s=heartbeat_timeout_s))
        if tick_offsets is not None and name in kafka_by_topology:
            lags.extend(read_topology_lags(status, kafka_by_topology[name], tick_offsets))
        now = wall_clock()
        old = previous if same_submission and previous is not None else None
        old_lost = old.lost_since if old else {}
        health = status.health(heartbeat_timeout_s)
        epoch = status.assignment_epoch if status.assignment_epoch is not None else -1
        epoch_seen_at = old.epoch_seen_at if old is not None and old.assignment_epoch == epoch else now
        advanced_at = {
            t.task_id: (
                old.advanced_at.get(t.task_id, now)
                if old is not None and old.committed_txids.get(t.task_id) == t.committed_txid
                else now
            )
            for t in status.tasks
        }
        lost_since = {t.task_id: old_lost.get(t.task_id, now) for t in status.tasks if not t.alive(heartbeat_timeout_s)}
        spread_need = None
        if slots is not None and spread is not None and status.status == "ACTIVE" and not lost_since:
            spread_need = _spread_need(store, name, status, slots.live_for(now), now, old.spread_at if old else None, spread, log)
        if spread_need is not None:
            spreads.append(spread_need)
        task_ids = {t.task_id for t in status.tasks}
        entry = TopologyCursor(
            topology_id=status.topology_id,
            stages=tuple(dict.fromkeys(t.stage_name for t in sorted(status.tasks, key=lambda t: t.stage))),
            committed_txids={t.task_id: t.committed_txid for t in status.tasks},
            lost_since=lost_since,
            advanced_at=advanced_at,
            assignment_epoch=epoch,
            epoch_seen_at=epoch_seen_at,
            health=health,
            observed_at=now,
            heartbeats={
                t: (fp, round(at, 3)) for t, (fp, at) in tracker.export_beats(status.topology_id).items() if t in task_ids
            },
            spread_at=now if spread_need is not None else (old.spread_at if old else None),
        )
        checks.extend(
            outcome.to_evaluation()
            for outcome in evaluate_topology_checks(
                status,
                translator=translator,
                heartbeat_timeout_s=heartbeat_timeout_s,
                progress_timeout_s=progress_timeout_s,
                stalled_for={t: now - at for t, at in advanced_at.items()},
            )
        )
        if status.status == "ACTIVE":
            workers_wanted = max(workers_wanted, status.workers_wanted)
            if lost_since:
                if now - epoch_seen_at >= launch_grace_s:
                    fingerprints = {t.task_id: t.heartbeat_fingerprint for t in status.tasks}
                    need = RebalanceNeed(
                        topology_name=name,
                        topology_id=status.topology_id,
                        lost_tasks=tuple(sorted(lost_since)),
                        epoch=epoch,
                        live_slots=len(status.workers_live),
                        heartbeats=tuple((t, fingerprints.get(t)) for t in sorted(lost_since)),
                    )
                    rebalances.append(need)
                else:
                    log.debug(
                        f"topology {name!r}: tasks {sorted(lost_since)} lost, but epoch {epoch} is only "
                        f"{now - epoch_seen_at:.1f}s old (launch grace {launch_grace_s:g}s)"
                    )
        if not same_submission or previous is None or previous.health != health:
            lost = sorted(entry.lost_since)
            log.info(
                f"topology {name!r} ({status.topology_id}) is {health}"
                + (f"; lost tasks {lost}" if lost and health != "inactive" else "")
            )
        new_cursor = new_cursor.with_topology(name, entry)
        observed.append(name)
    if lags:
        lag_observations, lag_outcomes = consumer_lag_events(lags)
        events.extend(lag_observations)
        checks.extend(outcome.to_evaluation() for outcome in lag_outcomes)
    return HeartbeatTick(
        asset_events=[*events, *checks],
        cursor=new_cursor,
        observed=observed,
        absent=absent,
        deferred=deferred,
        failed=failed,
        rebalances=rebalances,
        workers_wanted=workers_wanted,
        spreads=spreads,
        health_events=health_reports,
    )


#: Topologies a tick reads from ZooKeeper at once (in one :func:`read_topologies` batch).
_READ_AHEAD = 16


class _ReadAhead:
    """Reads a tick's topologies in batches, in the tick's order, as the tick reaches them.

    When the tick gets to a topology not read yet, it and the next ones (up to
    :data:`_READ_AHEAD` topologies) are read together (:func:`read_topologies`: two batched
    rounds of pipelined reads instead of one synchronous read per znode). Reading ahead only a
    few topologies keeps the tick's time budget meaningful. A batch that fails (ZooKeeper
    unavailable) fails each of its topologies with that error, as reading each on its own would.
    """

    def __init__(self, store: ZkStore, order: Sequence[str], live_ids: Mapping[str, str] | None) -> None:
        self._store = store
        self._order = order
        self._live_ids = live_ids
        self._reads: dict[str, TopologyReads | StreamOpsError] = {}

    def describe(self, index: int, topology_id: str, *, clock: Callable[[], float], tracker: HeartbeatTracker) -> TopologyStatus:
        """The status of ``topology_id``, the ``index``-th topology of the tick (as
        :func:`describe_topology` returns it, and raising what it raises)."""
        if self._live_ids is None:  # ids looked up one by one: read one by one
            return describe_topology(self._store, topology_id, clock=clock, tracker=tracker)
        if topology_id not in self._reads:
            ids = [topology_id]
            ids += [self._live_ids[n] for n in self._order[index + 1 : index + _READ_AHEAD] if n in self._live_ids]
            batch: TopologyReads | StreamOpsError
            try:
                batch = read_topologies(self._store, ids)
            except StreamOpsError as e:
                batch = e
            self._reads.update(dict.fromkeys(ids, batch))
        found = self._reads[topology_id]
        if isinstance(found, StreamOpsError):
            raise found
        return found.describe(topology_id, clock=clock, tracker=tracker)


def _observe_slots(store: ZkStore, cursor: HeartbeatCursor, now: float) -> SlotTracker:
    """The cursor's slot tracker, fed the live slots read now (by the sensor's clock)."""
    slots = SlotTracker.restore(cursor.slots)
    slots.observe(live_slot_registrations(store), now)
    return slots


def _spread_need(
    store: ZkStore,
    name: str,
    status: TopologyStatus,
    slot_live_for: Mapping[str, float],
    now: float,
    spread_at: float | None,
    policy: SpreadPolicy,
    log: logging.Logger | logging.LoggerAdapter,
) -> SpreadNeed | None:
    """Whether a healthy ACTIVE topology is due a spread (the nimbus monitor's rule)."""
    assignment = {t.task_id: t.assigned_to for t in status.tasks if t.assigned_to is not None}
    task_ids = [t.task_id for t in status.tasks]
    if not needs_spread(task_ids, assignment, [Slot.parse(s) for s in slot_live_for], status.workers_wanted):
        return None
    try:
        conf = read_storm(store, status.topology_id).conf
    except (StreamOpsError, ValueError) as e:  # killed meanwhile, or an unreadable record: next tick
        log.warning(f"topology {name!r}: cannot read its conf for a spread ({e}); not spreading this tick")
        return None
    try:
        policy = policy.for_conf(conf)
    except ConfigError as e:
        log.warning(f"topology {name!r}: {e}; spreading with the sensor's defaults")
    decision = decide_spread(
        task_ids,
        assignment,
        slot_live_for,
        status.workers_wanted,
        since_last_spread=None if spread_at is None else now - spread_at,
        interval_s=policy.interval_s,
        stability_s=policy.stability_s,
    )
    if not decision.due:
        log.debug(f"topology {name!r}: not spread now: {decision.reason}")
        return None
    return SpreadNeed(
        topology_name=name,
        topology_id=status.topology_id,
        slots=tuple(str(s) for s in decision.slots),
        epoch=status.assignment_epoch if status.assignment_epoch is not None else -1,
        reason=decision.reason,
    )


def _live_submissions(
    store: ZkStore,
    log: logging.Logger | logging.LoggerAdapter,
) -> dict[str, str] | None:
    """Topology name -> id of its live submission, read once per tick (None: look up one by one).

    The same rule as :func:`find_topology_id` (the oldest submission that is not KILLED), with
    one read of ``/storms`` instead of one per topology. A record that cannot be read makes the
    tick fall back to per-topology lookups, so only that topology is reported as failed.
    """
    try:
        records = _list_topologies(store)
    except (StreamOpsError, ValueError) as e:
        log.warning(f"cannot list topologies at once ({e}); looking them up one by one")
        return None
    live: dict[str, str] = {}
    for record in records:
        if record.status != "KILLED":
            live.setdefault(record.name, record.topology_id)
    return live


def _list_topologies(store: ZkStore) -> list[StormRecord]:
    """:func:`~stream_ops.nimbus.submission.list_topologies`, with the records read in one batch."""
    found = store.get_many(ZkPaths.storm(topology_id) for topology_id in store.children(ZkPaths.STORMS))
    records = [StormRecord.model_validate(decode_json(node[0], path)) for path, node in found.items() if node is not None]
    return sorted(records, key=lambda r: r.submitted_at)


def workers_to_launch(
    workers_wanted: int,
    live: Mapping[str, WorkerRecord],
    active_worker_runs: Collection[str],
) -> int:
    """How many worker runs to request (pure).

    Args:
        workers_wanted: Most workers any ACTIVE topology wants.
        live: The registered workers (``/workers``), by id.
        active_worker_runs: Run ids of worker runs queued, starting or started.

    Returns:
        ``workers_wanted`` minus live workers minus worker runs that have not registered a
        worker yet (a started run registers ``launched_by = dagster:<run id>``); never negative.

    Example:
        >>> workers_to_launch(3, {}, ["run-a"])
        2
    """
    registered_runs = {w.launched_by.removeprefix("dagster:") for w in live.values() if w.launched_by.startswith("dagster:")}
    pending = sum(1 for run_id in active_worker_runs if run_id not in registered_runs)
    return max(0, workers_wanted - len(live) - pending)


def _active_worker_runs(context: dg.SensorEvaluationContext, job_name: str) -> list[str] | None:
    """Run ids of the worker job's runs that are queued or running; None if no instance."""
    try:
        instance = context.instance
    except Exception:  # noqa: BLE001 - a sensor context built without an instance
        return None
    records = instance.get_run_records(filters=dg.RunsFilter(job_name=job_name, statuses=_PENDING_STATUSES))
    return [record.dagster_run.run_id for record in records]


def build_heartbeat_sensor(
    *,
    topology_names: Sequence[str],
    translator: StreamOpsTranslator | None = None,
    minimum_interval_seconds: int = 5,
    heartbeat_timeout_s: float = 10.0,
    tick_budget_s: float = 20.0,
    progress_timeout_s: float = 60.0,
    launch_grace_s: float = 30.0,
    rebalance_job: dg.JobDefinition | None = None,
    worker_job: dg.JobDefinition | None = None,
    name: str = DEFAULT_HEARTBEAT_SENSOR_NAME,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
    parquet_sinks: Sequence[ParquetSinkWatch] = (),
    spread: SpreadPolicy | None = None,
    observe_job: ObserveJob | dg.JobDefinition | None = None,
    report_health: bool = False,
    kafka_sources: Sequence[KafkaSourceWatch] = (),
    kafka_timeout_s: float = 2.0,
) -> dg.SensorDefinition:
    """A sensor observing each topology's stream assets on every tick, and repairing them.

    Requires the ``zookeeper`` resource. When ZooKeeper cannot be reached the tick is skipped
    (with the reason) and the cursor is kept.

    Args:
        topology_names: Topologies to observe, by name.
        translator: Maps (topology, stage) to asset keys; must match the one given to
            :func:`~stream_ops.orchestration.assets.topology_assets`.
        minimum_interval_seconds: Seconds between ticks.
        heartbeat_timeout_s: A task is alive if owned and its heartbeat is at most this old.
        tick_budget_s: Wall-clock budget per tick for observing topologies (connecting to
            ZooKeeper is bounded separately by the resource's ``connect_timeout_s``).
        progress_timeout_s: The txid-progress check fails for a task with unprocessed input
            that committed nothing for longer than this.
        launch_grace_s: Time an assignment epoch gets (from when the sensor first saw it)
            before its lost tasks call for a rebalance.
        rebalance_job: The ``stream_ops_rebalance`` job; None: never request rebalances.
        worker_job: The ``stream_ops_worker`` job; None: never request worker launches.
        name: The sensor's name (deterministic; change it only with the definitions).
        default_status: Whether the sensor runs as soon as the code location loads.
        parquet_sinks: Parquet sinks to materialize when their tasks committed new files.
        spread: When to request a spread of a crowded topology onto free slots (with
            ``rebalance_job`` only); default :class:`~stream_ops.config.SpreadPolicy`'s.
        observe_job: The job observing the stream assets
            (:func:`~stream_ops.orchestration.stream_observer.build_observe_job`). The sensor
            targets it, never requests it: Dagster then lists the sensor under each stream
            asset's "Automation details".
        report_health: Materialize each topology's health asset and evaluate its
            ``topology_health`` check on every tick (the code location must define the health
            assets: :func:`~stream_ops.orchestration.assets.topology_assets` does).
        kafka_sources: Kafka topics the topologies read: each tick observes their consumer
            lag and evaluates their ``consumer_lag`` checks (declared by
            :func:`~stream_ops.orchestration.consumer_lag_checks.build_consumer_lag_checks`).
        kafka_timeout_s: Longest wait for one topic's offsets; a bootstrap that failed is
            not asked again for 30 s. The clients are kept across ticks.

    Returns:
        The sensor definition.

    Raises:
        ValueError: No or duplicate topology names, or a non-positive interval, timeout or budget.

    Example:
        >>> sensor = build_heartbeat_sensor(topology_names=["wordcount"], heartbeat_timeout_s=10.0)
        >>> sensor.name
        'stream_ops_heartbeat_sensor'
    """
    names = list(topology_names)
    if not names:
        raise ValueError("build_heartbeat_sensor: give at least one topology name in topology_names")
    if len(set(names)) != len(names):
        raise ValueError(f"build_heartbeat_sensor: topology_names has duplicates: {names}")
    if minimum_interval_seconds < 1:
        raise ValueError(f"build_heartbeat_sensor: minimum_interval_seconds must be >= 1, got {minimum_interval_seconds}")
    if heartbeat_timeout_s <= 0 or tick_budget_s <= 0 or progress_timeout_s <= 0:
        raise ValueError(
            f"build_heartbeat_sensor: heartbeat_timeout_s ({heartbeat_timeout_s}), tick_budget_s "
            f"({tick_budget_s}) and progress_timeout_s ({progress_timeout_s}) must be positive"
        )
    if launch_grace_s < 0:
        raise ValueError(f"build_heartbeat_sensor: launch_grace_s must not be negative, got {launch_grace_s}")
    if kafka_timeout_s <= 0:
        raise ValueError(f"build_heartbeat_sensor: kafka_timeout_s must be positive, got {kafka_timeout_s}")
    translator = translator or StreamOpsTranslator()
    kafka_watches = tuple(kafka_sources)
    end_offsets = EndOffsets(timeout_s=kafka_timeout_s) if kafka_watches else None
    jobs = [job for job in (rebalance_job, worker_job, observe_job) if job is not None]
    spread_policy = (spread or SpreadPolicy()) if rebalance_job is not None else None

    repairs = []
    if rebalance_job is not None:
        repairs.append("requests a rebalance when heartbeats are lost or a crowded topology can spread")
    if worker_job is not None:
        repairs.append("launches worker runs when workers are missing")

    @dg.sensor(
        name=name,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        jobs=jobs or None,
        description=(
            f"Observes the stream assets of {', '.join(names)} from ZooKeeper every {minimum_interval_seconds}s: "
            f"health (heartbeat timeout {heartbeat_timeout_s:g}s), heartbeat ages, committed txids, rows/s, lag, "
            "dead letters; evaluates the heartbeat-freshness and txid-progress checks"
            + ("; records each topology's health asset and topology_health check" if report_health else "")
            + ("; observes the consumer lag of the Kafka topics read and their consumer_lag checks" if kafka_watches else "")
            + (f"; {' and '.join(repairs)}." if repairs else ".")
        ),
    )
    def _heartbeat_sensor(context: dg.SensorEvaluationContext, zookeeper: ZooKeeperResource) -> dg.SensorResult:
        cursor = HeartbeatCursor.parse(context.cursor)
        live: dict[str, WorkerRecord] = {}
        try:
            with zookeeper.store() as store:
                tick = observe_tick(
                    store,
                    cursor,
                    topology_names=names,
                    translator=translator,
                    heartbeat_timeout_s=heartbeat_timeout_s,
                    tick_budget_s=tick_budget_s,
                    progress_timeout_s=progress_timeout_s,
                    launch_grace_s=launch_grace_s,
                    spread=spread_policy,
                    log=context.log,
                    report_health=report_health,
                    kafka_sources=kafka_watches,
                    end_offsets=end_offsets,
                )
                if worker_job is not None and tick.workers_wanted > 0:
                    live = live_workers(store)
        except CoordinationError as e:
            context.log.warning(f"ZooKeeper unavailable, skipping this tick: {e}")
            return dg.SensorResult(skip_reason=f"ZooKeeper unavailable: {e}")

        run_requests: list[dg.RunRequest] = []
        if rebalance_job is not None:
            for need in tick.rebalances:
                context.log.info(
                    f"topology {need.topology_name!r} ({need.topology_id}): tasks {list(need.lost_tasks)} lost at "
                    f"epoch {need.epoch}; requesting a rebalance"
                )
                run_requests.append(
                    dg.RunRequest(
                        run_key=need.run_key,
                        job_name=rebalance_job.name,
                        run_config=rebalance_run_config(
                            need.topology_id,
                            lost_tasks=need.lost_tasks,
                            heartbeat_timeout_s=heartbeat_timeout_s,
                            lost_heartbeats=dict(need.heartbeats),
                        ),
                        tags={
                            TOPOLOGY_TAG: need.topology_name,
                            ROLE_TAG: "rebalance",
                            "stream_ops/lost_tasks": ",".join(str(t) for t in need.lost_tasks),
                            "stream_ops/assignment_epoch": str(need.epoch),
                        },
                    )
                )
            run_requests.extend(_spread_request(need, rebalance_job.name, context.log) for need in tick.spreads)
        if worker_job is not None and tick.workers_wanted > 0:
            active = _active_worker_runs(context, worker_job.name) or []
            missing = workers_to_launch(tick.workers_wanted, live, active)
            if missing:
                context.log.info(
                    f"{len(live)} workers live, {tick.workers_wanted} wanted, {len(active)} worker runs active; "
                    f"launching {missing} worker runs"
                )
            for index in range(missing):
                run_requests.append(
                    dg.RunRequest(
                        job_name=worker_job.name,
                        tags={ROLE_TAG: "worker", "stream_ops/launched_by": name, "stream_ops/launch_index": str(index)},
                    )
                )

        sink_events = observe_parquet_sinks(parquet_sinks, latest_sink_txids(context.instance)) if parquet_sinks else []
        asset_events = [*tick.asset_events, *tick.health_events, *sink_events]
        if not asset_events and not run_requests:
            reason = "no live submission of " + ", ".join(names)
            if tick.failed:
                reason = "could not read " + ", ".join(f"{n} ({m})" for n, m in tick.failed.items())
            return dg.SensorResult(skip_reason=reason, cursor=tick.cursor.to_json())
        return dg.SensorResult(asset_events=asset_events, run_requests=run_requests or None, cursor=tick.cursor.to_json())

    return _heartbeat_sensor


def _spread_request(need: SpreadNeed, job_name: str, log: logging.Logger | logging.LoggerAdapter) -> dg.RunRequest:
    """The rebalance run that spreads ``need``'s topology (the op calls ``spread_topology``)."""
    log.info(f"topology {need.topology_name!r} ({need.topology_id}): {need.reason}; requesting a spread over {list(need.slots)}")
    return dg.RunRequest(
        run_key=need.run_key,
        job_name=job_name,
        run_config=rebalance_run_config(need.topology_id, quiesce=False, spread_slots=need.slots),
        tags={
            TOPOLOGY_TAG: need.topology_name,
            ROLE_TAG: "rebalance",
            "stream_ops/spread_slots": ",".join(need.slots),
            "stream_ops/assignment_epoch": str(need.epoch),
        },
    )


def build_worker_relaunch_sensor(
    *,
    worker_job: dg.JobDefinition,
    max_relaunches: int = 3,
    minimum_interval_seconds: int = 10,
    name: str = DEFAULT_RELAUNCH_SENSOR_NAME,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
) -> dg.SensorDefinition:
    """A run-failure sensor that relaunches failed worker runs.

    Only runs of ``worker_job`` are watched. Each failed run gets one relaunch (run key
    ``relaunch-<failed run id>``) with the same run configuration; a relaunch of a relaunch
    counts up :data:`RELAUNCH_ATTEMPT_TAG`, and after ``max_relaunches`` in a row the sensor
    gives up (logged; the heartbeat sensor still launches workers while too few are live).

    Args:
        worker_job: The ``stream_ops_worker`` job.
        max_relaunches: Relaunches in a row before giving up (>= 1).
        minimum_interval_seconds: Seconds between ticks.
        name: The sensor's name.
        default_status: Whether the sensor runs as soon as the code location loads.
        parquet_sinks: Parquet sinks to materialize when their tasks committed new files.

    Returns:
        The sensor definition.

    Example:
        >>> from stream_ops.orchestration.jobs import build_jobs
        >>> build_worker_relaunch_sensor(worker_job=build_jobs().worker).name
        'stream_ops_worker_relaunch_sensor'
    """
    if max_relaunches < 1:
        raise ValueError(f"build_worker_relaunch_sensor: max_relaunches must be >= 1, got {max_relaunches}")

    def _relaunch(context: dg.RunFailureSensorContext) -> dg.RunRequest | dg.SkipReason:
        failed = context.dagster_run
        attempt = int(failed.tags.get(RELAUNCH_ATTEMPT_TAG, "0")) + 1
        if attempt > max_relaunches:
            message = (
                f"worker run {failed.run_id} failed after {attempt - 1} relaunches in a row; not relaunching. "
                "Look at its logs (port in use? ZooKeeper unreachable?) and launch a worker run by hand"
            )
            context.log.warning(message)
            return dg.SkipReason(message)
        context.log.info(f"worker run {failed.run_id} failed ({context.failure_event.message}); relaunching (attempt {attempt})")
        tags = {k: v for k, v in failed.tags.items() if k.startswith("stream_ops/")}
        tags.update({RELAUNCH_ATTEMPT_TAG: str(attempt), RELAUNCH_OF_TAG: failed.run_id, ROLE_TAG: "worker"})
        return dg.RunRequest(run_key=f"relaunch-{failed.run_id}", run_config=dict(failed.run_config), tags=tags)

    return dg.run_failure_sensor(
        name=name,
        monitored_jobs=[worker_job],
        request_job=worker_job,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description=f"Relaunches failed {worker_job.name} runs (at most {max_relaunches} times in a row).",
    )(_relaunch)
