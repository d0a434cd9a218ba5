"""Asset checks on the stream assets: heartbeat freshness and txid progress.

Two checks per stream asset (one per stage):

* ``heartbeat_freshness``: every task of the stage is owned by a worker whose heartbeat is at
  most ``heartbeat_timeout_s`` old. Fails with severity ERROR when no task of the stage is
  alive, WARN when some are not. The age is the nimbus monitor's: seconds since the observer
  saw the heartbeat change, by its own clock (never the time the worker wrote), so a worker
  with a skewed clock is judged alike everywhere. The metadata's ``heartbeat_age_basis`` says
  which age was used.
* ``txid_progress``: every task that has unprocessed input (records or files not read yet) committed a new
  txid within ``progress_timeout_s``. An idle task (no lag) passes: nothing to commit. Fails
  with severity WARN.

A topology that is not ACTIVE (deactivated, rebalancing) passes both checks, with a
description saying why: nothing is expected to run.

Where they are evaluated:

* The heartbeat sensor evaluates both on every tick and records them with
  ``SensorResult(asset_events=[AssetCheckEvaluation(...)])``; "how long has this task's txid
  not advanced" comes from its cursor.
* :func:`build_stream_checks` defines them as a ``@multi_asset_check`` so they show on the
  asset pages and can be executed on demand; executed in a run, the stall time comes from the
  stream asset's observation history in the Dagster instance, and so do heartbeat ages: the
  heartbeat tracker is rebuilt from the fingerprints the sensor recorded
  (:func:`tracker_from_observations`), the observations' timestamps being the Dagster
  instance's clock. A heartbeat no observation showed is 0 s old at its first sight.

The evaluation itself (:func:`evaluate_stage_checks`) is pure: no clock, no I/O.

Note: this module does not use ``from __future__ import annotations`` because Dagster reads
the resource parameters' annotations of the decorated function at definition time.
"""

import hashlib
import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from stream_ops.errors import StreamOpsError
from stream_ops.nimbus.monitor import HeartbeatTracker
from stream_ops.nimbus.status import AGE_BASIS_TEXT, AGE_OBSERVED, TaskStatus, TopologyStatus, describe_topology
from stream_ops.nimbus.submission import find_topology_id
from stream_ops.orchestration.observations import stage_health
from stream_ops.orchestration.resources import ZooKeeperResource
from stream_ops.orchestration.translator import StreamOpsTranslator, python_identifier
from stream_ops.topology.plan import Plan

__all__ = [
    "HEARTBEAT_FRESHNESS",
    "TXID_PROGRESS",
    "CheckOutcome",
    "build_stream_checks",
    "evaluate_stage_checks",
    "observation_history",
    "stream_checks_op_name",
    "evaluate_topology_checks",
    "stalled_from_observations",
    "stream_check_specs",
    "tracker_from_observations",
]

logger = logging.getLogger(__name__)

#: Name of the check that every task of a stage has a fresh heartbeat.
HEARTBEAT_FRESHNESS = "heartbeat_freshness"
#: Name of the check that tasks with unprocessed input keep committing txids.
TXID_PROGRESS = "txid_progress"

#: How many past observations an on-demand txid-progress check looks back through.
_HISTORY_LIMIT = 200


@dataclass(frozen=True)
class CheckOutcome:
    """One evaluated check, convertible to what a sensor or an op reports.

    Attributes:
        asset_key: The stream asset checked.
        check_name: :data:`HEARTBEAT_FRESHNESS` or :data:`TXID_PROGRESS`.
        passed: Whether the check passed.
        severity: How bad a failure is (ignored when passed).
        description: One sentence saying what was found and, on failure, what to do.
        metadata: Details (lost or stalled tasks, thresholds).
    """

    asset_key: dg.AssetKey
    check_name: str
    passed: bool
    severity: dg.AssetCheckSeverity
    description: str
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def to_evaluation(self) -> dg.AssetCheckEvaluation:
        """As a sensor reports it (``SensorResult(asset_events=[...])``)."""
        return dg.AssetCheckEvaluation(
            asset_key=self.asset_key,
            check_name=self.check_name,
            passed=self.passed,
            severity=self.severity,
            description=self.description,
            metadata=dict(self.metadata),
        )

    def to_result(self) -> dg.AssetCheckResult:
        """As a check function returns it."""
        return dg.AssetCheckResult(
            asset_key=self.asset_key,
            check_name=self.check_name,
            passed=self.passed,
            severity=self.severity,
            description=self.description,
            metadata=dict(self.metadata),
        )


