"""A real, single-node Kafka broker (KRaft, broker and controller in one JVM) for local runs and tests.

It runs from the jars :mod:`stream_ops.kafka.jars` fetched (``kafka_2.13`` and its runtime
dependencies), as Kafka's own scripts would::

    java -cp <jars> kafka.tools.StorageTool format -t <cluster id> -c server.properties
    java -cp <jars> kafka.Kafka server.properties

:class:`EmbeddedKafka` writes ``server.properties`` (combined mode, free ports on loopback,
every internal topic with one replica and one partition so the first consumer group or
transaction does not wait for 50 partitions), formats a fresh log directory with a random
cluster id, launches the JVM in its own process group with its output in ``kafka.log``, and
reports ready only once confluent-kafka's AdminClient lists the cluster's metadata with this
broker in it. :meth:`EmbeddedKafka.stop` ends the whole process group.

Example:
    >>> with EmbeddedKafka(Path("/tmp/kafka")) as kafka:  # doctest: +SKIP
    ...     kafka.create_topic("sentences", partitions=2)
    ...     print(kafka.bootstrap_servers)
    127.0.0.1:40123
"""

from __future__ import annotations

import base64
import logging
import os
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from stream_ops.errors import JavaNotFoundError, KafkaServerError
from stream_ops.jvm_server import JvmServer, find_java
from stream_ops.kafka.client import client_config, ensure_topic, topic_partitions
from stream_ops.kafka.jars import broker_jars
from stream_ops.ports import free_port

logger = logging.getLogger(__name__)

MAIN_CLASS = "kafka.Kafka"
STORAGE_TOOL_CLASS = "kafka.tools.StorageTool"
CONFIG_FILE_NAME = "server.properties"
LOG_FILE_NAME = "kafka.log"
LOG4J_FILE_NAME = "log4j2.properties"
PROBE_TIMEOUT_S = 1.0
PROBE_INTERVAL_S = 0.1
_LOG_TAIL_LINES = 40

#: JVM options: the heap the task asks for (512 MiB at most), serial GC and C1-only JIT, which
#: start a small JVM sooner on 2 cores (as for the embedded ZooKeeper).
DEFAULT_JVM_OPTIONS: tuple[str, ...] = (
    "-Xms64m",
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Djava.awt.headless=true",
)

_LOG4J2_PROPERTIES = """\
# Written by stream_ops: Kafka logs to stdout, which EmbeddedKafka sends to kafka.log
status = warn
appender.console.type = Console
appender.console.name = console
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{ISO8601} %-5p [%t] %c{1}: %m%n
rootLogger.level = info
rootLogger.appenderRef.console.ref = console
logger.kafka.name = kafka
logger.kafka.level = info
logger.state.name = state.change.logger
logger.state.level = warn
"""


