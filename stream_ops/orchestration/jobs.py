"""Dagster jobs for the Nimbus verbs and for running workers.

Each job is one op that calls the library function the CLI calls too:

=============================  ==============================================================
job                            library call
=============================  ==============================================================
``stream_ops_worker``          a ``stream-ops worker`` process
                               (:mod:`stream_ops.orchestration.worker_process`), with the Spark
                               settings of dagster-pyspark's ``LazyPySparkResource``
``stream_ops_rebalance``       :func:`~stream_ops.nimbus.rebalance.rebalance`, or
                               :func:`~stream_ops.nimbus.assignment.reassign` (with the slots
                               of lost tasks excluded) when the heartbeat sensor asks, or
                               :func:`~stream_ops.nimbus.assignment.spread_topology` when it
                               asks for a spread (as the nimbus monitor does)
``stream_ops_activate``        :func:`~stream_ops.nimbus.submission.activate`
``stream_ops_deactivate``      :func:`~stream_ops.nimbus.submission.deactivate`
``stream_ops_kill``            :func:`~stream_ops.nimbus.submission.kill`
``stream_ops_compact_state``   :func:`~stream_ops.state.snapshot.compact_queue` per queue
=============================  ==============================================================

The jobs are cluster-wide: which topology they act on is run configuration (``topology``: a
name or an id). :func:`build_jobs` fills in the first topology of the code location as the
launchpad's default.

Worker runs. A worker is one long-running run. Its topology code never runs in the run's
process, which holds the Dagster instance and its database password: the op starts the
``stream-ops worker`` process the cluster scripts start, with the allow-listed environment of
:mod:`stream_ops.topology_env` and its secrets on its stdin
(:mod:`stream_ops.orchestration.worker_process`), and stops it (SIGTERM: the worker stops its
queries and releases its tasks' ownership, handing tasks over to their standbys) when either

* the run is terminated: Dagster interrupts the op (``DagsterExecutionInterruptedError``), or
* the run's status becomes CANCELING (polled every ``status_poll_s``; covers run launchers
  that do not interrupt).

If the run's process dies, even by SIGKILL, the worker's stdin reaches its end and the worker
stops the same way. A worker that exits by itself with an error fails the run (``dg.Failure``
with its last output). The ``pyspark`` resource is dagster-pyspark's ``LazyPySparkResource``: it
declares the workers' Spark settings and starts no SparkSession in the run's process.

Note: this module does not use ``from __future__ import annotations`` because Dagster reads
the resource and config parameters' annotations of the decorated functions at definition time.
"""

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import dagster as dg
from dagster_pyspark import LazyPySparkResource

from stream_ops.coordination.acl import require_auth
from stream_ops.nimbus.assignment import read_assignment, reassign, spread_topology
from stream_ops.nimbus.rebalance import rebalance
from stream_ops.nimbus.status import describe_topology, lost_tasks_now
from stream_ops.nimbus.submission import activate, deactivate, find_topology_id, kill
from stream_ops.orchestration.markdown import table
from stream_ops.orchestration.resources import StreamClusterResource, ZooKeeperResource
from stream_ops.orchestration.run_config import (
    ACTIVATE_JOB_NAME,
    ACTIVATE_OP,
    COMPACT_OP,
    COMPACT_STATE_JOB_NAME,
    DEACTIVATE_JOB_NAME,
    DEACTIVATE_OP,
    KILL_JOB_NAME,
    KILL_OP,
    REBALANCE_JOB_NAME,
    REBALANCE_OP,
    ROLE_TAG,
    TOPOLOGY_TAG,
    WORKER_JOB_NAME,
    WORKER_OP,
    ActivateConfig,
    CompactStateConfig,
    KillConfig,
    RebalanceConfig,
    WorkerConfig,
    compact_run_config,
    rebalance_run_config,
    worker_run_config,
)
from stream_ops.orchestration.state import build_compact_op
from stream_ops.orchestration.translator import StreamOpsTranslator
from stream_ops.orchestration.worker_process import WorkerProcess, worker_launch
from stream_ops.ports import free_port

