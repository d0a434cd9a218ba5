"""The health overview of a topology: one asset with a table of its tasks and a one-word health.

Per topology, the asset ``stream_ops/<topology>/health`` (downstream of its stream assets):

* its **materialization** metadata holds the one-word ``health`` (``healthy``: every task
  alive; ``degraded``: some; ``down``: none; ``inactive``: the topology is not ACTIVE;
  ``not_submitted``: no live submission), a ``tasks`` table (:data:`TASKS_TABLE_SCHEMA`:
  stage, queue, owner, alive, heartbeat age, lag, committed txid, rows/s) and numeric totals
  (tasks alive, oldest heartbeat, lag, committed txids, rows/s, dead letters) that Dagster
  plots over time;
* its **check** ``topology_health`` passes when the topology is healthy (or not expected to
  run) and fails with severity WARN when degraded, ERROR when down. Dagster's asset catalog
  list shows an asset whose latest materialization has a failed ERROR check in red, with a
  failed-check icon; the check's description starts with the one-word health.

The heartbeat sensor records both on every tick (:func:`health_events`), as part of the same
tick that observes the stream assets. Materializing the asset (UI or a run) does the same from
ZooKeeper, with heartbeat ages rebuilt from the sensor's recorded observations.

Note: this module does not use ``from __future__ import annotations`` because Dagster reads
the resource parameters' annotations of the decorated function at definition time.
"""

import time
from collections.abc import Iterator, Sequence
from typing import Any

import dagster as dg

from stream_ops.nimbus.status import TaskStatus, TopologyStatus, describe_topology
from stream_ops.nimbus.submission import find_topology_id
from stream_ops.orchestration.checks import CheckOutcome, observation_history, tracker_from_observations
from stream_ops.orchestration.resources import ZooKeeperResource
from stream_ops.orchestration.translator import StreamOpsTranslator
from stream_ops.topology.plan import Plan

__all__ = [
    "NOT_SUBMITTED_HEALTH",
    "TASKS_TABLE_SCHEMA",
    "TOPOLOGY_HEALTH",
    "absent_health_events",
    "build_health_asset",
    "health_check_outcome",
    "health_events",
    "health_metadata",
]

#: Name of the check on the health asset.
TOPOLOGY_HEALTH = "topology_health"
#: The one-word health of a topology without a live submission.
NOT_SUBMITTED_HEALTH = "not_submitted"

#: Columns of the health asset's ``tasks`` table.
TASKS_TABLE_SCHEMA = dg.TableSchema(
    columns=[
        dg.TableColumn(name="task", type="int", description="Task id."),
        dg.TableColumn(name="stage", type="string", description="The task's stage."),
        dg.TableColumn(name="queue", type="int", description="The queue (partition) it reads."),
        dg.TableColumn(name="owner", type="string", description="Worker slot owning it (host:port), empty if none."),
        dg.TableColumn(name="alive", type="bool", description="Owned, with a heartbeat younger than the timeout."),
        dg.TableColumn(name="heartbeat_age_s", type="float", description="Heartbeat age in seconds; empty: no heartbeat."),
        dg.TableColumn(name="lag_records", type="int", description="Input records not processed yet; empty: not countable."),
        dg.TableColumn(name="lag_files", type="int", description="Input files not processed yet."),
        dg.TableColumn(name="committed_txid", type="int", description="Last committed txid (-1: none yet)."),
        dg.TableColumn(name="rows_per_s_in", type="float", description="Rows per second read."),
        dg.TableColumn(name="error", type="string", description="Last error of a failing task, empty if none."),
    ]
)


def _task_record(task: TaskStatus, heartbeat_timeout_s: float) -> dg.TableRecord:
    age = task.heartbeat_age_s
    return dg.TableRecord(
        data={
            "task": task.task_id,
            "stage": task.stage_name,
            "queue": task.queue,
            "owner": task.owner or "",
            "alive": task.alive(heartbeat_timeout_s),
            "heartbeat_age_s": round(float(age), 1) if age is not None else None,
            "lag_records": task.lag_records,
            "lag_files": task.lag_files,
            "committed_txid": task.committed_txid,
            "rows_per_s_in": round(float(task.rows_per_s), 1),
            "error": (task.last_error or "")[:200] if task.failing else "",
        }
    )