def stream_check_specs(asset_key: dg.AssetKey) -> list[dg.AssetCheckSpec]:
    """The two check specs of one stream asset."""
    return [
        dg.AssetCheckSpec(
            name=HEARTBEAT_FRESHNESS,
            asset=asset_key,
            description="Every task of this stage is owned by a worker whose heartbeat is fresh. "
            "Evaluated by the heartbeat sensor on every tick.",
        ),
        dg.AssetCheckSpec(
            name=TXID_PROGRESS,
            asset=asset_key,
            description="Every task of this stage with unprocessed input committed a new txid recently. "
            "Evaluated by the heartbeat sensor on every tick.",
        ),
    ]


def evaluate_stage_checks(
    asset_key: dg.AssetKey,
    *,
    status: str,
    tasks: Sequence[TaskStatus],
    heartbeat_timeout_s: float,
    progress_timeout_s: float,
    stalled_for: Mapping[int, float | None],
    age_basis: str = AGE_OBSERVED,
) -> list[CheckOutcome]:
    """Evaluate both checks of one stage (pure).

    Args:
        asset_key: The stage's stream asset.
        status: The topology's status (ACTIVE, INACTIVE, REBALANCING, ...).
        tasks: The stage's tasks.
        heartbeat_timeout_s: A task is alive if owned and its heartbeat is at most this old.
        progress_timeout_s: Longest time a task with unprocessed input may go without a commit.
        stalled_for: Task id -> seconds since its committed txid last advanced (None: unknown).
        age_basis: How the tasks' heartbeat ages were measured
            (``TopologyStatus.heartbeat_age_basis``), reported in the metadata.

    Returns:
        ``[heartbeat_freshness, txid_progress]``.

    Example:
        >>> [o.passed for o in evaluate_stage_checks(dg.AssetKey("s"), status="INACTIVE", tasks=[],
        ...     heartbeat_timeout_s=10, progress_timeout_s=60, stalled_for={})]
        [True, True]
    """
    ok = dg.AssetCheckSeverity.WARN
    if status != "ACTIVE":
        why = f"topology is {status}: no task is expected to run"
        return [
            CheckOutcome(asset_key, HEARTBEAT_FRESHNESS, True, ok, why, {"status": dg.MetadataValue.text(status)}),
            CheckOutcome(asset_key, TXID_PROGRESS, True, ok, why, {"status": dg.MetadataValue.text(status)}),
        ]

    lost = sorted(t.task_id for t in tasks if not t.alive(heartbeat_timeout_s))
    ages = [t.heartbeat_age_s for t in tasks if t.heartbeat_age_s is not None]
    health = stage_health(status, tasks, heartbeat_timeout_s)
    freshness_meta: dict[str, Any] = {
        "lost_tasks": dg.MetadataValue.json(lost),
        "tasks_total": dg.MetadataValue.int(len(tasks)),
        "oldest_heartbeat_age_s": dg.MetadataValue.float(float(max(ages)) if ages else -1.0),
        "heartbeat_timeout_s": dg.MetadataValue.float(float(heartbeat_timeout_s)),
        "heartbeat_age_basis": dg.MetadataValue.text(f"{age_basis}: {AGE_BASIS_TEXT.get(age_basis, age_basis)}"),
    }
    if not lost:
        freshness = CheckOutcome(
            asset_key,
            HEARTBEAT_FRESHNESS,
            True,
            ok,
            f"all {len(tasks)} tasks beat within {heartbeat_timeout_s:g}s ({age_basis} ages)",
            freshness_meta,
        )
    else:
        severity = dg.AssetCheckSeverity.ERROR if health == "down" else dg.AssetCheckSeverity.WARN
        freshness = CheckOutcome(
            asset_key,
            HEARTBEAT_FRESHNESS,
            False,
            severity,
            f"{len(lost)} of {len(tasks)} tasks have no heartbeat that changed within {heartbeat_timeout_s:g}s "
            f"(tasks {lost}); the heartbeat sensor requests a rebalance, and a worker launch if workers are missing",
            freshness_meta,
        )

    stalled = {
        t.task_id: stalled_for[t.task_id]
        for t in tasks
        if t.has_lag and stalled_for.get(t.task_id) is not None and float(stalled_for[t.task_id]) > progress_timeout_s  # type: ignore[arg-type]
    }
    progress_meta: dict[str, Any] = {
        "stalled_tasks": dg.MetadataValue.json({str(k): round(float(v), 1) for k, v in stalled.items()}),  # type: ignore[arg-type]
        "tasks_with_lag": dg.MetadataValue.int(sum(1 for t in tasks if t.has_lag)),
        "lag_records": dg.MetadataValue.int(sum(t.lag_records or 0 for t in tasks)),
        "lag_files": dg.MetadataValue.int(sum(t.lag_files for t in tasks)),
        "min_committed_txid": dg.MetadataValue.int(min((t.committed_txid for t in tasks), default=-1)),
        "progress_timeout_s": dg.MetadataValue.float(float(progress_timeout_s)),
    }
    if not stalled:
        progress = CheckOutcome(
            asset_key,
            TXID_PROGRESS,
            True,
            ok,
            f"every task with unprocessed input committed within {progress_timeout_s:g}s",
            progress_meta,
        )
    else:
        progress = CheckOutcome(
            asset_key,
            TXID_PROGRESS,
            False,
            dg.AssetCheckSeverity.WARN,
            f"tasks {sorted(stalled)} have unprocessed input but committed no txid for more than "
            f"{progress_timeout_s:g}s; look at their errors (stream-ops status) and worker logs",
            progress_meta,
        )
    return [freshness, progress]


