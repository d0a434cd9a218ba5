"""Names, run tags and run configuration of the stream_ops Dagster jobs.

Shared by the jobs (:mod:`stream_ops.orchestration.jobs`), the state compaction op
(:mod:`stream_ops.orchestration.state`) and the sensors and schedules that request runs.

Note: this module does not use ``from __future__ import annotations`` because Dagster reads
the config classes' annotations at definition time.
"""

from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg
from pydantic import Field

WORKER_JOB_NAME = "stream_ops_worker"
REBALANCE_JOB_NAME = "stream_ops_rebalance"
ACTIVATE_JOB_NAME = "stream_ops_activate"
DEACTIVATE_JOB_NAME = "stream_ops_deactivate"
KILL_JOB_NAME = "stream_ops_kill"
COMPACT_STATE_JOB_NAME = "stream_ops_compact_state"

#: Run tag naming the topology a run acts on.
TOPOLOGY_TAG = "stream_ops/topology"
#: Run tag naming what a run is for (worker, rebalance, ...).
ROLE_TAG = "stream_ops/role"

WORKER_OP = "run_worker"
REBALANCE_OP = "rebalance_topology"
ACTIVATE_OP = "activate_topology"
DEACTIVATE_OP = "deactivate_topology"
KILL_OP = "kill_topology"
COMPACT_OP = "compact_state"


# --- configuration ------------------------------------------------------------------------------


class ActivateConfig(dg.Config):
    """Which topology to act on (activate / deactivate)."""

    topology: str = Field(description="Topology name or id, e.g. 'wordcount'.")


class KillConfig(ActivateConfig):
    """Kill a topology."""

    wait_s: float = Field(
        default=0.0, ge=0, description="Seconds between setting KILLED and removing its znodes (storm kill -w)."
    )


class RebalanceConfig(ActivateConfig):
    """Rebalance a topology.

    Four ways, chosen from the fields:

    * ``spread_slots`` given (what the heartbeat sensor sets when a crowded topology has free
      stable slots): :func:`spread_topology` over them, moving the fewest tasks. Nothing stops.
    * ``lost_tasks`` given (what the heartbeat sensor sets): the tasks still lost now are
      reassigned with :func:`reassign`, their slots excluded when the worker is still registered
      (a stale heartbeat marks a bad slot, as Nimbus's monitor does). Nothing stops. "Still
      lost" is the tracker's rule (:func:`~stream_ops.nimbus.status.lost_tasks_now`): a task
      whose heartbeat changed since the sensor saw it (``lost_heartbeats``) is alive again; a
      task the sensor gave no fingerprint for is watched for ``heartbeat_timeout_s``.
    * otherwise ``quiesce`` (default): Storm's rebalance, :func:`rebalance`: REBALANCING for
      ``wait_s``, sticky reassignment over at most ``workers`` slots, then resume.
    * ``quiesce: false``: :func:`reassign` only: the fewest moves an even split over the live
      slots needs, without pausing anything (used by the periodic rebalance schedule).
    """

    workers: int | None = Field(default=None, ge=1, description="New number of worker slots wanted (stored with the topology).")
    wait_s: float = Field(default=0.0, ge=0, description="Seconds to stay REBALANCING before reassigning.")
    quiesce: bool = Field(
        default=True, description="Pause the topology during the rebalance (Storm's rebalance); false: reassign only."
    )
    lost_tasks: list[int] = Field(default_factory=list, description="Tasks the heartbeat sensor saw lost; set by the sensor.")
    heartbeat_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="With lost_tasks but no lost_heartbeats entry for a task: how long to watch its heartbeat for a change.",
    )
    lost_heartbeats: dict[str, int] = Field(
        default_factory=dict,
        description="Task id -> the heartbeat fingerprint (znode mzxid, -1: none) the sensor saw when it judged the "
        "task lost; set by the sensor. A task whose heartbeat changed since is alive again.",
    )
    spread_slots: list[str] = Field(
        default_factory=list,
        description="Spread the topology over these free slots (host:port) if it uses fewer than it wants; set by the sensor.",
    )


class WorkerConfig(dg.Config):
    """One worker slot."""

    port: int = Field(default=0, ge=0, le=65535, description="Slot port; 0 picks a free port when the run starts.")
    status_poll_s: float = Field(default=1.0, gt=0, description="Seconds between checks whether the run is being terminated.")


class CompactStateConfig(ActivateConfig):
    """Which state queues to compact."""

    stages: list[str] = Field(default_factory=list, description="Keyed stages to compact; empty: all.")
    queues: list[int] = Field(default_factory=list, description="Queues to compact; empty: all.")


def rebalance_run_config(
    topology: str,
    *,
    lost_tasks: Sequence[int] = (),
    heartbeat_timeout_s: float = 10.0,
    quiesce: bool = True,
    workers: int | None = None,
    wait_s: float = 0.0,
    lost_heartbeats: Mapping[int, int | None] | None = None,
    spread_slots: Sequence[str] = (),
) -> dict[str, Any]:
    """Run config of ``stream_ops_rebalance`` (what sensors and schedules request).

    ``lost_heartbeats``: task -> heartbeat fingerprint seen when it was judged lost (None: no
    heartbeat, stored as -1).
    """
    config: dict[str, Any] = {"topology": topology, "quiesce": quiesce, "wait_s": wait_s}
    if lost_tasks:
        config.update(lost_tasks=sorted(lost_tasks), heartbeat_timeout_s=heartbeat_timeout_s)
    if lost_heartbeats:
        config["lost_heartbeats"] = {str(t): (-1 if fp is None else fp) for t, fp in sorted(lost_heartbeats.items())}
    if spread_slots:
        config["spread_slots"] = sorted(spread_slots)
    if workers is not None:
        config["workers"] = workers
    return {"ops": {REBALANCE_OP: {"config": config}}}


def worker_run_config(*, port: int = 0) -> dict[str, Any]:
    """Run config of ``stream_ops_worker``."""
    return {"ops": {WORKER_OP: {"config": {"port": port}}}}


def compact_run_config(topology: str, *, stages: Sequence[str] = (), queues: Sequence[int] = ()) -> dict[str, Any]:
    """Run config of ``stream_ops_compact_state``."""
    return {"ops": {COMPACT_OP: {"config": {"topology": topology, "stages": list(stages), "queues": list(queues)}}}}