__all__ = [
    "ACTIVATE_JOB_NAME",
    "COMPACT_STATE_JOB_NAME",
    "DEACTIVATE_JOB_NAME",
    "KILL_JOB_NAME",
    "REBALANCE_JOB_NAME",
    "ROLE_TAG",
    "TOPOLOGY_TAG",
    "WORKER_JOB_NAME",
    "ActivateConfig",
    "CompactStateConfig",
    "KillConfig",
    "RebalanceConfig",
    "StreamOpsJobs",
    "WorkerConfig",
    "build_jobs",
    "compact_run_config",
    "rebalance_run_config",
    "worker_run_config",
]

logger = logging.getLogger(__name__)

#: Longest time the worker op waits for the worker to stop after being asked to.
_WORKER_STOP_TIMEOUT_S = 120.0


# --- ops ----------------------------------------------------------------------------------------


def _assignment_md(tasks: dict[int, str]) -> str:
    return table(["task", "worker"], sorted(tasks.items()), ["---:", "---"])


@dg.op(name=ACTIVATE_OP, tags={ROLE_TAG: "activate"})
def _activate_op(context: dg.OpExecutionContext, config: ActivateConfig, zookeeper: ZooKeeperResource) -> str:
    """Resume a deactivated topology (``stream-ops activate``)."""
    with zookeeper.store() as store:
        topology_id = activate(store, config.topology)
    context.log.info(f"{topology_id} is ACTIVE")
    context.add_output_metadata({"topology_id": topology_id, "status": "ACTIVE"})
    return topology_id


@dg.op(name=DEACTIVATE_OP, tags={ROLE_TAG: "deactivate"})
def _deactivate_op(context: dg.OpExecutionContext, config: ActivateConfig, zookeeper: ZooKeeperResource) -> str:
    """Pause a topology: workers stop its queries, state and checkpoints are kept (``stream-ops deactivate``)."""
    with zookeeper.store() as store:
        topology_id = deactivate(store, config.topology)
    context.log.info(f"{topology_id} is INACTIVE")
    context.add_output_metadata({"topology_id": topology_id, "status": "INACTIVE"})
    return topology_id


@dg.op(name=KILL_OP, tags={ROLE_TAG: "kill"})
def _kill_op(context: dg.OpExecutionContext, config: KillConfig, zookeeper: ZooKeeperResource) -> str:
    """Kill a topology and remove its znodes; files are kept (``stream-ops kill``)."""
    with zookeeper.store() as store:
        topology_id = kill(store, config.topology, wait_s=config.wait_s)
    context.log.info(f"killed {topology_id}")
    context.add_output_metadata({"topology_id": topology_id, "status": "KILLED"})
    return topology_id


@dg.op(name=REBALANCE_OP, tags={ROLE_TAG: "rebalance"})
def _rebalance_op(context: dg.OpExecutionContext, config: RebalanceConfig, zookeeper: ZooKeeperResource) -> dict[str, Any]:
    """Rebalance a topology (see :class:`RebalanceConfig` for the four ways)."""
    with zookeeper.store() as store:
        topology_id = find_topology_id(store, config.topology)
        assert topology_id is not None
        before = read_assignment(store, topology_id)
        before_tasks = dict(before[0].tasks) if before else {}
        excluded: list[str] = []
        if config.spread_slots:
            spread = spread_topology(store, topology_id, slots=config.spread_slots)
            how = "spread" if spread is not None else "nothing (already spread)"
            record, epoch = spread if spread is not None else ((before[0], before[1]) if before else (None, -1))
        elif config.lost_tasks:
            live = set(describe_topology(store, topology_id).workers_live)
            seen = {int(t): (None if fp < 0 else fp) for t, fp in config.lost_heartbeats.items()}
            lost_now = lost_tasks_now(store, topology_id, config.lost_tasks, seen=seen, timeout_s=config.heartbeat_timeout_s)
            if not lost_now:
                context.log.info(f"{topology_id}: tasks {config.lost_tasks} are alive again; nothing to rebalance")
                how = "nothing (recovered)"
                record, epoch = (before[0], before[1]) if before else (None, -1)
            else:
                # A lost task on a worker that is still registered marks its slot as bad (as the
                # nimbus monitor does): all its tasks move. reassign ignores an exclusion of every slot.
                excluded = sorted({t.assigned_to for t in lost_now if t.assigned_to is not None and t.assigned_to in live})
                how = "reassign (lost tasks)"
                context.log.info(
                    f"{topology_id}: reassigning lost tasks {[t.task_id for t in lost_now]}"
                    + (f", excluding slots with stale heartbeats {excluded}" if excluded else "")
                )
                record, epoch = reassign(store, topology_id, exclude_slots=excluded)
        elif config.quiesce or config.workers is not None:
            how = "rebalance"
            record, epoch = rebalance(store, topology_id, workers=config.workers, wait_s=config.wait_s)
        else:
            how = "reassign"
            record, epoch = reassign(store, topology_id)
    after_tasks = dict(record.tasks) if record is not None else {}
    moved = {t: f"{before_tasks.get(t) or '-'} -> {w}" for t, w in sorted(after_tasks.items()) if before_tasks.get(t) != w}
    if moved:
        context.log.info(f"{topology_id}: epoch {epoch}, moved {moved}")
    elif not how.startswith("nothing"):
        context.log.info(f"{topology_id}: nothing had to move (epoch {epoch})")
    context.add_output_metadata(
        {
            "topology_id": topology_id,
            "how": how,
            "assignment_epoch": epoch,
            "moved_tasks": dg.MetadataValue.json({str(t): m for t, m in moved.items()}),
            "excluded_slots": dg.MetadataValue.json(excluded),
            "assignment": dg.MetadataValue.md(_assignment_md(after_tasks)),
        }
    )
    return {"topology_id": topology_id, "epoch": epoch, "moved": moved, "how": how}