def evaluate_topology_checks(
    status: TopologyStatus,
    *,
    translator: StreamOpsTranslator,
    heartbeat_timeout_s: float,
    progress_timeout_s: float,
    stalled_for: Mapping[int, float | None],
) -> list[CheckOutcome]:
    """Evaluate both checks on every stage of a topology (pure), in stage order."""
    by_stage: dict[tuple[int, str], list[TaskStatus]] = {}
    for task in status.tasks:
        by_stage.setdefault((task.stage, task.stage_name), []).append(task)
    outcomes: list[CheckOutcome] = []
    for (_, stage_name), tasks in sorted(by_stage.items()):
        outcomes.extend(
            evaluate_stage_checks(
                translator.stream_asset_key(status.name, stage_name),
                status=status.status,
                tasks=sorted(tasks, key=lambda t: t.task_id),
                heartbeat_timeout_s=heartbeat_timeout_s,
                progress_timeout_s=progress_timeout_s,
                stalled_for=stalled_for,
                age_basis=status.heartbeat_age_basis,
            )
        )
    return outcomes


def stalled_from_observations(
    tasks: Sequence[TaskStatus],
    history: Sequence[tuple[float, Mapping[str, Any]]],
    *,
    topology_id: str,
    now: float,
) -> dict[int, float | None]:
    """How long each task's committed txid has not advanced, from past observations (pure).

    Args:
        tasks: The tasks as read now.
        history: ``(timestamp, metadata values)`` of past observations of the stage, newest first.
        topology_id: Observations of other submissions are ignored.
        now: Current wall-clock time (unix seconds).

    Returns:
        Task id -> seconds since the oldest observation in an unbroken run (from the newest
        back) that showed the same committed txid; 0 if the newest one showed another txid;
        None if no observation of this submission shows the task.
    """
    stalled: dict[int, float | None] = {}
    relevant = [(ts, meta) for ts, meta in history if meta.get("topology_id") == topology_id]
    for task in tasks:
        oldest_same: float | None = None
        seen = False
        for ts, meta in relevant:
            txids = meta.get("committed_txid")
            if not isinstance(txids, Mapping) or str(task.task_id) not in txids:
                continue
            seen = True
            if txids[str(task.task_id)] != task.committed_txid:
                break
            oldest_same = ts
        stalled[task.task_id] = None if not seen else (max(0.0, now - oldest_same) if oldest_same is not None else 0.0)
    return stalled


