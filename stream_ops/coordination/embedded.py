"""A real, single-node ZooKeeper server run from the jars that pyspark ships.

The pyspark wheel contains ``zookeeper-<version>.jar`` (and its jute, netty, slf4j and log4j
dependencies) in ``pyspark/jars``, so a Java runtime is all that is needed to run ZooKeeper
locally::

    java -cp "<pyspark>/jars/*" org.apache.zookeeper.server.ZooKeeperServerMain <zoo.cfg>

(The classpath actually used lists only the jars ZooKeeper needs, see
:func:`zookeeper_classpath`; it starts faster and falls back to ``jars/*``.)

:class:`EmbeddedZooKeeper` writes the ``zoo.cfg`` (see FACTS.md for why each setting is there),
launches the JVM in its own process group with its output in ``<data_dir>/zookeeper.log``,
and reports ready only once the server answers the ``srvr`` four-letter word with a
``Mode:`` line: an open port or a live process is not proof that the server serves.

Example:
    >>> from pathlib import Path
    >>> with EmbeddedZooKeeper(Path("/tmp/zk")) as zk:  # doctest: +SKIP
    ...     print(zk.hosts)
    127.0.0.1:41234

The CLI (``stream-ops zookeeper start``) runs a server in the foreground with
:func:`~stream_ops.jvm_server.serve_forever`.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Sequence
from pathlib import Path

from stream_ops.errors import ZooKeeperServerError
from stream_ops.jvm_server import JvmServer, find_java
from stream_ops.ports import free_port, port_is_free

logger = logging.getLogger(__name__)

MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
LOG_FILE_NAME = "zookeeper.log"
CONFIG_FILE_NAME = "zoo.cfg"
LOG4J_FILE_NAME = "log4j2.properties"
PROBE_TIMEOUT_S = 0.25
PROBE_INTERVAL_S = 0.05
#: Largest session timeout the server grants, in milliseconds (clients asking for more get this).
MAX_SESSION_TIMEOUT_MS = 120_000

#: JVM options: a small heap, serial GC and C1-only JIT. Measured on 2 cores, C1-only plus
#: the short classpath below make the server ready ~2.5x sooner than ``-cp jars/*`` with the
#: default JIT (0.9-1.0 s vs 2.2-2.9 s under load); a local ZooKeeper is client-bound anyway.
DEFAULT_JVM_OPTIONS: tuple[str, ...] = (
    "-Xms32m",
    "-Xmx256m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Djava.awt.headless=true",
)

#: The jars of ``pyspark/jars`` the ZooKeeper server can load classes from (what ``jdeps``
#: reports for zookeeper-3.9 plus the log4j2 binding). The JVM searches every classpath
#: entry on each class load, so leaving out the other ~260 Spark jars speeds up the start.
_CLASSPATH_PATTERNS = (
    "zookeeper-*.jar",
    "slf4j-api-*.jar",
    "log4j-api-*.jar",
    "log4j-core-*.jar",
    "log4j-slf4j2-impl-*.jar",
    "netty-*.jar",
    "snappy-java-*.jar",
    "commons-io-*.jar",
    "commons-cli-*.jar",
    "metrics-core-*.jar",
    "audience-annotations-*.jar",
    "jackson-annotations-*.jar",
    "jackson-core-*.jar",
    "jackson-databind-*.jar",
    "jsr305-*.jar",
    "javax.servlet-api-*.jar",
    "jline-3*.jar",
)
#: Without these the short classpath is not trusted and all of ``jars/*`` is used.
_REQUIRED_PATTERNS = ("zookeeper-[0-9]*.jar", "zookeeper-jute-*.jar", "slf4j-api-*.jar")

_LOG4J2_PROPERTIES = """\
# Written by stream_ops: ZooKeeper logs to stdout, which EmbeddedZooKeeper sends to zookeeper.log
status = warn
appender.console.type = Console
appender.console.name = console
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{ISO8601} %-5p [%t] %c{1}: %m%n
rootLogger.level = info
rootLogger.appenderRef.console.ref = console
"""


def pyspark_jars_dir() -> Path:
    """Return the ``jars`` directory of the installed pyspark (holds the ZooKeeper jar).

    Raises:
        ZooKeeperServerError: pyspark is not installed or ships no ZooKeeper jar.
    """
    try:
        import pyspark
    except ImportError as e:  # pragma: no cover - pyspark is a hard dependency
        raise ZooKeeperServerError(
            "pyspark is not installed; the embedded ZooKeeper runs from pyspark's jars. "
            "Install stream-ops with its dependencies (`pip install stream-ops`)."
        ) from e
    jars = Path(pyspark.__file__).resolve().parent / "jars"
    if not any(jars.glob("zookeeper-*.jar")):
        raise ZooKeeperServerError(
            f"No zookeeper-*.jar in {jars}; reinstall pyspark (the wheel ships ZooKeeper) "
            "or run a ZooKeeper server yourself and point stream_ops at it."
        )
    return jars


def zookeeper_classpath(jars_dir: Path) -> str:
    """Classpath for the ZooKeeper server from pyspark's jars.

    Lists only the jars ZooKeeper needs when they are all recognisable, otherwise falls back to
    ``<jars_dir>/*`` (every jar, slower to start but always complete).
    """
    if all(any(jars_dir.glob(pattern)) for pattern in _REQUIRED_PATTERNS):
        jars: list[str] = []
        for pattern in _CLASSPATH_PATTERNS:
            jars.extend(str(p) for p in sorted(jars_dir.glob(pattern)) if str(p) not in jars)
        return os.pathsep.join(jars)
    return f"{jars_dir}{os.sep}*"


def four_letter_word(host: str, port: int, word: str = "srvr", timeout_s: float = PROBE_TIMEOUT_S) -> str:
    """Send a ZooKeeper four-letter command and return the reply.

    Args:
        host: Server address.
        port: Client port.
        word: Command, one of the whitelisted ``srvr``, ``ruok``, ``mntr``, ``stat``.
        timeout_s: Socket timeout for connect and each read.

    Raises:
        OSError: Connection refused, reset or timed out.
    """
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.settimeout(timeout_s)
        sock.sendall(word.encode("ascii"))
        chunks: list[bytes] = []
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")


class EmbeddedZooKeeper(JvmServer):
    """One standalone ZooKeeper server in a child JVM.

    Args:
        data_dir: Directory for snapshots, transaction logs, ``zoo.cfg`` and ``zookeeper.log``.
            Created if missing; reusing it keeps the data of an earlier run.
        port: Client port; ``None`` picks a free one.
        host: Interface to listen on (``clientPortAddress``).
        tick_time_ms: ZooKeeper ``tickTime``. Session timeouts are bounded below by
            ``2 * tick_time_ms``, so keep it small for fast tests.
        jvm_options: JVM flags; ``None`` means :data:`DEFAULT_JVM_OPTIONS`.

    Example:
        >>> zk = EmbeddedZooKeeper(Path("/tmp/zk"), tick_time_ms=500)  # doctest: +SKIP
        >>> zk.start()  # doctest: +SKIP
        >>> zk.hosts  # doctest: +SKIP
        '127.0.0.1:38211'
        >>> zk.stop()  # doctest: +SKIP
    """

    kind = "ZooKeeper"
    log_file_name = LOG_FILE_NAME
    error_type = ZooKeeperServerError

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        host: str = "127.0.0.1",
        tick_time_ms: int = 500,
        jvm_options: Sequence[str] | None = None,
    ) -> None:
        if tick_time_ms < 1:
            raise ValueError(f"tick_time_ms must be positive, got {tick_time_ms}")
        super().__init__(Path(data_dir), host, port)
        self.tick_time_ms = tick_time_ms
        self.jvm_options: tuple[str, ...] = tuple(DEFAULT_JVM_OPTIONS if jvm_options is None else jvm_options)

    # --- properties ------------------------------------------------------------------

    @property
    def hosts(self) -> str:
        """Connection string ``host:port`` for clients."""
        return f"{self.host}:{self.port}"

    @property
    def address(self) -> str:
        return self.hosts

    @property
    def config_path(self) -> Path:
        """Where the generated ``zoo.cfg`` lives."""
        return self.data_dir / CONFIG_FILE_NAME

    # --- lifecycle -------------------------------------------------------------------

    def start(self, timeout_s: float = 30.0) -> None:
        """Launch the server and wait until it serves.

        Args:
            timeout_s: How long to wait for the server to answer ``srvr`` with ``Mode:``.

        Raises:
            JavaNotFoundError: No Java runtime.
            ZooKeeperServerError: Already running, port taken, the JVM exited, or the server
                did not become ready in time (the message carries the tail of the log).
        """
        with self._lock:
            if self.running:
                raise ZooKeeperServerError(f"ZooKeeper at {self.hosts} (pid {self.pid}) is already running")
            java = find_java()
            jars = pyspark_jars_dir()
            self.data_dir.mkdir(parents=True, exist_ok=True)
            if self._requested_port is None:
                self._port = free_port(self.host)
            elif not port_is_free(self.host, self._requested_port):
                raise ZooKeeperServerError(
                    f"port {self.host}:{self._requested_port} is already in use; stop whatever "
                    "listens there or choose another port (or none, to pick a free one)"
                )
            self._write_config()
            cmd = [
                java,
                *self.jvm_options,
                f"-Dlog4j2.configurationFile={self.data_dir / LOG4J_FILE_NAME}",
                "-Dzookeeper.jmx.log4j.disable=true",
                "-cp",
                zookeeper_classpath(jars),
                MAIN_CLASS,
                str(self.config_path),
            ]
            logger.info("starting ZooKeeper on %s (data %s)", self.hosts, self.data_dir)
            self._launch(cmd)
            started = time.monotonic()
            try:
                self._wait_ready(timeout_s)
            except BaseException:
                self._terminate(grace_s=2.0)
                raise
            logger.info("ZooKeeper ready on %s (pid %s) in %.2fs", self.hosts, self.pid, time.monotonic() - started)

    def _write_config(self) -> None:
        tick = self.tick_time_ms
        lines = [
            "# Written by stream_ops EmbeddedZooKeeper; regenerated at every start",
            f"dataDir={self.data_dir.resolve()}",
            f"clientPort={self.port}",
            f"clientPortAddress={self.host}",
            f"tickTime={tick}",
            f"minSessionTimeout={2 * tick}",
            f"maxSessionTimeout={max(MAX_SESSION_TIMEOUT_MS, 20 * tick)}",
            "initLimit=10",
            "syncLimit=5",
            "maxClientCnxns=0",
            "admin.enableServer=false",
            "4lw.commands.whitelist=srvr,ruok,mntr,stat",
            "autopurge.snapRetainCount=3",
            "autopurge.purgeInterval=1",
        ]
        self.config_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        (self.data_dir / LOG4J_FILE_NAME).write_text(_LOG4J2_PROPERTIES, encoding="utf-8")

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last_error: str = "no reply yet"
        while True:
            assert self._proc is not None
            code = self._proc.poll()
            if code is not None:
                raise ZooKeeperServerError(
                    f"ZooKeeper JVM exited with code {code} before it was ready on {self.hosts}; "
                    f"last lines of {self.log_path}:\n{self.log_tail()}"
                )
            try:
                reply = four_letter_word(self.host, self.port, "srvr")
            except OSError as e:
                last_error = f"{type(e).__name__}: {e}"
            else:
                if "Mode:" in reply:
                    # Guard against answering for someone else's server on a reused port.
                    if self._proc.poll() is None:
                        return
                    continue
                last_error = f"reply without Mode: {reply[:200]!r}"
            if time.monotonic() >= deadline:
                raise ZooKeeperServerError(
                    f"ZooKeeper on {self.hosts} was not ready after {timeout_s:.1f}s ({last_error}); "
                    f"last lines of {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(PROBE_INTERVAL_S)

    def is_serving(self) -> bool:
        """Whether the server answers ``srvr`` with a ``Mode:`` line right now."""
        if not self.running:
            return False
        try:
            return "Mode:" in four_letter_word(self.host, self.port, "srvr")
        except OSError:
            return False

    def __repr__(self) -> str:
        port = self._port if self._port is not None else "?"
        state = "running" if self.running else "stopped"
        return f"EmbeddedZooKeeper({self.host}:{port}, {state}, data_dir={str(self.data_dir)!r})"