def _run_is_canceling(context: dg.OpExecutionContext) -> bool:
    run = context.instance.get_run_by_id(context.run_id)
    return run is not None and run.status in (dg.DagsterRunStatus.CANCELING, dg.DagsterRunStatus.CANCELED)


@dg.op(name=WORKER_OP, tags={ROLE_TAG: "worker"})
def _worker_op(
    context: dg.OpExecutionContext,
    config: WorkerConfig,
    zookeeper: ZooKeeperResource,
    stream_cluster: StreamClusterResource,
    pyspark: LazyPySparkResource,
) -> dict[str, Any]:
    """Run one worker slot (a ``stream-ops worker`` process) until the run is terminated; its tasks
    are released when it stops."""
    zk_config = zookeeper.config()
    require_auth(zk_config, "worker")  # ZooKeeperResource.insecure for a local development stack only
    with zookeeper.store():
        pass  # unreachable ZooKeeper, wrong credentials, a tree not the cluster's: fail here, before a JVM starts
    port = config.port or free_port(stream_cluster.worker_bind_host)
    settings = stream_cluster.worker_settings(port=port, launched_by=f"dagster:{context.run_id}")
    launch = worker_launch(
        zk_config, stream_cluster.config(), settings, pyspark.spark_config, pass_env=stream_cluster.worker_pass_env
    )
    started = time.monotonic()
    worker = WorkerProcess.start(launch)
    context.log.info(f"worker {launch.worker_id} starting (process {worker.pid})")
    reason = "worker ended by itself"
    try:
        while worker.wait(config.status_poll_s) is None:
            if _run_is_canceling(context):
                reason = "run is being terminated"
                context.log.info(f"worker {launch.worker_id}: {reason}; stopping it and releasing its tasks")
                break
    except (dg.DagsterExecutionInterruptedError, KeyboardInterrupt):
        reason = "run was interrupted"
        context.log.info(f"worker {launch.worker_id}: {reason}; stopping it and releasing its tasks")
        raise
    finally:
        worker.stop(_WORKER_STOP_TIMEOUT_S, context.log)
    seconds = round(time.monotonic() - started, 1)
    code = worker.returncode
    if code != 0 and not worker.killed:
        raise dg.Failure(
            description=f"worker {launch.worker_id} failed after {seconds}s (exit code {code}); its last output:\n"
            f"{worker.tail()}",
            metadata={"worker_id": launch.worker_id, "exit_code": code},
        )
    context.log.info(f"worker {launch.worker_id} stopped after {seconds}s ({reason})")
    context.add_output_metadata({"worker_id": launch.worker_id, "seconds": seconds, "stopped_because": reason})
    return {"worker_id": launch.worker_id, "seconds": seconds, "stopped_because": reason}