def tracker_from_observations(
    history: Iterable[tuple[float, Mapping[str, Any]]],
    *,
    topology_id: str,
) -> HeartbeatTracker:
    """Rebuild the heartbeat sensor's tracker from its recorded observations (pure).

    Each observation's ``heartbeat_mzxid`` (task -> fingerprint) is fed to a fresh
    :class:`~stream_ops.nimbus.monitor.HeartbeatTracker` at the observation's timestamp, oldest
    first, so the tracker knows when each heartbeat was last seen to change, as the sensor did.

    Args:
        history: ``(timestamp, metadata values)`` of past observations (any order, any stage).
        topology_id: Observations of other submissions are ignored.

    Returns:
        The tracker; pass it to :func:`~stream_ops.nimbus.status.describe_topology` with the
        same clock (unix time).

    Example:
        >>> t = tracker_from_observations([(100.0, {"topology_id": "t", "heartbeat_mzxid": {"0": 5}}),
        ...                                (90.0, {"topology_id": "t", "heartbeat_mzxid": {"0": 5}})], topology_id="t")
        >>> t.heartbeat_age("t", 0, now=95.0)
        5.0
    """
    tracker = HeartbeatTracker()
    for ts, meta in sorted(history, key=lambda item: item[0]):
        fingerprints = meta.get("heartbeat_mzxid")
        if meta.get("topology_id") != topology_id or not isinstance(fingerprints, Mapping):
            continue
        for task, fingerprint in fingerprints.items():
            tracker.observe(topology_id, int(task), fingerprint, ts)
    return tracker


def observation_history(instance: dg.DagsterInstance, asset_key: dg.AssetKey) -> list[tuple[float, dict[str, Any]]]:
    """``(timestamp, metadata values)`` of the recent observations of ``asset_key``, newest first."""
    records = instance.fetch_observations(asset_key, limit=_HISTORY_LIMIT).records
    history = []
    for record in records:
        observation = record.asset_observation
        if observation is not None:
            history.append((record.timestamp, {k: v.value for k, v in observation.metadata.items()}))
    return history


def _histories(
    context: dg.AssetCheckExecutionContext, keys: Mapping[str, dg.AssetKey]
) -> dict[str, list[tuple[float, dict[str, Any]]]]:
    """Stage name -> its stream asset's recent observations (empty where they cannot be read)."""
    histories: dict[str, list[tuple[float, dict[str, Any]]]] = {}
    for stage_name, asset_key in keys.items():
        try:
            histories[stage_name] = observation_history(context.instance, asset_key)
        except StreamOpsError as e:  # pragma: no cover - defensive
            context.log.warning(f"cannot read observation history of {asset_key.to_user_string()}: {e}")
            histories[stage_name] = []
    return histories


def stream_checks_op_name(topology_name: str) -> str:
    """The op name of a topology's stream checks, unique in a code location (topology names are).

    The topology name with every character Dagster does not allow replaced by ``_``; when that
    changed it, a short hash of the name follows, so ``a-b`` and ``a_b`` do not clash.

    Example:
        >>> stream_checks_op_name("wordcount")
        'wordcount_stream_checks'
        >>> stream_checks_op_name("word-count") != stream_checks_op_name("word_count")
        True
    """
    identifier = python_identifier(topology_name)
    if identifier != topology_name:
        identifier += "_" + hashlib.sha256(topology_name.encode("utf-8")).hexdigest()[:8]
    return f"{identifier}_stream_checks"


