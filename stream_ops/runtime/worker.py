"""A worker: one slot (``host:port``), one SparkSession, the tasks assigned to it.

State machine of the worker's ZooKeeper session (its session listener):

* CONNECTED: register ``/workers/{id}``, reconcile tasks with the assignment.
* SUSPENDED: keep queries running but let no batch commit (commits wait for CONNECTED).
* LOST: every ``/owners`` node of ours is gone, so every task is stopped without writing;
  when the session comes back the worker registers again and re-acquires its tasks.

Reconciliation runs on the worker's main thread whenever a watch fires (and at least every
``poll_interval_s``): tasks assigned here in ACTIVE topologies are started, others stopped.

A clean stop (SIGTERM) stops and releases all tasks in parallel; meanwhile it hands every task
that has a live standby replica elsewhere over to it (the one assignment write a worker makes,
:func:`~stream_ops.nimbus.assignment.hand_over_to_standbys`) and deletes ``/workers/{id}`` so
that the nimbus reassigns the rest. Each new owner takes its task once it is released.

Fault containment: a task that cannot be started (its plan does not load, its State factory
raises, ...) or whose query fails costs the worker nothing but that task. The error is logged
once, written to ``/errors/{id}/{task}``, and the task is tried again after a backoff and
quarantined after ``failures.quarantine_after`` failures in a row
(:mod:`stream_ops.runtime.failed_tasks`); other tasks and topologies keep running.

What is assigned here is read by :mod:`stream_ops.runtime.assigned_tasks`; each task runs in a
:class:`~stream_ops.runtime.task_runner.TaskRunner`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pyspark.sql import SparkSession

from stream_ops.config import ClusterConfig, QueryConfig, ZooKeeperConfig, query_token
from stream_ops.coordination.acl import require_auth
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import StormRecord, WorkerRecord
from stream_ops.coordination.session import ConnectionState
from stream_ops.coordination.store import ZkStore, ZnodeStat
from stream_ops.coordination.watches import watch_children, watch_data
from stream_ops.durable_files import apply_umask
from stream_ops.errors import (
    CoordinationError,
    OwnershipLostError,
    StreamOpsError,
    TaskBusyError,
    TransientError,
    WorkerError,
    ZnodeExistsError,
    ZooKeeperUnavailableError,
)
from stream_ops.nimbus.assignment import hand_over_to_standbys
from stream_ops.runtime.assigned_tasks import AssignmentReader
from stream_ops.runtime.failed_tasks import FailedTasks
from stream_ops.runtime.heartbeat import beat
from stream_ops.runtime.process_limits import raise_open_files_limit
from stream_ops.runtime.query_limits import QueryLimits
from stream_ops.runtime.query_server import QueryServer, server_tls_context
from stream_ops.runtime.standby import StandbyPool
from stream_ops.runtime.task_failures import FailurePolicy, describe_error
from stream_ops.runtime.task_runner import RunnerSettings, TaskRunner
from stream_ops.runtime.user_code import load_user_code
from stream_ops.spark.session import create_spark_session
from stream_ops.state.auto_snapshot import SnapshotPolicy
from stream_ops.topology.layout import TopologyLayout
from stream_ops.topology.plan import Plan

logger = logging.getLogger(__name__)

#: Seconds between two log lines about the same task waiting (busy owner, ZooKeeper trouble).
WAIT_LOG_EVERY_S = 5.0


class WorkerSettings(BaseModel):
    """How a worker runs."""

    # Errors never repeat the input: query.token is a secret.
    model_config = ConfigDict(frozen=True, hide_input_in_errors=True)

    host: str = Field(default_factory=socket.gethostname, description="Host name other processes reach this worker by.")
    port: int = Field(6700, ge=1, le=65535, description="Slot port; the state-query server listens on it.")
    bind_host: str = Field("127.0.0.1", description="Interface the state-query server binds to.")
    capacity: int = Field(64, ge=1, description="Most tasks this worker runs at once.")
    heartbeat_interval_s: float = Field(2.0, gt=0)
    poll_interval_s: float = Field(0.5, gt=0)
    shutdown_timeout_s: float = Field(
        5.0,
        gt=0,
        description="On SIGTERM, how long the worker spends stopping and releasing its tasks (in parallel) before it exits.",
    )
    spark_master: str = "local[*]"
    spark_conf: dict[str, str] = Field(default_factory=dict)
    kafka_connector: bool | None = Field(
        None,
        description="Spark's Kafka connector on spark.jars: True fetches it if needed, None adds it when the jar "
        "cache has it, False never.",
    )
    trigger_seconds: float = Field(1.0, ge=0, description="Spark trigger interval of the queries that read a source.")
    shuffle_trigger_seconds: float | None = Field(
        None,
        ge=0,
        description="Trigger interval of the queries that read a shuffle (every stage after the first); None: "
        "trigger_seconds. Shorter, a batch its upstream committed waits less for the next stage (a 1.2M-word "
        "burst at trigger 0.2 s finished 15% sooner with 0.05 s), but every idle trigger costs JVM CPU (+0.15 "
        "cores on 2 busy cores at 10k records/s, with no gain in latency there).",
    )
    max_files_per_trigger: int = Field(100, ge=1)
    start_concurrency: int = Field(
        4,
        ge=1,
        description="Tasks this worker starts at once (ownership, state, Spark query). Four tasks of a word count "
        "started one after another took 2.5 s, most of it waiting for Spark to plan each query.",
    )
    launched_by: str = "cli"
    query: QueryConfig = Field(
        default_factory=QueryConfig,
        description="Token and TLS of the state-query server, also used for this worker's queries of the others.",
    )
    query_limits: QueryLimits = Field(
        default_factory=QueryLimits,
        description="Connection cap and per-request deadline of the state-query server.",
    )
    failures: FailurePolicy = Field(
        default_factory=FailurePolicy,
        description="Backoff and quarantine of tasks that fail to start or whose query fails.",
    )

    @property
    def worker_id(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def shuffle_trigger(self) -> float:
        """:attr:`shuffle_trigger_seconds`, or :attr:`trigger_seconds` when unset."""
        return self.trigger_seconds if self.shuffle_trigger_seconds is None else self.shuffle_trigger_seconds


class Worker:
    """Runs the tasks assigned to one slot until stopped.

    Example:
        >>> worker = Worker(ZooKeeperConfig(hosts="127.0.0.1:2181"), ClusterConfig(), WorkerSettings(port=6700))
        >>> worker.run(stop_event)   # blocks until stop_event is set
    """

    def __init__(
        self,
        zookeeper: ZooKeeperConfig,
        cluster: ClusterConfig,
        settings: WorkerSettings,
        *,
        spark_factory: Callable[[], SparkSession] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.zookeeper = zookeeper
        self.cluster = cluster
        self.settings = settings
        self.worker_id = settings.worker_id
        self.clock = clock
        # A session passed in by the caller (tests' shared session) is not ours to stop.
        self._owns_spark = spark_factory is None
        self._spark_factory = spark_factory or (
            lambda: create_spark_session(
                master=settings.spark_master,
                app_name=f"stream-ops-worker-{self.worker_id}",
                conf=settings.spark_conf,
                kafka_connector=settings.kafka_connector,
            )
        )
        self._connected = threading.Event()
        self._lost = threading.Event()
        self._changed = threading.Event()
        self._runners: dict[tuple[str, int], TaskRunner] = {}
        self._plans: dict[str, Plan] = {}
        self._watched: set[str] = set()
        # When something was last logged about a task or topology that waits (see _may_log).
        self._busy_logged: dict[Hashable, float] = {}
        self._failed = FailedTasks(worker_id=self.worker_id, policy=settings.failures, store=lambda: self.store, clock=clock)
        self.store: ZkStore | None = None
        self.spark: SparkSession | None = None
        self._server: QueryServer | None = None
        self._standbys: StandbyPool | None = None
        self._owner_watches: set[tuple[str, int]] = set()
        self._assignments = AssignmentReader(worker_id=self.worker_id, cluster=cluster, plan_of=self._plan, may_log=self._may_log)

    # --- session state machine ---------------------------------------------------------------

    def _on_state(self, state: ConnectionState) -> None:
        # Called on the ZooKeeper client's thread: only flip flags here.
        if state == ConnectionState.CONNECTED:
            self._connected.set()
        elif state == ConnectionState.SUSPENDED:
            self._connected.clear()
            logger.warning("worker %s: ZooKeeper SUSPENDED, commits paused", self.worker_id)
        elif state == ConnectionState.LOST:
            self._connected.clear()
            self._lost.set()
            logger.error("worker %s: ZooKeeper session LOST, stopping all tasks", self.worker_id)
        self._changed.set()

    # --- main loop ---------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Register, run assigned tasks and heartbeat until ``stop`` is set; then clean up."""
        # Before the ZooKeeper socket and the JVM (which inherits it): every state-query
        # connection, task file and py4j socket counts against this limit.
        raise_open_files_limit()
        require_auth(self.zookeeper, "worker")
        apply_umask(self.cluster.umask)
        # The JVM and SparkSession take seconds to start: they start while this thread connects
        # to ZooKeeper (and ZooKeeper itself may still be starting, as in the local stack).
        spark = self._start_spark()
        try:
            self.store = ZkStore.connect(self.zookeeper)
        except BaseException:
            self._discard_spark(spark)
            raise
        self.store.add_listener(self._on_state)
        self._connected.set()
        # A stop (SIGTERM) must not wait for ZooKeeper to come back: ZooKeeper calls in flight
        # give up at once when the connection is away, and the shutdown starts.
        threading.Thread(target=self._give_up_on_stop, args=(stop,), name="stream-ops-stop-watch", daemon=True).start()
        try:
            self.spark = spark.result()
            self._server = self._query_server()
            self._server.start()
            self._register(stop)
            watch_children(self.store, ZkPaths.ASSIGNMENTS, self._on_assignments)
            # Heartbeats run on their own thread: starting a task can take long (rebuilding a
            # large state), and the tasks already running must keep beating meanwhile.
            beats = threading.Thread(target=self._heartbeat_loop, args=(stop,), name="stream-ops-heartbeat", daemon=True)
            beats.start()
            # Standby replicas catch up on their own thread: a first rebuild can take long.
            self._standbys = StandbyPool(
                self.store, self.worker_id, interval_s=self.settings.heartbeat_interval_s, clock=self.clock
            )
            threading.Thread(
                target=self._standbys.run, args=(stop, self._connected), name="stream-ops-standbys", daemon=True
            ).start()
            while not stop.is_set():
                self._changed.wait(self.settings.poll_interval_s)
                self._changed.clear()
                if self._lost.is_set():
                    self._handle_lost(stop)
                    continue
                if not self._connected.is_set():
                    continue
                try:
                    self._reconcile()
                    self._tick(self.clock())
                except StreamOpsError as e:
                    logger.warning("worker %s: %s", self.worker_id, e)
        finally:
            self._shutdown()

    def _start_spark(self) -> Future[SparkSession]:
        """Create the SparkSession on its own thread; the future holds it (or the error).

        Off the main thread PySpark also leaves the process's SIGINT handler alone (on the
        main thread it installs its own, which raises KeyboardInterrupt instead of letting
        the worker stop cleanly)."""
        future: Future[SparkSession] = Future()

        def create() -> None:
            try:
                future.set_result(self._spark_factory())
            except BaseException as e:  # noqa: BLE001 - handed to the thread that waits for it
                future.set_exception(e)

        threading.Thread(target=create, name="stream-ops-spark-start", daemon=True).start()
        return future

    def _discard_spark(self, spark: Future[SparkSession]) -> None:
        """Stop a session started for a worker that could not start (once it exists)."""
        try:
            session = spark.result()
        except BaseException:  # noqa: BLE001 - the worker's own error is the one raised
            return
        if self._owns_spark:
            session.stop()

    def _give_up_on_stop(self, stop: threading.Event) -> None:
        stop.wait()
        self._changed.set()  # wake the main loop now, not at its next poll: the shutdown starts at once
        if self.store is not None:
            self.store.stop_waiting()

    def _tick(self, now: float) -> None:
        """Write the time-based ticks of the running tasks; one task's failing write stops no other."""
        for key, runner in list(self._runners.items()):
            try:
                runner.maybe_tick(now)
            except (OSError, StreamOpsError) as e:
                logger.warning("task %s/%d: tick not written: %s", key[0], key[1], e)

    def _heartbeat_loop(self, stop: threading.Event) -> None:
        """Write every running task's heartbeat each ``heartbeat_interval_s`` while connected."""
        while not stop.wait(self.settings.heartbeat_interval_s):
            if not self._connected.is_set() or self._lost.is_set():
                continue
            for runner in list(self._runners.values()):
                self._beat(runner)

    def _beat(self, runner: TaskRunner) -> None:
        """Write one task's heartbeat; a task whose stats cannot be read stops no other's."""
        assert self.store is not None
        try:
            if runner.is_running():
                beat(self.store, [runner], clock=self.clock)
        except Exception as e:  # noqa: BLE001 - one task's state or query; the others keep beating
            if self._may_log(("heartbeat", runner.key)):
                logger.warning("task %s/%d: heartbeat not written: %s", *runner.key, describe_error(e))

    def _register(self, stop: threading.Event) -> None:
        """Create ``/workers/{id}``; waits while a dead predecessor's node is still there."""
        assert self.store is not None
        record = WorkerRecord(
            worker_id=self.worker_id,
            host=self.settings.host,
            port=self.settings.port,
            pid=os.getpid(),
            capacity=self.settings.capacity,
            started_at=self.clock(),
            launched_by=self.settings.launched_by,
            # Clients without the CA refuse to send this worker anything (the token never goes out in clear).
            tls=self.settings.query.tls_cert is not None,
        )
        deadline = time.monotonic() + self.zookeeper.session_timeout_s * 2 + 5
        self.store.ensure_path(ZkPaths.WORKERS)
        self.store.ensure_path(ZkPaths.ASSIGNMENTS)
        while True:
            try:
                self.store.create_json(ZkPaths.worker(self.worker_id), record.to_json_obj(), ephemeral=True)
                logger.info("worker %s registered (pid %d)", self.worker_id, os.getpid())
                return
            except (ZnodeExistsError, ZooKeeperUnavailableError) as e:
                # Only a slot still held by a (dying) predecessor or a brief disconnection is
                # worth waiting for; NoAuth and the like are raised at once, with their message.
                if stop.is_set() or time.monotonic() > deadline:
                    if not isinstance(e, ZnodeExistsError):
                        raise
                    raise WorkerError(f"slot {self.worker_id} is registered by another live worker; use another --port") from e
                stop.wait(0.25)

    def _handle_lost(self, stop: threading.Event) -> None:
        # The old session's /owners nodes are gone already. A task started after the client
        # reconnected (before this loop saw LOST) holds its node in the *new* session, so
        # release still runs: it deletes only a node that names this worker and epoch.
        for key in list(self._runners):
            self._stop_runner(key)
        if self.store is None or not self.store.connected:
            return
        self._lost.clear()
        self._connected.set()
        self._watched.clear()
        self._register(stop)
        watch_children(self.store, ZkPaths.ASSIGNMENTS, self._on_assignments)

    def _on_assignments(self, children: list[str]) -> None:
        assert self.store is not None
        for topology_id in children:
            if topology_id not in self._watched:
                self._watched.add(topology_id)
                watch_data(self.store, ZkPaths.assignment(topology_id), self._on_assignment_data)
        self._changed.set()

    def _on_assignment_data(self, data: bytes | None, stat: ZnodeStat | None) -> bool | None:
        self._changed.set()
        return None if data is not None else False

    # --- reconciliation ----------------------------------------------------------------------

    def _reconcile(self) -> None:
        assert self.store is not None
        desired, standbys = self._assignments.read(self.store)
        if self._standbys is not None:
            self._standbys.update(standbys)
        now = time.monotonic()
        for key, runner in list(self._runners.items()):
            if key not in desired:
                self._stop_runner(key)
            elif not runner.is_running():
                reason = runner.failure() or "the streaming query stopped without an error"
                self._failed.failed(key, desired[key].assigned_at, f"query failed: {reason}")
                self._stop_runner(key)
            elif self._failed.recovered(key, now):
                self._failed.mark_recovered(key)
        self._failed.forget_unassigned(desired.keys())
        room = self.settings.capacity - len(self._runners)
        wanted = [
            (key, want.storm, want.assigned_at)
            for key, want in sorted(desired.items())
            if key not in self._runners and self._failed.may_start(key, want.assigned_at, now)
        ]
        self._start_runners(wanted[: max(0, room)])

    def _may_log(self, topic: Hashable) -> bool:
        """Whether to log about ``topic`` now (at most every ``WAIT_LOG_EVERY_S``)."""
        now = time.monotonic()
        if now - self._busy_logged.get(topic, float("-inf")) < WAIT_LOG_EVERY_S:
            return False
        self._busy_logged[topic] = now
        return True

    def _plan(self, storm: StormRecord) -> Plan:
        plan = self._plans.get(storm.topology_id)
        if plan is None:
            # Read from this worker's own dist store and verified against the record's integrity
            # root; the plan's code is bound to a private copy of the verified archive.
            assert self.spark is not None
            plan = load_user_code(self.cluster, storm, self.spark)
            self._plans[storm.topology_id] = plan
        return plan

    def _start_runners(self, wanted: list[tuple[tuple[str, int], StormRecord, float | None]]) -> None:
        """Start the tasks ``wanted`` (key, topology record, when assigned), up to
        ``start_concurrency`` at once.

        Starting one task is mostly waiting: ZooKeeper round trips, the state's rebuild and, the
        longest, Spark planning its streaming query (1-2 s for a worker's first). Tasks started
        one after another added those waits up; started together, they overlap. Each start takes
        ownership on its own (its own owner epoch and fencing, as before); plans are loaded
        first, on this thread, so a topology's code archive is installed once; what a start
        leads to is recorded on this thread too."""
        starts: list[tuple[tuple[str, int], StormRecord, float | None, Plan]] = []
        for key, storm, assigned_at in wanted:
            if self._standbys is not None:
                self._standbys.release(key)  # its warm store is the task's now
            try:
                plan = self._plan(storm)
            except Exception as e:  # noqa: BLE001 - the task's failure (or ZooKeeper trouble), never the worker's
                self._record_start(key, assigned_at, e)
                continue
            starts.append((key, storm, assigned_at, plan))
        if len(starts) <= 1 or self.settings.start_concurrency == 1:
            outcomes = [self._launch(key, storm, plan) for key, storm, _, plan in starts]
        else:
            with ThreadPoolExecutor(
                max_workers=min(len(starts), self.settings.start_concurrency), thread_name_prefix="stream-ops-task-start"
            ) as pool:
                outcomes = list(pool.map(lambda start: self._launch(start[0], start[1], start[3]), starts))
        for (key, _, assigned_at, _), outcome in zip(starts, outcomes, strict=True):
            self._record_start(key, assigned_at, outcome)

    def _launch(self, key: tuple[str, int], storm: StormRecord, plan: Plan) -> TaskRunner | Exception:
        """Take ownership of ``key`` and start its query; the runner, or why it did not start."""
        assert self.store is not None and self.spark is not None
        topology_id, task_id = key
        try:
            runner = TaskRunner(
                zk=self.store,
                spark=self.spark,
                layout=TopologyLayout(self.cluster, topology_id),
                plan=plan,
                task=plan.task(task_id),
                worker_id=self.worker_id,
                settings=RunnerSettings(
                    trigger_seconds=self.settings.trigger_seconds,
                    shuffle_trigger_seconds=self.settings.shuffle_trigger,
                    max_files_per_trigger=self.settings.max_files_per_trigger,
                    commit_wait_s=self.zookeeper.session_timeout_s,
                    query=self.settings.query,
                    snapshot_policy=SnapshotPolicy.from_conf(storm.conf),
                ),
                connected=self._connected,
                clock=self.clock,
            )
            runner.start()
        except Exception as e:  # noqa: BLE001 - recorded by _record_start, never the worker's failure
            return e
        return runner

    def _record_start(self, key: tuple[str, int], assigned_at: float | None, outcome: TaskRunner | Exception) -> None:
        """Keep a started runner; otherwise wait for a busy owner, retry after ZooKeeper trouble,
        or mark the task failed (any error of its plan, code or state; never the worker's)."""
        topology_id, task_id = key
        if isinstance(outcome, TaskBusyError):
            if self._may_log(key):
                logger.info("%s; waiting for its owner to go", outcome)
            self._watch_owner(key)
            return
        if isinstance(outcome, TransientError | OwnershipLostError):
            # ZooKeeper trouble or a takeover, not the task's fault: tried again on the next loop.
            if self._may_log(key):
                logger.warning("task %s/%d could not start: %s; trying again", topology_id, task_id, outcome)
            return
        if isinstance(outcome, Exception):
            logger.debug("task %s/%d: start failure", topology_id, task_id, exc_info=outcome)
            self._failed.failed(key, assigned_at, f"start failed: {describe_error(outcome)}")
            return
        self._busy_logged.pop(key, None)
        self._failed.started(key, time.monotonic())
        self._runners[key] = outcome
        logger.info("task %s/%d running on %s (epoch %d)", topology_id, task_id, self.worker_id, outcome.ownership.epoch)  # type: ignore[union-attr]
        # Its first heartbeat at once: the task shows alive from its start, not one interval later.
        self._beat(outcome)

    def _watch_owner(self, key: tuple[str, int]) -> None:
        """Wake the main loop the moment ``key``'s current owner releases it (one watch per task)."""
        if self.store is None or key in self._owner_watches:
            return
        self._owner_watches.add(key)

        def on_owner(data: bytes | None, stat: ZnodeStat | None) -> bool | None:
            if data is None:
                self._owner_watches.discard(key)
                self._changed.set()
                return False
            return None

        watch_data(self.store, ZkPaths.owner(*key), on_owner)

    def _stop_runner(self, key: tuple[str, int], *, release_ownership: bool = True, wait_s: float | None = None) -> None:
        runner = self._runners.pop(key, None)
        if runner is None:
            return
        try:
            runner.stop(release_ownership=release_ownership, wait_s=wait_s)
        except Exception as e:  # noqa: BLE001 - e.g. a user State's close(); the worker goes on
            logger.warning("task %s/%d: stopping it failed: %s", key[0], key[1], describe_error(e))
        if self.store is not None and release_ownership:
            try:
                self.store.delete(ZkPaths.heartbeat(*key))
            except CoordinationError:
                pass

    def _query_server(self) -> QueryServer:
        """The state-query server: requires the cluster's query token if there is one, TLS if configured."""
        query = self.settings.query
        token = query_token(query, self.zookeeper)
        if token is None:
            logger.warning(
                "worker %s: state queries are unauthenticated: anyone who reaches port %d can read state "
                "(run with --zk-auth or --query-token-file to require a token)",
                self.worker_id,
                self.settings.port,
            )
        tls = server_tls_context(query.tls_cert, query.tls_key) if query.tls_cert and query.tls_key else None
        return QueryServer(
            self.settings.bind_host,
            self.settings.port,
            self._lookup,
            token=token,
            tls=tls,
            limits=self.settings.query_limits,
        )

    def _lookup(self, topology_id: str, task_id: int, keys: list[tuple[Any, ...]]) -> list[Any] | None:
        runner = self._runners.get((topology_id, task_id))
        if runner is None or runner.state is None:
            return None
        return runner.lookup(keys)

    @property
    def running_tasks(self) -> list[tuple[str, int]]:
        return sorted(self._runners)

    def _shutdown(self) -> None:
        """Stop every task at once, releasing each (its next owner need not wait for our session
        to expire), all within ``shutdown_timeout_s`` whatever ZooKeeper does: what is still
        stopping then is left to the process exit, which the commit protocol makes as safe as
        a SIGKILL."""
        deadline = time.monotonic() + self.settings.shutdown_timeout_s
        wait_s = max(0.5, self.settings.shutdown_timeout_s - 1.0)
        keys = list(self._runners)
        leaver: threading.Thread | None = None
        if self.store is not None and keys:
            # While the tasks stop: hand those that have a live standby over to it and leave the
            # slot, so that the nimbus reassigns the others at once. A new owner takes its task
            # once it is both assigned and released, in either order, so neither waits for the
            # other; nor for our exit.
            leaver = threading.Thread(target=self._leave, args=(keys,), name="stream-ops-leave", daemon=True)
            leaver.start()
        stoppers = [
            threading.Thread(target=self._stop_quietly, args=(key, wait_s), name=f"stop-{key[0]}-{key[1]}", daemon=True)
            for key in keys
        ]
        for thread in stoppers:
            thread.start()
        for thread in [*stoppers, *([leaver] if leaver is not None else [])]:
            thread.join(max(0.0, deadline - time.monotonic()))
        left = [t.name for t in stoppers if t.is_alive()]
        if left:
            logger.warning(
                "worker %s: %s still stopping after %.0f s; exiting without them",
                self.worker_id,
                left,
                self.settings.shutdown_timeout_s,
            )
        if self._server is not None:
            self._server.stop()
        if self._standbys is not None:
            self._standbys.close(wait_s=max(0.1, deadline - time.monotonic()))
        if self.spark is not None and self._owns_spark and not left:
            self.spark.stop()
        if self.store is not None:
            self.store.remove_listener(self._on_state)
            closer = threading.Thread(target=self._close_store, name="stream-ops-zk-close", daemon=True)
            closer.start()
            closer.join(max(0.5, deadline - time.monotonic()))
        logger.info("worker %s stopped", self.worker_id)

    def _stop_quietly(self, key: tuple[str, int], wait_s: float) -> None:
        try:
            self._stop_runner(key, wait_s=wait_s)
        except Exception as e:  # noqa: BLE001 - keep shutting the rest down
            logger.warning("stopping task %s: %s", key, e)

    def _leave(self, keys: list[tuple[str, int]]) -> None:
        """Hand the tasks ``keys`` over to their standbys, then unregister (a clean stop)."""
        self._hand_over(keys)
        self._unregister()

    def _hand_over(self, keys: list[tuple[str, int]]) -> None:
        """Move every task of ``keys`` (the tasks we run) that has a live standby on another
        worker onto it, one compare-and-set of its topology's assignment (see
        :func:`~stream_ops.nimbus.assignment.hand_over_to_standbys`).

        Only the assignment changes: each task stays ours until :meth:`_stop_runner` releases
        it, and its new owner takes it after that under a higher owner epoch."""
        assert self.store is not None
        if not self.store.connected:
            return
        by_topology: dict[str, list[int]] = {}
        for topology_id, task_id in keys:
            by_topology.setdefault(topology_id, []).append(task_id)
        for topology_id, task_ids in sorted(by_topology.items()):
            try:
                hand_over_to_standbys(self.store, topology_id, self.worker_id, task_ids, clock=self.clock)
            except StreamOpsError as e:
                logger.warning(
                    "worker %s: tasks %s of %s not handed over to their standbys (the nimbus reassigns them): %s",
                    self.worker_id,
                    sorted(task_ids),
                    topology_id,
                    e,
                )

    def _unregister(self) -> None:
        """Delete our ``/workers`` node, if we still can (the slot is going away)."""
        assert self.store is not None
        if self.store.connected:
            try:
                self.store.delete(ZkPaths.worker(self.worker_id))
            except CoordinationError:
                pass

    def _close_store(self) -> None:
        """Delete our worker node and end the session (bounded by the caller's join)."""
        assert self.store is not None
        self._unregister()
        self.store.close()
