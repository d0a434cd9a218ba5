"""A worker: one slot (``host:port``), one SparkSession, the tasks assigned to it.

State machine of the worker's ZooKeeper session (kazoo listener):

* CONNECTED: register ``/workers/{id}``, reconcile tasks with the assignment.
* SUSPENDED: keep queries running but let no batch commit (commits wait for CONNECTED).
* LOST: every ``/owners`` node of ours is gone, so every task is stopped without writing;
  when the session comes back the worker registers again and re-acquires its tasks.

Reconciliation runs on the worker's main thread whenever a watch fires (and at least every
``poll_interval_s``): tasks assigned here in ACTIVE topologies are started, others stopped.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kazoo.protocol.states import KazooState
from pydantic import BaseModel, ConfigDict, Field
from pyspark.sql import SparkSession

from stream_ops.config import ClusterConfig, QueryConfig, ZooKeeperConfig, query_token
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import StormRecord, WorkerRecord
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import (
    CoordinationError,
    StreamOpsError,
    WorkerError,
    ZnodeExistsError,
    ZooKeeperUnavailableError,
)
from stream_ops.layout import TopologyLayout
from stream_ops.nimbus.assignment import read_assignment
from stream_ops.nimbus.dist_store import install_code, read_plan
from stream_ops.runtime.heartbeat import beat
from stream_ops.runtime.ownership import TaskBusyError
from stream_ops.runtime.query_server import QueryServer, server_tls_context
from stream_ops.runtime.task_runner import RunnerSettings, TaskRunner
from stream_ops.spark.session import create_spark_session
from stream_ops.topology.plan import Plan

logger = logging.getLogger(__name__)


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
    spark_master: str = "local[*]"
    spark_conf: dict[str, str] = Field(default_factory=dict)
    trigger_seconds: float = Field(1.0, ge=0)
    max_files_per_trigger: int = Field(100, ge=1)
    launched_by: str = "cli"
    query: QueryConfig = Field(
        default_factory=QueryConfig,
        description="Token and TLS of the state-query server, also used for this worker's queries of the others.",
    )

    @property
    def worker_id(self) -> str:
        return f"{self.host}:{self.port}"


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
        # A session passed in by the caller (tests, Dagster's PySparkResource) is not ours to stop.
        self._owns_spark = spark_factory is None
        self._spark_factory = spark_factory or (
            lambda: create_spark_session(
                master=settings.spark_master, app_name=f"stream-ops-worker-{self.worker_id}", conf=settings.spark_conf
            )
        )
        self._connected = threading.Event()
        self._lost = threading.Event()
        self._changed = threading.Event()
        self._runners: dict[tuple[str, int], TaskRunner] = {}
        self._plans: dict[str, Plan] = {}
        self._watched: set[str] = set()
        self._busy_logged: dict[tuple[str, int], float] = {}
        self.store: ZkStore | None = None
        self.spark: SparkSession | None = None
        self._server: QueryServer | None = None

    # --- session state machine ---------------------------------------------------------------

    def _on_state(self, state: str) -> None:
        # kazoo calls this on its own thread: only flip flags here.
        if state == KazooState.CONNECTED:
            self._connected.set()
        elif state == KazooState.SUSPENDED:
            self._connected.clear()
            logger.warning("worker %s: ZooKeeper SUSPENDED, commits paused", self.worker_id)
        elif state == KazooState.LOST:
            self._connected.clear()
            self._lost.set()
            logger.error("worker %s: ZooKeeper session LOST, stopping all tasks", self.worker_id)
        self._changed.set()

    # --- main loop ---------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Register, run assigned tasks and heartbeat until ``stop`` is set; then clean up."""
        self.store = ZkStore.connect(self.zookeeper)
        self.store.add_listener(self._on_state)
        self._connected.set()
        try:
            self.spark = self._spark_factory()
            self._server = self._query_server()
            self._server.start()
            self._register(stop)
            self.store.client.ChildrenWatch(ZkPaths.ASSIGNMENTS, self._on_assignments)
            # Heartbeats run on their own thread: starting a task can take long (rebuilding a
            # large state), and the tasks already running must keep beating meanwhile.
            beats = threading.Thread(target=self._heartbeat_loop, args=(stop,), name="stream-ops-heartbeat", daemon=True)
            beats.start()
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
                    now = self.clock()
                    for runner in list(self._runners.values()):
                        runner.maybe_tick(now)
                except CoordinationError as e:
                    logger.warning("worker %s: %s", self.worker_id, e)
        finally:
            self._shutdown()

    def _heartbeat_loop(self, stop: threading.Event) -> None:
        """Write every running task's heartbeat each ``heartbeat_interval_s`` while connected."""
        assert self.store is not None
        while not stop.wait(self.settings.heartbeat_interval_s):
            if not self._connected.is_set() or self._lost.is_set():
                continue
            try:
                beat(self.store, [r for r in list(self._runners.values()) if r.is_running()], clock=self.clock)
            except StreamOpsError as e:
                logger.warning("worker %s: heartbeats not written: %s", self.worker_id, e)

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
                    raise WorkerError(
                        f"slot {self.worker_id} is registered by another live worker; use another --port"
                    ) from e
                stop.wait(0.25)

    def _handle_lost(self, stop: threading.Event) -> None:
        # The old session's /owners nodes are gone already. A task started after kazoo
        # reconnected (before this loop saw LOST) holds its node in the *new* session, so
        # release still runs: it deletes only a node that names this worker and epoch.
        for key in list(self._runners):
            self._stop_runner(key)
        if self.store is None or not self.store.client.connected:
            return
        self._lost.clear()
        self._connected.set()
        self._watched.clear()
        self._register(stop)
        self.store.client.ChildrenWatch(ZkPaths.ASSIGNMENTS, self._on_assignments)

    def _on_assignments(self, children: list[str]) -> None:
        assert self.store is not None
        for topology_id in children:
            if topology_id not in self._watched:
                self._watched.add(topology_id)
                self.store.client.DataWatch(ZkPaths.assignment(topology_id), self._on_assignment_data)
        self._changed.set()

    def _on_assignment_data(self, data: Any, stat: Any) -> bool | None:
        self._changed.set()
        return None if data is not None else False

    # --- reconciliation ----------------------------------------------------------------------

    def _desired(self) -> dict[tuple[str, int], StormRecord]:
        assert self.store is not None
        desired: dict[tuple[str, int], StormRecord] = {}
        for topology_id in self.store.children(ZkPaths.ASSIGNMENTS):
            found = self.store.get_json(ZkPaths.storm(topology_id))
            if found is None:
                continue
            storm = StormRecord.model_validate(found[0])
            if storm.status != "ACTIVE":
                continue
            assignment = read_assignment(self.store, topology_id)
            if assignment is None:
                continue
            for task_id, worker_id in assignment[0].tasks.items():
                if worker_id == self.worker_id:
                    desired[(topology_id, int(task_id))] = storm
        return desired

    def _reconcile(self) -> None:
        desired = self._desired()
        for key, runner in list(self._runners.items()):
            if key not in desired:
                self._stop_runner(key)
            elif not runner.is_running():
                logger.error("task %s/%d failed: %s; restarting it", key[0], key[1], runner.failure())
                self._stop_runner(key)
        for key, storm in sorted(desired.items()):
            if key in self._runners or len(self._runners) >= self.settings.capacity:
                continue
            self._start_runner(key, storm)

    def _plan(self, storm: StormRecord) -> Plan:
        plan = self._plans.get(storm.topology_id)
        if plan is None:
            dist = Path(storm.dist_dir)
            plan = read_plan(dist)
            code_dir = self.cluster.resolved_local_state_dir() / "code" / storm.topology_id
            verified = install_code(dist, code_dir, storm.code_sha256)
            assert self.spark is not None
            self.spark.sparkContext.addPyFile(str(verified))
            self._plans[storm.topology_id] = plan
        return plan

    def _start_runner(self, key: tuple[str, int], storm: StormRecord) -> None:
        assert self.store is not None and self.spark is not None
        topology_id, task_id = key
        try:
            plan = self._plan(storm)
            runner = TaskRunner(
                store=self.store,
                spark=self.spark,
                layout=TopologyLayout(self.cluster, topology_id),
                plan=plan,
                task=plan.task(task_id),
                worker_id=self.worker_id,
                settings=RunnerSettings(
                    trigger_seconds=self.settings.trigger_seconds,
                    max_files_per_trigger=self.settings.max_files_per_trigger,
                    commit_wait_s=self.zookeeper.session_timeout_s,
                    query=self.settings.query,
                ),
                connected=self._connected,
                clock=self.clock,
            )
            runner.start()
        except TaskBusyError as e:
            now = time.monotonic()
            if now - self._busy_logged.get(key, 0.0) > 5:
                logger.info("%s; waiting for its owner to go", e)
                self._busy_logged[key] = now
            return
        except StreamOpsError as e:
            logger.error("task %s/%d could not start: %s", topology_id, task_id, e)
            return
        self._busy_logged.pop(key, None)
        self._runners[key] = runner
        logger.info("task %s/%d running on %s (epoch %d)", topology_id, task_id, self.worker_id, runner.ownership.epoch)  # type: ignore[union-attr]

    def _stop_runner(self, key: tuple[str, int], *, release_ownership: bool = True) -> None:
        runner = self._runners.pop(key, None)
        if runner is None:
            return
        runner.stop(release_ownership=release_ownership)
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
                "(run with --zk-auth or --query-token-file to require a token)", self.worker_id, self.settings.port,
            )
        tls = server_tls_context(query.tls_cert, query.tls_key) if query.tls_cert and query.tls_key else None
        return QueryServer(self.settings.bind_host, self.settings.port, self._lookup, token=token, tls=tls)

    def _lookup(self, topology_id: str, task_id: int, keys: list[tuple[Any, ...]]) -> list[Any] | None:
        runner = self._runners.get((topology_id, task_id))
        if runner is None or runner.state is None:
            return None
        return runner.lookup(keys)

    @property
    def running_tasks(self) -> list[tuple[str, int]]:
        return sorted(self._runners)

    def _shutdown(self) -> None:
        for key in list(self._runners):
            try:
                self._stop_runner(key)
            except Exception as e:  # noqa: BLE001 - keep shutting the rest down
                logger.warning("stopping task %s: %s", key, e)
        if self._server is not None:
            self._server.stop()
        if self.spark is not None and self._owns_spark:
            self.spark.stop()
        if self.store is not None:
            self.store.remove_listener(self._on_state)
            try:
                self.store.delete(ZkPaths.worker(self.worker_id))
            except CoordinationError:
                pass
            self.store.close()
        logger.info("worker %s stopped", self.worker_id)