def random_cluster_id() -> str:
    """A cluster id as ``kafka-storage random-uuid`` makes one: 16 random bytes, base64url, unpadded."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not cluster_id.startswith("-"):  # Kafka avoids ids a command line would take for an option
            return cluster_id


class EmbeddedKafka(JvmServer):
    """One Kafka broker and controller (KRaft combined mode) in a child JVM.

    Args:
        data_dir: Directory for ``server.properties``, ``kafka.log`` and the log directory
            ``logs/``. Created if missing. A log directory already formatted is reused (its
            topics are kept); otherwise it is formatted with a random cluster id.
        port: Client (PLAINTEXT) port; None picks a free one. The controller port is always free-picked.
        host: Interface to listen on and to advertise.
        jvm_options: JVM flags; None means :data:`DEFAULT_JVM_OPTIONS`.
        properties: Extra broker settings, overriding the generated ones.
        jars: The classpath; None fetches (once) :func:`stream_ops.kafka.jars.broker_jars`.
    """

    kind = "Kafka"
    log_file_name = LOG_FILE_NAME
    error_type = KafkaServerError

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        host: str = "127.0.0.1",
        jvm_options: Sequence[str] | None = None,
        properties: Mapping[str, str] | None = None,
        jars: Sequence[Path] | None = None,
    ) -> None:
        super().__init__(Path(data_dir), host, port)
        self.jvm_options: tuple[str, ...] = tuple(DEFAULT_JVM_OPTIONS if jvm_options is None else jvm_options)
        self.properties = dict(properties or {})
        self._jars = list(jars) if jars is not None else None
        self._controller_port: int | None = None
        self.cluster_id: str | None = None
        self.started_in_s: float | None = None
        """Seconds the last :meth:`start` took, from launching the JVM to ready (formatting excluded)."""

    # --- properties ------------------------------------------------------------------

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` for clients (``bootstrap.servers``, Spark's ``kafka.bootstrap.servers``)."""
        return f"{self.host}:{self.port}"

    @property
    def address(self) -> str:
        return self.bootstrap_servers

    @property
    def config_path(self) -> Path:
        return self.data_dir / CONFIG_FILE_NAME

    @property
    def log_dir(self) -> Path:
        """Kafka's ``log.dirs``: the topics' data."""
        return self.data_dir / "logs"

    # --- lifecycle -------------------------------------------------------------------

    def start(self, timeout_s: float = 60.0) -> None:
        """Format the log directory if needed, launch the broker and wait until it serves.

        Raises:
            KafkaServerError: no Java, the jars cannot be fetched, already running, formatting
                failed, the JVM exited, or the broker was not ready in time (the message carries
                the tail of the log).
        """
        with self._lock:
            if self.running:
                raise KafkaServerError(f"Kafka at {self.bootstrap_servers} (pid {self.pid}) is already running")
            try:
                java = find_java()
            except JavaNotFoundError as e:
                raise KafkaServerError(f"the embedded Kafka broker needs Java 17 or newer: {e}") from e
            classpath = os.pathsep.join(str(jar) for jar in (self._jars if self._jars is not None else broker_jars()))
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self._port = self._requested_port if self._requested_port is not None else free_port(self.host)
            self._controller_port = free_port(self.host)
            while self._controller_port == self._port:
                self._controller_port = free_port(self.host)
            self._write_config()
            base = [java, *self.jvm_options, f"-Dlog4j2.configurationFile={self.data_dir / LOG4J_FILE_NAME}", "-cp", classpath]
            self._format(base)
            logger.info(
                "starting Kafka on %s (controller port %s, data %s)", self.bootstrap_servers, self._controller_port, self.data_dir
            )
            started = time.monotonic()
            self._launch([*base, MAIN_CLASS, str(self.config_path)])
            try:
                self._wait_ready(timeout_s)
            except BaseException:
                self._terminate(grace_s=2.0)
                raise
            self.started_in_s = time.monotonic() - started
            logger.info("Kafka ready on %s (pid %s) in %.2fs", self.bootstrap_servers, self.pid, self.started_in_s)

    def _write_config(self) -> None:
        assert self._controller_port is not None
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{self.host}:{self._controller_port}",
            "listeners": f"PLAINTEXT://{self.host}:{self.port},CONTROLLER://{self.host}:{self._controller_port}",
            "advertised.listeners": f"PLAINTEXT://{self.host}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.log_dir.resolve()),
            "num.partitions": "1",
            "default.replication.factor": "1",
            "min.insync.replicas": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            **self.properties,
        }
        lines = ["# Written by stream_ops EmbeddedKafka; regenerated at every start"]
        lines += [f"{key}={value}" for key, value in settings.items()]
        self.config_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        (self.data_dir / LOG4J_FILE_NAME).write_text(_LOG4J2_PROPERTIES, encoding="utf-8")

    def _format(self, base: list[str]) -> None:
        """Format the log directory with a fresh cluster id, unless it already is formatted."""
        meta = self.log_dir / "meta.properties"
        if meta.exists():
            for line in meta.read_text(encoding="utf-8").splitlines():
                if line.startswith("cluster.id="):
                    self.cluster_id = line.partition("=")[2].strip()
            return
        self.cluster_id = random_cluster_id()
        command = [*base, STORAGE_TOOL_CLASS, "format", "-t", self.cluster_id, "-c", str(self.config_path)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False, cwd=self.data_dir)
        except subprocess.TimeoutExpired as e:
            raise KafkaServerError(f"formatting the Kafka log directory {self.log_dir} took more than 120 s") from e
        if done.returncode != 0:
            raise KafkaServerError(
                f"formatting the Kafka log directory {self.log_dir} failed (exit {done.returncode}):\n"
                + "\n".join((done.stdout + done.stderr).strip().splitlines()[-_LOG_TAIL_LINES:])
            )

    def _probe_client(self) -> Any:
        from confluent_kafka.admin import AdminClient

        # log_level 0: librdkafka would print every refused connection while the JVM starts
        return AdminClient(client_config(self.bootstrap_servers, log_level=0, **{"reconnect.backoff.max.ms": 200}))

    def _probe(self, admin: Any = None) -> tuple[bool, str]:
        """(whether the broker serves metadata with itself in it, why not)."""
        from confluent_kafka import KafkaException

        admin = admin if admin is not None else self._probe_client()
        try:
            metadata = admin.list_topics(timeout=PROBE_TIMEOUT_S)
        except KafkaException as e:
            return False, str(e)
        if not metadata.brokers:
            return False, "metadata lists no broker yet"
        return True, ""

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last_error = "no reply yet"
        admin = self._probe_client()
        while True:
            assert self._proc is not None
            code = self._proc.poll()
            if code is not None:
                raise KafkaServerError(
                    f"the Kafka JVM exited with code {code} before it was ready on {self.bootstrap_servers}; "
                    f"last lines of {self.log_path}:\n{self.log_tail()}"
                )
            ready, last_error = self._probe(admin)
            if ready and self._proc.poll() is None:
                return
            if time.monotonic() >= deadline:
                raise KafkaServerError(
                    f"Kafka on {self.bootstrap_servers} was not ready after {timeout_s:.1f}s ({last_error}); "
                    f"last lines of {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(PROBE_INTERVAL_S)

    def is_serving(self) -> bool:
        """Whether the broker answers a metadata request right now."""
        return self.running and self._probe()[0]

    # --- topics ----------------------------------------------------------------------

    def admin_config(self) -> dict[str, Any]:
        """confluent-kafka client settings reaching this broker (logging through :mod:`logging`)."""
        return client_config(self.bootstrap_servers)

    def create_topic(
        self, name: str, partitions: int = 1, config: Mapping[str, str] | None = None, timeout_s: float = 30.0
    ) -> None:
        """Create topic ``name`` with ``partitions`` partitions (one replica) and wait until it is there.

        Raises:
            KafkaServerError: the topic exists already, Kafka refused (a bad name or setting) or
                did not answer in time.
        """
        if topic_partitions(self.bootstrap_servers, name, timeout_s=timeout_s) is not None:
            raise KafkaServerError(f"Kafka on {self.bootstrap_servers}: topic {name!r} already exists")
        ensure_topic(
            self.bootstrap_servers, name, partitions=partitions, replication_factor=1, topic_config=config, timeout_s=timeout_s
        )

    def ensure_topic(self, name: str, partitions: int = 1, timeout_s: float = 30.0) -> int:
        """Create topic ``name`` unless the broker has it; returns its partition count."""
        return ensure_topic(self.bootstrap_servers, name, partitions=partitions, replication_factor=1, timeout_s=timeout_s)

    def __repr__(self) -> str:
        port = self._port if self._port is not None else "?"
        state = "running" if self.running else "stopped"
        return f"EmbeddedKafka({self.host}:{port}, {state}, data_dir={str(self.data_dir)!r})"