def build_stream_checks(
    *,
    plan: Plan,
    translator: StreamOpsTranslator,
    heartbeat_timeout_s: float = 10.0,
    progress_timeout_s: float = 60.0,
) -> dg.AssetChecksDefinition:
    """The heartbeat-freshness and txid-progress checks of every stream asset of one topology.

    Executed in a run, they read the topology from ZooKeeper now and take the stall time of
    each task from the stream asset's observation history (recorded by the heartbeat sensor).

    Args:
        plan: The topology's plan (its stages name the stream assets).
        translator: Maps (topology, stage) to asset keys.
        heartbeat_timeout_s: A task is alive if owned and its heartbeat is at most this old.
        progress_timeout_s: Longest time a task with unprocessed input may go without a commit.

    Returns:
        A multi-asset check requiring the ``zookeeper`` resource.

    Example:
        >>> checks = build_stream_checks(plan=plan, translator=StreamOpsTranslator())  # doctest: +SKIP
        >>> sorted(k.name for k in checks.check_keys)  # doctest: +SKIP
        ['heartbeat_freshness', 'heartbeat_freshness', 'txid_progress', 'txid_progress']
    """
    keys = {stage.name: translator.stream_asset_key(plan.topology, stage.name) for stage in plan.stages}
    specs = [spec for key in keys.values() for spec in stream_check_specs(key)]
    topology_name = plan.topology

    @dg.multi_asset_check(
        # Named after the topology, never its group: two topologies may share a group.
        name=stream_checks_op_name(topology_name),
        specs=specs,
        description=f"Heartbeat freshness and txid progress of every stage of `{topology_name}`, read from ZooKeeper.",
        can_subset=True,
    )
    def _stream_checks(context: dg.AssetCheckExecutionContext, zookeeper: ZooKeeperResource) -> Iterator[dg.AssetCheckResult]:
        wanted = set(context.selected_asset_check_keys)
        histories = _histories(context, keys)
        now = time.time()
        with zookeeper.store() as store:
            topology_id = find_topology_id(store, topology_name, missing_ok=True)
            status = None
            if topology_id:
                tracker = tracker_from_observations(
                    [item for history in histories.values() for item in history], topology_id=topology_id
                )
                status = describe_topology(store, topology_id, clock=lambda: now, tracker=tracker)
        if status is None:
            for key in sorted(wanted, key=lambda k: (k.asset_key.to_user_string(), k.name)):
                yield dg.AssetCheckResult(
                    asset_key=key.asset_key,
                    check_name=key.name,
                    passed=False,
                    severity=dg.AssetCheckSeverity.WARN,
                    description=f"topology {topology_name!r} has no live submission; materialize its submission asset",
                )
            return
        by_stage: dict[str, list[TaskStatus]] = {}
        for task in status.tasks:
            by_stage.setdefault(task.stage_name, []).append(task)
        for stage_name, tasks in by_stage.items():
            asset_key = keys.get(stage_name)
            if asset_key is None:
                context.log.warning(f"stage {stage_name!r} of {status.topology_id} is not in this code location's plan")
                continue
            stalled = stalled_from_observations(tasks, histories.get(stage_name, []), topology_id=status.topology_id, now=now)
            for outcome in evaluate_stage_checks(
                asset_key,
                status=status.status,
                tasks=sorted(tasks, key=lambda t: t.task_id),
                heartbeat_timeout_s=heartbeat_timeout_s,
                progress_timeout_s=progress_timeout_s,
                stalled_for=stalled,
                age_basis=status.heartbeat_age_basis,
            ):
                if dg.AssetCheckKey(asset_key, outcome.check_name) in wanted:
                    yield outcome.to_result()

    return _stream_checks
