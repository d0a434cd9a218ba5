"""The cluster deployment (``deployments/cluster``) driven from Python, on one machine.

:class:`ClusterStack` runs the deployment's own start scripts, with an environment file of
the same form an operator writes, so what ``deployments/cluster/README.md`` tells operators
to run is what the end-to-end test runs: a ZooKeeper ensemble, a Spark standalone master and
workers, stream_ops workers on ``spark://`` and (optionally) PostgreSQL for Dagster.

Every service runs in its own process group (Spark workers' executors and the stream_ops
workers' driver JVMs included), so :meth:`ClusterStack.kill` is a machine crash for that
service and :meth:`ClusterStack.close` leaves no process behind.

:func:`loopback_settings` picks free loopback ports for all of it.

Example:
    >>> settings = loopback_settings(Path("/tmp/c"), zookeeper_servers=3)  # doctest: +SKIP
    >>> with ClusterStack(Path("/tmp/c"), settings, secrets={"STREAM_OPS_ZK_AUTH": "so:pw"}) as c:  # doctest: +SKIP
    ...     c.start_zookeeper_ensemble()
    ...     c.start_spark(workers=2)
    ...     c.start_workers([c.free_port(), c.free_port()])
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from stream_ops.config import ClusterConfig, ZooKeeperConfig
from stream_ops.coordination.ensemble import EnsembleServer, connect_string, parse_servers, server_mode, wait_for_quorum
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import StreamOpsError, WorkerError
from stream_ops.local_stack import _tail
from stream_ops.nimbus.assignment import live_workers
from stream_ops.ports import free_port
from stream_ops.runtime.processes import kill_group, spawn, stop_process

__all__ = ["ClusterStack", "Service", "deployment_dir", "loopback_settings", "write_env_file"]

logger = logging.getLogger(__name__)


def deployment_dir() -> Path:
    """``deployments/cluster`` of this checkout (the scripts are not part of the wheel)."""
    path = Path(__file__).resolve().parent.parent / "deployments" / "cluster"
    if not (path / "bin" / "_common.sh").is_file():
        raise StreamOpsError(
            f"no cluster deployment scripts at {path}: ClusterStack runs them from a checkout of the stream_ops repository"
        )
    return path


def write_env_file(path: Path, values: Mapping[str, str], *, secret: bool = False) -> Path:
    """Write ``KEY="value"`` lines that the deployment scripts source.

    Args:
        path: Target file.
        values: Settings; values are double-quoted (no ``"``, ``$``, backquote or backslash allowed).
        secret: Create the file with mode 600 (the scripts refuse a readable secrets file).
    """
    lines = []
    for key, value in values.items():
        if any(c in value for c in '"$`\\\n'):
            raise ValueError(f"{key}: value {value!r} may not contain quotes, $, backquotes, backslashes or newlines")
        lines.append(f'{key}="{value}"')
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if secret else 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write("# written by stream_ops.cluster_stack\n" + "\n".join(lines) + "\n")
    if secret:
        os.chmod(path, 0o600)
    return path


def _free_ports(count: int, host: str, taken: set[int]) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_port(host)
        if port not in taken:
            taken.add(port)
            ports.append(port)
    return ports


def loopback_settings(
    home: Path,
    *,
    zookeeper_servers: int = 3,
    host: str = "127.0.0.1",
    tick_time_ms: int = 500,
    session_timeout_s: float = 6.0,
    spark_worker_cores: int = 2,
    spark_worker_memory: str = "1g",
    executor_memory: str = "512m",
    app_cores_max: int = 2,
    open_reads: bool = True,
) -> dict[str, str]:
    """A cluster environment with every service on ``host`` and free ports.

    Each stream_ops worker's Spark application gets up to ``app_cores_max`` one-core executors,
    spread over the Spark workers, so losing one Spark worker leaves every application an
    executor. The layout under ``home``: ``shared/`` (STREAM_OPS_HOME), ``zookeeper/server-<id>``,
    ``spark-work/``, ``dagster/``, ``postgres/``.
    """
    taken: set[int] = set()
    zk_ports = _free_ports(3 * zookeeper_servers, host, taken)
    servers = " ".join(
        f"{i + 1}={host}:{zk_ports[3 * i]}:{zk_ports[3 * i + 1]}:{zk_ports[3 * i + 2]}" for i in range(zookeeper_servers)
    )
    master_port, master_ui, pg_port, dagster_port = _free_ports(4, host, taken)
    return {
        "STREAM_OPS_PYTHON": sys.executable,
        "ZK_SERVERS": servers,
        "ZK_DATA_DIR": str(home / "zookeeper"),
        "ZK_TICK_TIME_MS": str(tick_time_ms),
        "ZK_HEAP": "128m",
        "STREAM_OPS_CHROOT": "/stream_ops",
        "STREAM_OPS_HOME": str(home / "shared"),
        "STREAM_OPS_SESSION_TIMEOUT": str(session_timeout_s),
        "STREAM_OPS_ZK_OPEN_READS": "true" if open_reads else "false",
        "STREAM_OPS_QUERY_BIND": host,
        "SPARK_MASTER_HOST": host,
        "SPARK_MASTER_PORT": str(master_port),
        "SPARK_MASTER_WEBUI_PORT": str(master_ui),
        "SPARK_WORKER_CORES": str(spark_worker_cores),
        "SPARK_WORKER_MEMORY": spark_worker_memory,
        "SPARK_WORKER_DIR": str(home / "spark-work"),
        "SPARK_DAEMON_MEMORY": "256m",
        "SPARK_EXECUTOR_MEMORY": executor_memory,
        "SPARK_EXECUTOR_CORES": "1",
        "SPARK_APP_CORES_MAX": str(app_cores_max),
        "DAGSTER_HOME": str(home / "dagster"),
        "DAGSTER_PG_HOST": host,
        "DAGSTER_PG_PORT": str(pg_port),
        "DAGSTER_PG_USERNAME": "dagster",
        "DAGSTER_PG_DB": "dagster",
        "DAGSTER_WEBSERVER_PORT": str(dagster_port),
        "POSTGRES_LOCAL_DIR": str(home / "postgres"),
    }


@dataclass
class Service:
    """One long-running script of the deployment (its process group)."""

    name: str
    proc: subprocess.Popen[Any]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class ClusterStack:
    """Runs ``deployments/cluster/bin/*.sh`` with a generated environment; stops everything on close.

    Args:
        home: Where the environment files, logs and all service data go.
        settings: The cluster environment (see ``cluster.env.example``; :func:`loopback_settings`).
        secrets: The secrets environment (``STREAM_OPS_ZK_AUTH``, ``DAGSTER_PG_PASSWORD``).
        host: This machine's address (``STREAM_OPS_HOST`` of the scripts).
    """

    home: Path
    settings: Mapping[str, str]
    secrets: Mapping[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    services: dict[str, Service] = field(default_factory=dict)
    _groups: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.home = Path(self.home)
        self.bin = deployment_dir() / "bin"
        self.env_file = write_env_file(self.home / "cluster.env", self.settings)
        self.secrets_file = write_env_file(self.home / "secrets.env", self.secrets, secret=True)
        self.logs = self.home / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)

    # --- configuration views -------------------------------------------------------------

    @property
    def ensemble(self) -> list[EnsembleServer]:
        return parse_servers(self.settings["ZK_SERVERS"])

    @property
    def zk_config(self) -> ZooKeeperConfig:
        """How stream_ops processes of this cluster reach ZooKeeper (with its credentials)."""
        return ZooKeeperConfig(
            hosts=connect_string(self.ensemble),
            chroot=self.settings.get("STREAM_OPS_CHROOT", "/stream_ops"),
            session_timeout_s=float(self.settings.get("STREAM_OPS_SESSION_TIMEOUT", "10")),
            auth_digest=self.secrets.get("STREAM_OPS_ZK_AUTH") or None,
            open_reads=bool(self.secrets.get("STREAM_OPS_ZK_AUTH")) and self.settings.get("STREAM_OPS_ZK_OPEN_READS") == "true",
        )

    @property
    def cluster(self) -> ClusterConfig:
        return ClusterConfig(root=Path(self.settings["STREAM_OPS_HOME"]))

    def env(self) -> dict[str, str]:
        """Environment of the scripts: ours, plus where their configuration files are."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("STREAM_OPS_", "SPARK_", "PYSPARK_"))}
        env.update(
            STREAM_OPS_CLUSTER_ENV=str(self.env_file),
            STREAM_OPS_SECRETS_FILE=str(self.secrets_file),
            STREAM_OPS_HOST=self.host,
            PYTHONUNBUFFERED="1",
        )
        return env

    def free_port(self) -> int:
        return free_port(self.host)

    # --- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> ClusterStack:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def run_script(self, script: str, *args: str, timeout_s: float = 120.0) -> str:
        """Run a short script (``postgres-local.sh start``) to completion; returns its output."""
        result = subprocess.run(
            [str(self.bin / script), *args], env=self.env(), capture_output=True, text=True, timeout=timeout_s
        )
        if result.returncode != 0:
            raise StreamOpsError(f"{script} {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
        return result.stdout

    def start(self, name: str, script: str, *args: str) -> Service:
        """Start a long-running script in its own process group, output to ``logs/<name>.log``."""
        if name in self.services and self.services[name].alive():
            raise StreamOpsError(f"service {name} is already running (pid {self.services[name].pid})")
        log = self.logs / f"{name}.log"
        proc = spawn([str(self.bin / script), *args], log, self.env())
        self._groups.add(proc.pid)
        service = Service(name, proc, log)
        self.services[name] = service
        logger.info("started %s (pid %d): %s %s", name, proc.pid, script, " ".join(args))
        return service

    def kill(self, name: str) -> None:
        """SIGKILL a service's whole process group, as a machine crash would."""
        service = self.services.pop(name)
        kill_group(service.proc, signal.SIGKILL)
        service.proc.wait(10)
        logger.info("killed %s (pid %d)", name, service.pid)

    def _check_alive(self, names: Iterable[str]) -> None:
        for name in names:
            service = self.services.get(name)
            if service is not None and not service.alive():
                raise StreamOpsError(
                    f"{name} exited with {service.proc.returncode}; last lines of {service.log}:\n{_tail(service.log)}"
                )

    def alive_groups(self) -> list[int]:
        """Process groups of services started here that still have a member."""
        return [pgid for pgid in sorted(self._groups) if group_alive(pgid)]

    def close(self, grace_s: float = 20.0) -> list[int]:
        """Stop every service (Dagster and stream_ops workers first, ZooKeeper last), leaving no process.

        Each service gets SIGTERM, then SIGKILL after ``grace_s``; members of its process group
        that outlive the leader (executors shutting down) get ``grace_s`` more, then SIGKILL.

        Returns:
            Process groups still running after everything (empty when clean).
        """
        order = ["stream-ops-worker", "spark-worker", "spark-master", "zookeeper"]
        ranked = sorted(
            self.services.values(),
            # Anything else (Dagster) goes first, while ZooKeeper is still there.
            key=lambda s: next((i for i, p in enumerate(order) if s.name.startswith(p)), -1),
        )
        for service in ranked:
            stop_process(service.proc, timeout_s=grace_s)
        self.services.clear()
        deadline = time.monotonic() + grace_s
        while self.alive_groups() and time.monotonic() < deadline:
            time.sleep(0.2)
        stragglers = self.alive_groups()
        if stragglers:
            logger.warning("process groups %s outlived their leader by %.0fs; sending SIGKILL", stragglers, grace_s)
            for pgid in stragglers:
                kill_group_id(pgid)
            deadline = time.monotonic() + 10
            while self.alive_groups() and time.monotonic() < deadline:
                time.sleep(0.1)
        return self.alive_groups()

    # --- ZooKeeper ---------------------------------------------------------------------------

    def start_zookeeper(self, myid: int) -> Service:
        return self.start(f"zookeeper-{myid}", "zookeeper.sh", str(myid))

    def start_zookeeper_ensemble(self, timeout_s: float = 90.0) -> dict[int, str | None]:
        """Start every member of ``ZK_SERVERS`` and wait for a leader and all followers."""
        for server in self.ensemble:
            self.start_zookeeper(server.myid)
        deadline = time.monotonic() + timeout_s
        while True:
            self._check_alive(f"zookeeper-{s.myid}" for s in self.ensemble)
            try:
                return wait_for_quorum(self.ensemble, min(2.0, max(deadline - time.monotonic(), 0.1)))
            except StreamOpsError:
                if time.monotonic() > deadline:
                    raise

    def zookeeper_leader(self) -> int | None:
        """Id of the member that leads now."""
        for server in self.ensemble:
            if server_mode(server) == "leader":
                return server.myid
        return None

    # --- Spark -------------------------------------------------------------------------------

    def spark_master_state(self) -> dict[str, Any]:
        """The master's ``/json`` view (workers, apps); empty when it does not answer."""
        url = f"http://{self.settings['SPARK_MASTER_HOST']}:{self.settings['SPARK_MASTER_WEBUI_PORT']}/json/"
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                return dict(json.loads(reply.read()))
        except (OSError, ValueError):
            return {}

    def start_spark_master(self) -> Service:
        """Start ``spark-master.sh`` (see :meth:`wait_for_spark_master`)."""
        return self.start("spark-master", "spark-master.sh")

    def wait_for_spark_master(self, timeout_s: float = 120.0) -> dict[str, Any]:
        """Wait until the master answers ALIVE on its web UI."""
        return self.wait_for_spark_workers(0, timeout_s)

    def start_spark_workers(self, count: int) -> list[str]:
        """Start ``count`` ``spark-worker.sh`` on free ports (see :meth:`wait_for_spark_workers`)."""
        names = []
        for _ in range(count):
            name = f"spark-worker-{sum(n.startswith('spark-worker-') for n in self.services) + 1}"
            self.start(name, "spark-worker.sh", str(self.free_port()), str(self.free_port()))
            names.append(name)
        return names

    def start_spark(self, workers: int = 2, timeout_s: float = 120.0) -> list[str]:
        """Start the master and ``workers`` Spark workers; wait until all are ALIVE."""
        self.start_spark_master()
        self.wait_for_spark_master(timeout_s)
        names = self.start_spark_workers(workers)
        self.wait_for_spark_workers(workers, timeout_s)
        return names

    def wait_for_spark_workers(self, count: int, timeout_s: float = 120.0) -> dict[str, Any]:
        """Wait until the master is ALIVE with at least ``count`` live workers; returns its state."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._check_alive(n for n in self.services if n.startswith("spark-"))
            state = self.spark_master_state()
            if state.get("status") == "ALIVE" and int(state.get("aliveworkers", 0)) >= count:
                return state
            if time.monotonic() > deadline:
                raise StreamOpsError(f"Spark master has {state.get('aliveworkers', 0)} of {count} workers after {timeout_s:.0f}s")
            time.sleep(0.5)

    # --- stream_ops workers ------------------------------------------------------------------

    def start_workers(
        self, ports: Sequence[int], extra_args: Sequence[str] = (), *, wait: bool = True, timeout_s: float = 180.0
    ) -> list[str]:
        """Start ``stream-ops-worker.sh`` on each port; returns the worker ids.

        Args:
            ports: Slot ports.
            extra_args: More ``stream-ops worker`` options.
            wait: Wait until all are registered in ZooKeeper (see :meth:`wait_for_workers`).
            timeout_s: How long to wait.
        """
        ids = []
        for port in ports:
            self.start(f"stream-ops-worker-{port}", "stream-ops-worker.sh", str(port), *extra_args)
            ids.append(f"{self.host}:{port}")
        if wait:
            self.wait_for_workers(ids, timeout_s)
        return ids

    def wait_for_workers(self, worker_ids: Sequence[str], timeout_s: float = 180.0) -> None:
        """Wait until every worker in ``worker_ids`` is registered (fails early if one exits)."""
        deadline = time.monotonic() + timeout_s
        with ZkStore.connect(self.zk_config) as store:
            while True:
                self._check_alive(n for n in self.services if n.startswith(("stream-ops-worker-", "spark-")))
                live = set(live_workers(store))
                if set(worker_ids) <= live:
                    return
                if time.monotonic() > deadline:
                    raise WorkerError(f"workers {sorted(set(worker_ids) - live)} did not register within {timeout_s:.0f}s")
                time.sleep(0.25)


def group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` has a member (zombies awaiting their parent count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - the id now belongs to another user's group
        return False
    return True


def kill_group_id(pgid: int) -> None:
    """SIGKILL a process group by id; a group that is gone already is fine."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
