"""Turn a topology's status into Dagster asset observations (no I/O, no clock).

One :class:`dagster.AssetObservation` per stage, on that stage's stream asset. The metadata
keys are listed with their meaning in :data:`OBSERVATION_FIELDS`; the stream assets carry
that list so the UI explains what the sensor reports. Every ``int`` and ``float`` field is
recorded as numeric metadata (``MetadataValue.int`` / ``.float``), so Dagster plots it over
time (the asset's Events tab, "Metadata plots"): rows/s in and out, lag, committed txids, heartbeat age, dead letters,
tasks alive, state keys.

Heartbeat ages are reported as the status measured them, and ``heartbeat_age_basis`` says
how: from the heartbeat sensor they are ``observed`` (seconds since the sensor saw the
heartbeat change, the nimbus monitor's rule; see :mod:`stream_ops.nimbus.status`).

Example:
    >>> status = describe_topology(store, "wordcount-1-1700000000")  # doctest: +SKIP
    >>> observe_topology(status, translator=StreamOpsTranslator(), heartbeat_timeout_s=10.0)  # doctest: +SKIP
    [AssetObservation(asset_key=AssetKey(['stream_ops', 'wordcount', 'sentences']), ...), ...]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg

from stream_ops.nimbus.status import Health, TaskStatus, TopologyStatus, standbys_text
from stream_ops.orchestration.markdown import cell
from stream_ops.orchestration.translator import StreamOpsTranslator

__all__ = [
    "NOT_SUBMITTED",
    "OBSERVATION_FIELDS",
    "observe_absent_topology",
    "observation_schema",
    "observe_topology",
    "stage_health",
]

#: ``status`` reported for a topology that has no live submission.
NOT_SUBMITTED = "NOT_SUBMITTED"

#: Metadata key -> (type, meaning), for every key a stream observation may carry.
OBSERVATION_FIELDS: Mapping[str, tuple[str, str]] = {
    "topology_id": ("text", "Id of the live submission observed (name-<counter>-<unix ts>)."),
    "status": ("text", "Topology status in ZooKeeper: ACTIVE, INACTIVE, REBALANCING, KILLED or NOT_SUBMITTED."),
    "health": ("text", "This stage: healthy (all tasks alive), degraded (some), down (none), inactive (not ACTIVE)."),
    "topology_health": ("text", "The same, over all tasks of the topology."),
    "tasks_alive": ("int", "Tasks of this stage owned by a worker with a heartbeat younger than the timeout."),
    "tasks_total": ("int", "Tasks of this stage (one per queue)."),
    "lost_tasks": ("json", "Ids of this stage's tasks that are not alive (list)."),
    "heartbeat_age_s": (
        "json",
        "Age of each task's heartbeat in seconds, null if none (task id -> age); measured as heartbeat_age_basis says.",
    ),
    "heartbeat_age_basis": (
        "text",
        "How heartbeat ages are measured: 'observed' = seconds since the observer (the heartbeat sensor) saw the "
        "heartbeat change, by its own clock, the nimbus monitor's rule; 'worker_clock' = the reader's clock minus the "
        "time the worker wrote (needs synchronised clocks).",
    ),
    "heartbeat_mzxid": (
        "json",
        "Fingerprint of each task's heartbeat (its znode's mzxid, null if none; task id -> mzxid): what the on-demand "
        "checks rebuild heartbeat ages from.",
    ),
    "committed_txid": ("json", "Last committed transaction id of each task, -1 before the first (task id -> txid)."),
    "min_committed_txid": ("int", "Smallest committed txid over this stage's tasks: every batch up to it is done."),
    "max_committed_txid": ("int", "Largest committed txid over this stage's tasks (plotted, it grows with every batch)."),
    "max_heartbeat_age_s": (
        "float",
        "Oldest heartbeat age over this stage's tasks in seconds, -1 if none has a heartbeat (plotted; measured as "
        "heartbeat_age_basis says).",
    ),
    "txids_committed_since_last_tick": (
        "int",
        "Sum over tasks of committed txid progress since the previous tick (absent on the first tick after a (re)submission).",
    ),
    "rows_per_s_in": ("float", "Rows per second read by this stage's tasks (sum of their last heartbeats)."),
    "rows_per_s_out": ("float", "Rows per second written by this stage's tasks (sum)."),
    "lag_records": ("int", "Input records not yet processed by this stage's tasks (sum over the tasks that can count them)."),
    "lag_files": ("int", "Input files not yet processed by this stage's tasks (sum; file sources and shuffles)."),
    "dead_letters": ("int", "Records of this stage sent to the dead-letter topic (sum)."),
    "state_keys": ("int", "RocksDB's estimate of the keys in this stage's local state stores (sum; 0 for source stages)."),
    "failing_tasks": (
        "json",
        "This stage's tasks whose last starts or queries failed: task id -> {error, failures, quarantined, worker}.",
    ),
    "quarantined_tasks": (
        "json",
        "Ids of this stage's tasks their worker stopped trying after repeated failures (list); delete "
        "/errors/<topology id>/<task> in ZooKeeper or resubmit to try again.",
    ),
    "standbys": (
        "json",
        "Standby replicas of this stage's stateful tasks: task id -> [{worker, applied_txid, lag_txids}] (lag: committed "
        "txids the standby has not applied; null before it reported).",
    ),
    "tasks": (
        "md",
        "Per-task table: queue, owner, standbys with their lag, epoch, heartbeat age, committed and in-flight txid, rows/s, "
        "last error.",
    ),
}


def observation_schema() -> dg.TableSchema:
    """:data:`OBSERVATION_FIELDS` as a table schema, for the stream assets' definition metadata."""
    return dg.TableSchema(
        columns=[dg.TableColumn(name=name, type=typ, description=text) for name, (typ, text) in OBSERVATION_FIELDS.items()]
    )