def health_metadata(status: TopologyStatus, heartbeat_timeout_s: float) -> dict[str, Any]:
    """The health asset's metadata for ``status``: health word, tasks table, numeric totals."""
    tasks = sorted(status.tasks, key=lambda t: t.task_id)
    alive = [t for t in tasks if t.alive(heartbeat_timeout_s)]
    ages = [float(t.heartbeat_age_s) for t in tasks if t.heartbeat_age_s is not None]
    txids = [t.committed_txid for t in tasks]
    return {
        "health": dg.MetadataValue.text(status.health(heartbeat_timeout_s)),
        "status": dg.MetadataValue.text(status.status),
        "topology_id": dg.MetadataValue.text(status.topology_id),
        "tasks": dg.MetadataValue.table(records=[_task_record(t, heartbeat_timeout_s) for t in tasks], schema=TASKS_TABLE_SCHEMA),
        "tasks_alive": dg.MetadataValue.int(len(alive)),
        "tasks_total": dg.MetadataValue.int(len(tasks)),
        "lost_tasks": dg.MetadataValue.json([t.task_id for t in tasks if not t.alive(heartbeat_timeout_s)]),
        "workers_live": dg.MetadataValue.int(len(status.workers_live)),
        "workers_wanted": dg.MetadataValue.int(status.workers_wanted),
        "max_heartbeat_age_s": dg.MetadataValue.float(round(max(ages), 3) if ages else -1.0),
        "lag_records": dg.MetadataValue.int(sum(t.lag_records or 0 for t in tasks)),
        "lag_files": dg.MetadataValue.int(sum(t.lag_files for t in tasks)),
        "min_committed_txid": dg.MetadataValue.int(min(txids, default=-1)),
        "max_committed_txid": dg.MetadataValue.int(max(txids, default=-1)),
        "rows_per_s_in": dg.MetadataValue.float(float(sum(t.rows_per_s for t in tasks))),
        "dead_letters": dg.MetadataValue.int(sum(t.dead_letters for t in tasks)),
        "failing_tasks": dg.MetadataValue.int(sum(1 for t in tasks if t.failing)),
        "heartbeat_age_basis": dg.MetadataValue.text(status.heartbeat_age_basis),
    }


def health_check_outcome(asset_key: dg.AssetKey, status: TopologyStatus | None, heartbeat_timeout_s: float) -> CheckOutcome:
    """The ``topology_health`` check of one topology (``status`` None: no live submission).

    Passes when healthy or not expected to run (inactive); fails WARN when degraded, ERROR when
    down or not submitted. The description starts with the one-word health.
    """
    if status is None:
        return CheckOutcome(
            asset_key,
            TOPOLOGY_HEALTH,
            False,
            dg.AssetCheckSeverity.ERROR,
            f"{NOT_SUBMITTED_HEALTH}: no live submission; materialize the submission asset",
            {"health": dg.MetadataValue.text(NOT_SUBMITTED_HEALTH)},
        )
    health = status.health(heartbeat_timeout_s)
    alive = sum(t.alive(heartbeat_timeout_s) for t in status.tasks)
    metadata: dict[str, Any] = {
        "health": dg.MetadataValue.text(health),
        "tasks_alive": dg.MetadataValue.int(alive),
        "tasks_total": dg.MetadataValue.int(len(status.tasks)),
    }
    summary = f"{alive} of {len(status.tasks)} tasks alive"
    if health == "healthy":
        return CheckOutcome(asset_key, TOPOLOGY_HEALTH, True, dg.AssetCheckSeverity.WARN, f"healthy: {summary}", metadata)
    if health == "inactive":
        return CheckOutcome(
            asset_key,
            TOPOLOGY_HEALTH,
            True,
            dg.AssetCheckSeverity.WARN,
            f"inactive: topology is {status.status}, no task is expected to run",
            metadata,
        )
    severity = dg.AssetCheckSeverity.ERROR if health == "down" else dg.AssetCheckSeverity.WARN
    lost = sorted(t.task_id for t in status.tasks if not t.alive(heartbeat_timeout_s))
    return CheckOutcome(asset_key, TOPOLOGY_HEALTH, False, severity, f"{health}: {summary}, lost tasks {lost}", metadata)


def health_events(
    status: TopologyStatus,
    *,
    translator: StreamOpsTranslator,
    heartbeat_timeout_s: float,
) -> list[dg.AssetMaterialization | dg.AssetCheckEvaluation]:
    """What the heartbeat sensor records on a topology's health asset each tick (pure)."""
    key = translator.health_asset_key(status.name)
    metadata = health_metadata(status, heartbeat_timeout_s)
    outcome = health_check_outcome(key, status, heartbeat_timeout_s)
    return [
        dg.AssetMaterialization(
            asset_key=key,
            description=outcome.description,
            metadata=metadata,
            tags={"stream_ops/topology_id": status.topology_id},
        ),
        outcome.to_evaluation(),
    ]


