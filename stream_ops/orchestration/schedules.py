"""Schedules: periodic rebalance and periodic state compaction of one topology.

* :func:`build_rebalance_schedule` runs ``stream_ops_rebalance`` on a cron schedule. By
  default it does not quiesce the topology: it calls
  :func:`~stream_ops.nimbus.assignment.reassign`, which spreads the tasks evenly over the live
  slots (up to the workers wanted) while moving as few as possible, so workers that joined
  since the last assignment get their share and a rebalance that has nothing to move
  disturbs nothing. ``quiesce=True`` runs Storm's full rebalance instead.
* :func:`build_compaction_schedule` runs ``stream_ops_compact_state``: every state queue of
  the topology gets a snapshot at its committed txid and loses the state-topic files the
  snapshot covers, so restores replay less and the topics stop growing.

Names are deterministic: ``stream_ops_rebalance_<topology>`` and
``stream_ops_compact_state_<topology>`` (``-`` replaced by ``_``).
"""

from __future__ import annotations

import dagster as dg

from stream_ops.orchestration.run_config import ROLE_TAG, TOPOLOGY_TAG, compact_run_config, rebalance_run_config
from stream_ops.orchestration.translator import python_identifier

__all__ = ["build_compaction_schedule", "build_rebalance_schedule"]


def build_rebalance_schedule(
    *,
    topology_name: str,
    rebalance_job: dg.JobDefinition,
    cron_schedule: str = "*/15 * * * *",
    quiesce: bool = False,
    wait_s: float = 0.0,
    name: str | None = None,
    default_status: dg.DefaultScheduleStatus = dg.DefaultScheduleStatus.STOPPED,
) -> dg.ScheduleDefinition:
    """A schedule rebalancing ``topology_name`` periodically.

    Args:
        topology_name: The topology to rebalance.
        rebalance_job: The ``stream_ops_rebalance`` job.
        cron_schedule: When to run (default every 15 minutes).
        quiesce: Storm's full rebalance (pause, reassign, resume) instead of a sticky reassign.
        wait_s: With ``quiesce``, seconds to stay paused before reassigning.
        name: Schedule name; default ``stream_ops_rebalance_<topology>``.
        default_status: Whether the schedule runs as soon as the code location loads.

    Returns:
        The schedule definition.

    Example:
        >>> from stream_ops.orchestration.jobs import build_jobs
        >>> build_rebalance_schedule(topology_name="wordcount", rebalance_job=build_jobs().rebalance).name
        'stream_ops_rebalance_wordcount'
    """
    if wait_s < 0:
        raise ValueError(f"build_rebalance_schedule: wait_s must not be negative, got {wait_s}")
    how = f"Storm's rebalance (pause {wait_s:g}s)" if quiesce else "sticky reassign, nothing paused"
    return dg.ScheduleDefinition(
        name=name or f"stream_ops_rebalance_{python_identifier(topology_name)}",
        job=rebalance_job,
        cron_schedule=cron_schedule,
        run_config=rebalance_run_config(topology_name, quiesce=quiesce, wait_s=wait_s),
        tags={TOPOLOGY_TAG: topology_name, ROLE_TAG: "rebalance", "stream_ops/trigger": "schedule"},
        default_status=default_status,
        description=f"Spreads the tasks of {topology_name} over the live worker slots ({how}), so workers that "
        "joined since get their share.",
    )


def build_compaction_schedule(
    *,
    topology_name: str,
    compact_job: dg.JobDefinition,
    cron_schedule: str = "0 * * * *",
    name: str | None = None,
    default_status: dg.DefaultScheduleStatus = dg.DefaultScheduleStatus.STOPPED,
) -> dg.ScheduleDefinition:
    """A schedule compacting every state queue of ``topology_name`` periodically.

    Args:
        topology_name: The topology whose state to compact.
        compact_job: The ``stream_ops_compact_state`` job.
        cron_schedule: When to run (default hourly).
        name: Schedule name; default ``stream_ops_compact_state_<topology>``.
        default_status: Whether the schedule runs as soon as the code location loads.

    Returns:
        The schedule definition.

    Example:
        >>> from stream_ops.orchestration.jobs import build_jobs
        >>> build_compaction_schedule(topology_name="wordcount", compact_job=build_jobs().compact_state).name
        'stream_ops_compact_state_wordcount'
    """
    return dg.ScheduleDefinition(
        name=name or f"stream_ops_compact_state_{python_identifier(topology_name)}",
        job=compact_job,
        cron_schedule=cron_schedule,
        run_config=compact_run_config(topology_name),
        tags={TOPOLOGY_TAG: topology_name, ROLE_TAG: "compact_state", "stream_ops/trigger": "schedule"},
        default_status=default_status,
        description=f"Snapshots every state queue of {topology_name} at its committed txid and deletes the "
        "state-topic files the snapshot covers.",
    )