def stage_health(status: str, tasks: Sequence[TaskStatus], heartbeat_timeout_s: float) -> Health:
    """Health of a group of tasks, with the rules of :meth:`TopologyStatus.health`.

    Args:
        status: The topology's status (only ``ACTIVE`` topologies can be healthy).
        tasks: The tasks to judge.
        heartbeat_timeout_s: A task is alive if owned and its heartbeat is at most this old.

    Returns:
        ``inactive`` if not ACTIVE, else ``healthy`` (all alive), ``down`` (none) or ``degraded``.
    """
    if status != "ACTIVE":
        return "inactive"
    alive = sum(t.alive(heartbeat_timeout_s) for t in tasks)
    if tasks and alive == len(tasks):
        return "healthy"
    return "down" if alive == 0 else "degraded"


def _oldest_age(tasks: Sequence[TaskStatus]) -> float:
    """The oldest heartbeat age of ``tasks`` in seconds, -1.0 when none has a heartbeat."""
    ages = [float(t.heartbeat_age_s) for t in tasks if t.heartbeat_age_s is not None]
    return round(max(ages), 3) if ages else -1.0


def _fmt(value: float | int | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _error_cell(task: TaskStatus) -> str:
    """The table's error column: the failing task's last error, escaped for a markdown cell."""
    if not task.failing or not task.last_error:
        return "-"
    state = "**quarantined**" if task.quarantined else f"{task.failures}x"
    return f"{state} {cell(task.last_error)}"


def _failing(tasks: Sequence[TaskStatus]) -> dict[str, dict[str, Any]]:
    """Task id -> what failed, for the tasks of ``tasks`` that are failing."""
    return {
        str(t.task_id): {
            "error": t.last_error,
            "failures": t.failures,
            "quarantined": t.quarantined,
            "worker": t.last_error_worker,
        }
        for t in tasks
        if t.failing
    }


def _tasks_table(tasks: Sequence[TaskStatus], heartbeat_timeout_s: float) -> str:
    lines = [
        "| task | queue | alive | owner | standbys (lag) | epoch | heartbeat age (s) | committed txid | in flight "
        "| rows/s in | rows/s out | error |",
        "|---:|---:|:---:|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for t in tasks:
        lines.append(
            f"| {t.task_id} | {t.queue} | {'yes' if t.alive(heartbeat_timeout_s) else '**no**'} | {cell(t.owner or '-')} "
            f"| {cell(standbys_text(t) or '-')} "
            f"| {_fmt(t.owner_epoch)} | {_fmt(t.heartbeat_age_s)} | {t.committed_txid} | {_fmt(t.txid_in_flight)} "
            f"| {t.rows_per_s:.1f} | {t.rows_out_per_s:.1f} | {_error_cell(t)} |"
        )
    return "\n".join(lines)


def observe_topology(
    status: TopologyStatus,
    *,
    translator: StreamOpsTranslator | None = None,
    heartbeat_timeout_s: float = 10.0,
    previous_txids: Mapping[int, int] | None = None,
) -> list[dg.AssetObservation]:
    """One observation per stage of ``status``, on the stage's stream asset.

    Args:
        status: What :func:`~stream_ops.nimbus.status.describe_topology` read.
        translator: Maps (topology, stage) to asset keys; default :class:`StreamOpsTranslator`.
        heartbeat_timeout_s: A task is alive if owned and its heartbeat is at most this old.
        previous_txids: Committed txid per task id at the previous observation of the same
            submission; when given, ``txids_committed_since_last_tick`` is reported.

    Returns:
        Observations in stage order; metadata keys as in :data:`OBSERVATION_FIELDS`.

    Example:
        >>> obs = observe_topology(status, heartbeat_timeout_s=10.0)  # doctest: +SKIP
        >>> obs[0].metadata["health"].value  # doctest: +SKIP
        'healthy'
    """
    translator = translator or StreamOpsTranslator()
    by_stage: dict[tuple[int, str], list[TaskStatus]] = {}
    for task in status.tasks:
        by_stage.setdefault((task.stage, task.stage_name), []).append(task)
    topology_health = status.health(heartbeat_timeout_s)
    observations = []
    for (_, stage_name), tasks in sorted(by_stage.items()):
        tasks = sorted(tasks, key=lambda t: t.task_id)
        lost = [t.task_id for t in tasks if not t.alive(heartbeat_timeout_s)]
        metadata: dict[str, Any] = {
            "topology_id": dg.MetadataValue.text(status.topology_id),
            "status": dg.MetadataValue.text(status.status),
            "health": dg.MetadataValue.text(stage_health(status.status, tasks, heartbeat_timeout_s)),
            "topology_health": dg.MetadataValue.text(topology_health),
            "tasks_alive": dg.MetadataValue.int(len(tasks) - len(lost)),
            "tasks_total": dg.MetadataValue.int(len(tasks)),
            "lost_tasks": dg.MetadataValue.json(lost),
            "heartbeat_age_s": dg.MetadataValue.json({str(t.task_id): t.heartbeat_age_s for t in tasks}),
            "heartbeat_age_basis": dg.MetadataValue.text(status.heartbeat_age_basis),
            "heartbeat_mzxid": dg.MetadataValue.json({str(t.task_id): t.heartbeat_fingerprint for t in tasks}),
            "committed_txid": dg.MetadataValue.json({str(t.task_id): t.committed_txid for t in tasks}),
            "min_committed_txid": dg.MetadataValue.int(min(t.committed_txid for t in tasks)),
            "max_committed_txid": dg.MetadataValue.int(max(t.committed_txid for t in tasks)),
            "max_heartbeat_age_s": dg.MetadataValue.float(_oldest_age(tasks)),
            "rows_per_s_in": dg.MetadataValue.float(float(sum(t.rows_per_s for t in tasks))),
            "rows_per_s_out": dg.MetadataValue.float(float(sum(t.rows_out_per_s for t in tasks))),
            "lag_records": dg.MetadataValue.int(sum(t.lag_records or 0 for t in tasks)),
            "lag_files": dg.MetadataValue.int(sum(t.lag_files for t in tasks)),
            "dead_letters": dg.MetadataValue.int(sum(t.dead_letters for t in tasks)),
            "state_keys": dg.MetadataValue.int(sum(t.state_keys for t in tasks)),
            "failing_tasks": dg.MetadataValue.json(_failing(tasks)),
            "quarantined_tasks": dg.MetadataValue.json([t.task_id for t in tasks if t.quarantined]),
            "standbys": dg.MetadataValue.json(
                {
                    str(t.task_id): [
                        {"worker": s.worker_id, "applied_txid": s.applied_txid, "lag_txids": s.lag_txids} for s in t.standbys
                    ]
                    for t in tasks
                    if t.standbys
                }
            ),
            "tasks": dg.MetadataValue.md(_tasks_table(tasks, heartbeat_timeout_s)),
        }
        if previous_txids is not None:
            progress = sum(max(0, t.committed_txid - previous_txids.get(t.task_id, t.committed_txid)) for t in tasks)
            metadata["txids_committed_since_last_tick"] = dg.MetadataValue.int(progress)
        observations.append(
            dg.AssetObservation(
                asset_key=translator.stream_asset_key(status.name, stage_name),
                metadata=metadata,
                tags={"stream_ops/topology_id": status.topology_id},
            )
        )
    return observations


def observe_absent_topology(
    topology_name: str,
    stage_names: Sequence[str],
    *,
    last_topology_id: str | None,
    translator: StreamOpsTranslator | None = None,
) -> list[dg.AssetObservation]:
    """Observations saying a topology has no live submission any more (killed or removed).

    Emitted once when a topology seen before disappears, so its stream assets stop showing the
    last healthy observation.

    Args:
        topology_name: The topology's name.
        stage_names: Its stage names, as last observed.
        last_topology_id: The id of the submission last observed, if known.
        translator: Maps (topology, stage) to asset keys; default :class:`StreamOpsTranslator`.
    """
    translator = translator or StreamOpsTranslator()
    return [
        dg.AssetObservation(
            asset_key=translator.stream_asset_key(topology_name, stage_name),
            metadata={
                "topology_id": dg.MetadataValue.text(last_topology_id or ""),
                "status": dg.MetadataValue.text(NOT_SUBMITTED),
                "health": dg.MetadataValue.text("inactive"),
                "topology_health": dg.MetadataValue.text("inactive"),
                "tasks_alive": dg.MetadataValue.int(0),
                "tasks_total": dg.MetadataValue.int(0),
            },
        )
        for stage_name in stage_names
    ]