def absent_health_events(
    topology_name: str,
    *,
    last_topology_id: str | None,
    translator: StreamOpsTranslator,
) -> list[dg.AssetMaterialization | dg.AssetCheckEvaluation]:
    """The health asset's events once a topology seen before has no live submission any more."""
    key = translator.health_asset_key(topology_name)
    outcome = health_check_outcome(key, None, 0.0)
    return [
        dg.AssetMaterialization(
            asset_key=key,
            description=outcome.description,
            metadata={
                "health": dg.MetadataValue.text(NOT_SUBMITTED_HEALTH),
                "status": dg.MetadataValue.text("NOT_SUBMITTED"),
                "topology_id": dg.MetadataValue.text(last_topology_id or ""),
                "tasks": dg.MetadataValue.table(records=[], schema=TASKS_TABLE_SCHEMA),
                "tasks_alive": dg.MetadataValue.int(0),
                "tasks_total": dg.MetadataValue.int(0),
            },
        ),
        outcome.to_evaluation(),
    ]


def _read_status(
    context: dg.AssetExecutionContext, zookeeper: ZooKeeperResource, topology_name: str, stream_keys: Sequence[dg.AssetKey]
) -> TopologyStatus | None:
    """The topology's status now, heartbeat ages rebuilt from the sensor's recorded observations."""
    history = [item for key in stream_keys for item in observation_history(context.instance, key)]
    now = time.time()
    with zookeeper.store() as store:
        topology_id = find_topology_id(store, topology_name, missing_ok=True)
        if topology_id is None:
            return None
        tracker = tracker_from_observations(history, topology_id=topology_id)
        return describe_topology(store, topology_id, clock=lambda: now, tracker=tracker)


def build_health_asset(
    *,
    plan: Plan,
    translator: StreamOpsTranslator,
    heartbeat_timeout_s: float = 10.0,
) -> dg.AssetsDefinition:
    """The health overview asset of one topology, with its ``topology_health`` check.

    Materializing it reads the topology from ZooKeeper and reports what the heartbeat sensor
    reports on every tick. It depends on the topology's stream assets (it sums them up).

    Args:
        plan: The topology's plan.
        translator: Naming of keys and groups.
        heartbeat_timeout_s: A task is alive if owned and its heartbeat is at most this old
            (use the heartbeat sensor's).

    Returns:
        An asset requiring the ``zookeeper`` resource.
    """
    topology_name = plan.topology
    key = translator.health_asset_key(topology_name)
    stream_keys = [translator.stream_asset_key(topology_name, stage.name) for stage in plan.stages]

    @dg.asset(
        key=key,
        deps=stream_keys,
        description=(
            f"Health of topology `{topology_name}` at a glance: the one-word health (healthy, degraded, down, "
            "inactive, not_submitted), a table of its tasks (owner, heartbeat age, lag, committed txid) and totals "
            "to plot. Recorded by the heartbeat sensor on every tick; the topology_health check fails when it is "
            "degraded (WARN) or down (ERROR)."
        ),
        group_name=translator.group_name(topology_name),
        kinds={"zookeeper"},
        check_specs=[
            dg.AssetCheckSpec(
                name=TOPOLOGY_HEALTH,
                asset=key,
                description="The topology is healthy: fails WARN when degraded, ERROR when down or not submitted. "
                "Evaluated by the heartbeat sensor on every tick.",
            )
        ],
        metadata={
            "stream_ops/topology": dg.MetadataValue.text(topology_name),
            "stream_ops/tasks_schema": dg.MetadataValue.table_schema(TASKS_TABLE_SCHEMA),
        },
        op_tags={"stream_ops/topology": topology_name},
    )
    def _health(context: dg.AssetExecutionContext, zookeeper: ZooKeeperResource) -> Iterator[dg.MaterializeResult]:
        status = _read_status(context, zookeeper, topology_name, stream_keys)
        outcome = health_check_outcome(key, status, heartbeat_timeout_s)
        context.log.info(f"topology {topology_name!r}: {outcome.description}")
        if status is None:
            metadata: dict[str, Any] = {
                "health": dg.MetadataValue.text(NOT_SUBMITTED_HEALTH),
                "tasks": dg.MetadataValue.table(records=[], schema=TASKS_TABLE_SCHEMA),
            }
        else:
            metadata = health_metadata(status, heartbeat_timeout_s)
        yield dg.MaterializeResult(metadata=metadata, check_results=[outcome.to_result()])

    return _health
