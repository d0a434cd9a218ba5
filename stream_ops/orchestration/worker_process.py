"""The ``stream-ops worker`` process of a Dagster worker run, and how its op watches it.

A worker run's own process holds the Dagster instance (its database password, in memory and
in its environment), so topology code never runs there: the op starts the very worker the
cluster scripts start (``stream-ops worker``, :func:`~stream_ops.runtime.processes.worker_command`)
with

* the resources' settings on its command line (nothing secret);
* the Spark configuration of dagster-pyspark's ``LazyPySparkResource`` as its ``--spark-master`` and
  ``--spark-conf`` (:func:`spark_arguments`);
* the allow-listed environment of :mod:`stream_ops.topology_env`, plus
  ``StreamClusterResource.worker_pass_env``;
* its ZooKeeper credentials and query token on its stdin (:mod:`stream_ops.runtime.worker_pipe`),
  which stays open as a lifeline: the worker stops cleanly once the run's process is gone, even
  killed by SIGKILL.

:class:`WorkerProcess` copies the worker's output to the run's stderr (the step's compute log)
and keeps its last lines for the run's failure.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from stream_ops.config import ClusterConfig, ZooKeeperConfig
from stream_ops.runtime.processes import kill_group, start_worker, worker_command
from stream_ops.runtime.worker import WorkerSettings
from stream_ops.runtime.worker_pipe import WorkerSecrets
from stream_ops.spark.jvm_classes import CLASS_PATH_KEY, jvm_classes_jar
from stream_ops.topology_env import topology_environment

#: Lines of the worker's output kept for the run's failure message.
TAIL_LINES = 40


@dataclass(frozen=True)
class WorkerLaunch:
    """Everything a worker process is started with."""

    worker_id: str
    command: list[str]
    env: dict[str, str] = field(repr=False)
    secrets: WorkerSecrets = field(repr=False)


def spark_arguments(spark_config: Mapping[str, Any], default_master: str) -> list[str]:
    """``--spark-master`` and ``--spark-conf`` arguments giving a worker ``spark_config``.

    Nested keys are joined with dots and values written as Spark reads them (booleans in lower
    case), as dagster-pyspark builds its own session from the same dict. The class path entry of
    stream_ops' JVM classes is left out: the worker adds it itself.
    """
    settings = {key: _spark_value(value) for key, value in _flatten(spark_config)}
    master = settings.pop("spark.master", default_master)
    jar = jvm_classes_jar()
    if CLASS_PATH_KEY in settings and jar is not None:
        entries = [entry for entry in settings[CLASS_PATH_KEY].split(os.pathsep) if entry and entry != str(jar)]
        if entries:
            settings[CLASS_PATH_KEY] = os.pathsep.join(entries)
        else:
            del settings[CLASS_PATH_KEY]
    args = ["--spark-master", master]
    for key, value in sorted(settings.items()):
        args += ["--spark-conf", f"{key}={value}"]
    return args


def worker_launch(
    zookeeper: ZooKeeperConfig,
    cluster: ClusterConfig,
    settings: WorkerSettings,
    spark_config: Mapping[str, Any],
    *,
    pass_env: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
) -> WorkerLaunch:
    """The command, environment and secrets of the worker ``settings`` describe.

    Args:
        zookeeper: The cluster's ZooKeeper; its credentials go on the worker's stdin.
        cluster: The cluster's paths.
        settings: The worker's settings (``StreamClusterResource.worker_settings``); its
            query token goes on the worker's stdin.
        spark_config: The ``LazyPySparkResource``'s ``spark_config``: the worker's Spark settings
            (``settings.spark_master`` only when it names no ``spark.master``).
        pass_env: Names the topologies' code may read besides the allow-list.
        environ: The environment to reduce; default this process's.

    Raises:
        TopologyEnvironmentError: a ``pass_env`` name is a secret of stream_ops, Dagster or
            its database.
    """
    env = topology_environment(os.environ if environ is None else environ, pass_env)
    query = settings.query
    global_args = ["--zk-open-reads"] if zookeeper.open_reads else []
    for option, path in (("--local-dir", cluster.local_state_dir), ("--query-tls-ca", query.tls_ca)):
        if path is not None:
            global_args += [option, str(path)]
    args = [
        "--bind-host",
        settings.bind_host,
        "--capacity",
        str(settings.capacity),
        "--trigger-seconds",
        str(settings.trigger_seconds),
        "--max-files-per-trigger",
        str(settings.max_files_per_trigger),
        "--heartbeat-interval",
        str(settings.heartbeat_interval_s),
        "--poll-interval",
        str(settings.poll_interval_s),
        "--shutdown-timeout",
        str(settings.shutdown_timeout_s),
        "--launched-by",
        settings.launched_by,
        *spark_arguments(spark_config, settings.spark_master),
    ]
    optional = {
        "--shuffle-trigger-seconds": settings.shuffle_trigger_seconds,
        "--query-tls-cert": query.tls_cert,
        "--query-tls-key": query.tls_key,
        "--dist-dir": cluster.dist_dir,
        "--topics-root": cluster.topics_root,
        "--checkpoints-root": cluster.checkpoints_root,
    }
    for option, value in optional.items():
        if value is not None:
            args += [option, str(value)]
    if settings.kafka_connector is not None:
        args.append("--kafka-connector" if settings.kafka_connector else "--no-kafka-connector")
    for name in pass_env:
        args += ["--pass-env", name]
    if zookeeper.insecure:
        args.append("--insecure")
    command = worker_command(
        zookeeper,
        cluster.root.resolve(),
        host=settings.host,
        port=settings.port,
        extra_args=args,
        global_args=global_args,
    )
    token = query.token.get_secret_value() if query.token is not None else None
    secrets = WorkerSecrets(zk_auth=zookeeper.auth_credentials(), query_token=token)
    return WorkerLaunch(settings.worker_id, command, env, secrets)


class WorkerProcess:
    """A started worker process: its output copied to this process's stderr, its end awaited.

    Use :meth:`start`; :meth:`stop` ends it (SIGTERM: the worker's clean stop and handover).
    """

    def __init__(self, proc: subprocess.Popen[bytes], launch: WorkerLaunch) -> None:
        self.proc = proc
        self.launch = launch
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._copier = threading.Thread(target=self._copy_output, name="stream-ops-worker-output", daemon=True)
        self._copier.start()
        self.killed = False
        """Whether :meth:`stop` had to kill it (it did not stop in time)."""

    @classmethod
    def start(cls, launch: WorkerLaunch) -> WorkerProcess:
        """Start the worker of ``launch``; its stdin stays open as its lifeline."""
        return cls(start_worker(launch.command, env=launch.env, secrets=launch.secrets, output=subprocess.PIPE), launch)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout_s: float) -> int | None:
        """Its exit code once it has exited, None if it still runs after ``timeout_s``."""
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout_s: float, log: Any) -> None:
        """SIGTERM the worker (it stops its tasks and hands them over), wait for it to exit riding
        out further interrupts (Dagster may repeat them), kill what is left of its process group
        after ``timeout_s``, and close its lifeline."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while self.proc.poll() is None and time.monotonic() < deadline:
            try:
                self.wait(0.25)
            except (dg.DagsterExecutionInterruptedError, KeyboardInterrupt):
                log.info("interrupted again while the worker stops; still waiting for it")
        if self.proc.poll() is None:
            log.error(f"the worker did not stop within {timeout_s:.0f}s; killing it")
            self.killed = True
        # Its JVM and row processes end with it (their pipes close); a straggler dies here.
        kill_group(self.proc)
        self.proc.wait()
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        self._copier.join(5)

    def tail(self) -> str:
        """The last lines the worker wrote."""
        return "".join(self._tail)

    def _copy_output(self) -> None:
        assert self.proc.stdout is not None
        for line in _lines(self.proc.stdout):
            self._tail.append(line)
            try:
                sys.stderr.write(line)
                sys.stderr.flush()
            except (OSError, ValueError):
                pass  # this process's stderr is gone; the tail is still kept


def _lines(stream: Any) -> Iterator[str]:
    for raw in iter(stream.readline, b""):
        yield raw.decode(errors="replace")


def _flatten(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from _flatten(value, f"{name}.")
        else:
            yield name, value


def _spark_value(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