# --- jobs ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamOpsJobs:
    """The jobs of one code location, as built by :func:`build_jobs`."""

    worker: dg.JobDefinition
    rebalance: dg.JobDefinition
    activate: dg.JobDefinition
    deactivate: dg.JobDefinition
    kill: dg.JobDefinition
    compact_state: dg.JobDefinition

    @property
    def all(self) -> list[dg.JobDefinition]:
        """Everything to pass to :class:`dagster.Definitions` ``jobs=``."""
        return [self.worker, self.rebalance, self.activate, self.deactivate, self.kill, self.compact_state]


def build_jobs(
    *,
    topology_names: Sequence[str] = (),
    translator: StreamOpsTranslator | None = None,
) -> StreamOpsJobs:
    """Build the worker, rebalance, activate, deactivate, kill and compact-state jobs.

    Args:
        topology_names: The code location's topologies; the first is the launchpad default.
        translator: Maps (topology, stage) to asset keys; the compact job records
            materializations of the state assets it rewrites.

    Returns:
        The jobs; they need the ``zookeeper`` and ``stream_cluster`` resources, and the worker
        job also ``pyspark``.

    Example:
        >>> jobs = build_jobs(topology_names=["wordcount"])
        >>> [job.name for job in jobs.all][:2]
        ['stream_ops_worker', 'stream_ops_rebalance']
    """
    translator = translator or StreamOpsTranslator()
    default = topology_names[0] if topology_names else None

    def defaults(op_name: str, **values: Any) -> dict[str, Any]:
        """``@dg.job`` keyword arguments: ``config=`` with the launchpad default, or none without a topology.

        Unpacked (``**defaults(...)``) rather than passing ``config=None``: dagster accepts None, but its
        ``@job`` overload does not declare it.
        """
        if default is None:
            return {}
        return {"config": {"ops": {op_name: {"config": {"topology": default, **values}}}}}

    @dg.job(
        name=WORKER_JOB_NAME,
        description="One stream_ops worker slot (a stream-ops worker process with LazyPySparkResource's Spark "
        "settings), running until the run is terminated; terminating it stops the worker and releases its tasks.",
        executor_def=dg.in_process_executor,
        tags={ROLE_TAG: "worker"},
    )
    def worker_job() -> None:
        _worker_op()

    @dg.job(
        name=REBALANCE_JOB_NAME,
        description="Rebalance a topology over the live worker slots (stream-ops rebalance).",
        executor_def=dg.in_process_executor,
        tags={ROLE_TAG: "rebalance"},
        **defaults(REBALANCE_OP),
    )
    def rebalance_job() -> None:
        _rebalance_op()

    @dg.job(
        name=ACTIVATE_JOB_NAME,
        description="Resume a deactivated topology (stream-ops activate).",
        executor_def=dg.in_process_executor,
        tags={ROLE_TAG: "activate"},
        **defaults(ACTIVATE_OP),
    )
    def activate_job() -> None:
        _activate_op()

    @dg.job(
        name=DEACTIVATE_JOB_NAME,
        description="Pause a topology; state and checkpoints are kept (stream-ops deactivate).",
        executor_def=dg.in_process_executor,
        tags={ROLE_TAG: "deactivate"},
        **defaults(DEACTIVATE_OP),
    )
    def deactivate_job() -> None:
        _deactivate_op()

    @dg.job(
        name=KILL_JOB_NAME,
        description="Kill a topology and remove its znodes; files are kept (stream-ops kill).",
        executor_def=dg.in_process_executor,
        tags={ROLE_TAG: "kill"},
        **defaults(KILL_OP),
    )
    def kill_job() -> None:
        _kill_op()

    compact_op = build_compact_op(name=COMPACT_OP, translator=translator, topology_names=topology_names)

    @dg.job(
        name=COMPACT_STATE_JOB_NAME,
        description="Compact every state queue of a topology: snapshot up to the committed txid, then delete the "
        "state-topic files the snapshot covers.",
        executor_def=dg.in_process_executor,
        tags={ROLE_TAG: "compact_state"},
        **defaults(COMPACT_OP),
    )
    def compact_job() -> None:
        compact_op()

    return StreamOpsJobs(
        worker=worker_job,
        rebalance=rebalance_job,
        activate=activate_job,
        deactivate=deactivate_job,
        kill=kill_job,
        compact_state=compact_job,
    )
