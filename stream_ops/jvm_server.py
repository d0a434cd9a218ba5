"""A JVM server run as a child process group: the shared lifecycle of the embedded ZooKeeper
(:mod:`stream_ops.coordination.embedded`) and the embedded Kafka broker
(:mod:`stream_ops.kafka.embedded`).

A subclass writes its configuration and calls :meth:`JvmServer._launch` with its command line
from its own ``start``, then waits until it serves. This class owns the rest: the process in
its own session (so a stop reaches the JVM and anything it started), the log file, the
idempotent SIGTERM-then-SIGKILL stop, a crash-like kill, the context manager, and
:func:`serve_forever` (the foreground ``stream-ops zookeeper start`` / ``kafka start``).

The JVM dies with the process that started it, even when that one is SIGKILLed and so cannot
stop it: on Linux the child asks the kernel for SIGKILL when its parent goes
(``prctl(PR_SET_PDEATHSIG)``, between fork and exec; a parent that died before that is seen
through ``getppid()``). Its own session keeps it out of its parent's process group, so a
signal to that group (Ctrl-C in a terminal, a SIGKILL of the group) reaches it only this way.
The kernel's "parent" is the *thread* that started the JVM: call ``start`` from a thread that
lives as long as the server (the main thread, or the thread that also stops it, as
:func:`serve_forever` does), or the JVM is killed when that thread ends.
"""

from __future__ import annotations

import abc
import atexit
import contextlib
import ctypes
import functools
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, ClassVar, Self

from stream_ops.errors import JavaNotFoundError, StreamOpsError

logger = logging.getLogger(__name__)

_LOG_TAIL_LINES = 40
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def find_java() -> str:
    """Locate the ``java`` executable.

    ``$JAVA_HOME/bin/java`` wins when it exists; otherwise ``java`` on ``PATH``.

    Returns:
        The path of the java executable.

    Raises:
        JavaNotFoundError: No Java runtime was found.

    Example:
        >>> find_java()  # doctest: +SKIP
        '/usr/bin/java'
    """
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
        logger.warning("JAVA_HOME=%s has no executable bin/java; looking on PATH", java_home)
    found = shutil.which("java")
    if found:
        return found
    raise JavaNotFoundError(
        "No Java runtime found: the embedded ZooKeeper needs Java 17 or newer. Install it "
        "(e.g. `apt-get install openjdk-17-jre-headless` or `brew install openjdk@17`) and put "
        "`java` on PATH, or set JAVA_HOME to the JDK/JRE directory."
        + (f" (JAVA_HOME={java_home} has no bin/java)" if java_home else "")
    )


@functools.cache
def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, resolved once in the parent (None where there is none: not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - a Linux libc without prctl
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child die (SIGKILL) when the thread starting it ends.

    Made in the parent, run in the child between fork and exec: it only calls the ``prctl``
    resolved here and compares ``getppid()`` with this process's pid (if the parent died
    before the ``prctl``, the child was already handed to another parent and exits at once).
    The setting survives exec. None where the kernel offers no such thing.
    """
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def _preexec() -> None:
        if prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:
            os._exit(1)

    return _preexec


class JvmServer(abc.ABC):
    """Lifecycle of one JVM server process writing its output to ``data_dir / log_file_name``.

    Subclasses set :attr:`kind` (for messages), :attr:`log_file_name` and :attr:`error_type`,
    implement ``start`` and :attr:`address`, and call :meth:`_launch` / :meth:`_terminate` from
    ``start``.
    """

    kind: ClassVar[str] = "server"
    log_file_name: ClassVar[str] = "server.log"
    error_type: ClassVar[type[StreamOpsError]] = StreamOpsError
    """What :func:`serve_forever` raises when the JVM dies while serving."""

    def __init__(self, data_dir: Path, host: str, port: int | None) -> None:
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"port must be in 1..65535, got {port}")
        self.data_dir = data_dir
        self.host = host
        self._requested_port = port
        self._port: int | None = port
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_handle: IO[bytes] | None = None
        self._lock = threading.RLock()

    @property
    def port(self) -> int:
        """The client port (chosen at :meth:`start` when none was given)."""
        if self._port is None:
            raise self.error_type(f"the {self.kind} server has no port yet: call start() first")
        return self._port

    @abc.abstractmethod
    def start(self, timeout_s: float = 30.0) -> None:
        """Start the server and wait until it serves."""

    @property
    @abc.abstractmethod
    def address(self) -> str:
        """``host:port`` clients connect to."""

    @property
    def pid(self) -> int | None:
        """Process id of the JVM, None if never started."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        """Whether the JVM is alive (not proof that it serves)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def log_path(self) -> Path:
        """The JVM's combined stdout/stderr."""
        return self.data_dir / self.log_file_name

    def _launch(self, cmd: Sequence[str]) -> None:
        """Start ``cmd`` in its own session, output appended to :attr:`log_path`; stopped at exit,
        killed by the kernel when the calling thread ends (see the module docstring)."""
        self._log_handle = open(self.log_path, "ab")  # noqa: SIM115 - closed in _cleanup()
        try:
            self._proc = subprocess.Popen(
                list(cmd),
                stdin=subprocess.DEVNULL,
                stdout=self._log_handle,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,
                preexec_fn=die_with_parent(),  # only a prctl and a getppid() run between fork and exec
            )
        except (OSError, subprocess.SubprocessError) as e:
            self._cleanup()
            raise self.error_type(f"could not start the {self.kind} JVM ({cmd[0]}): {e}") from e
        atexit.register(self.stop)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the server: SIGTERM to its process group, SIGKILL after ``timeout_s``. Idempotent."""
        with self._lock:
            if self._proc is None:
                return
            was_running = self.running
            self._terminate(grace_s=timeout_s)
            if was_running:
                logger.info("%s on %s stopped", self.kind, self.address)

    def kill(self) -> None:
        """SIGKILL the process group at once (a crash; for tests)."""
        with self._lock:
            if self._proc is None:
                return
            self._signal(signal.SIGKILL)
            self._proc.wait()
            logger.info("%s on %s killed", self.kind, self.address)
            self._cleanup()

    def _signal(self, sig: signal.Signals) -> None:
        assert self._proc is not None
        try:
            os.killpg(self._proc.pid, sig)  # the whole group: the JVM and anything it started
        except ProcessLookupError:
            pass
        except PermissionError:  # pragma: no cover - group gone and pid reused
            if self._proc.poll() is None:
                self._proc.send_signal(sig)

    def _terminate(self, grace_s: float) -> None:
        assert self._proc is not None
        if self._proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                logger.warning("%s pid %s ignored SIGTERM for %.1fs; sending SIGKILL", self.kind, self.pid, grace_s)
                self._signal(signal.SIGKILL)
                self._proc.wait()
        else:
            self._signal(signal.SIGKILL)  # leftovers of the group, if any
        self._cleanup()

    def _cleanup(self) -> None:
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None
        atexit.unregister(self.stop)

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the server log (empty if there is none)."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@contextlib.contextmanager
def _stop_on_signals(stop_event: threading.Event, kind: str) -> Iterator[None]:
    """Set ``stop_event`` on SIGTERM/SIGINT while inside; handlers only in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _handler(signum: int, frame: FrameType | None) -> None:
        logger.info("received %s, stopping %s", signal.Signals(signum).name, kind)
        stop_event.set()

    previous = {sig: signal.signal(sig, _handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def serve_forever(
    server: JvmServer,
    stop_event: threading.Event | None = None,
    *,
    start_timeout_s: float = 30.0,
    poll_interval_s: float = 0.5,
) -> None:
    """Run ``server`` in the foreground until SIGTERM/SIGINT or ``stop_event``, then stop it.

    Starts the server if it is not running, logs its address, and waits. When called from
    the main thread, SIGTERM and SIGINT set the stop event (previous handlers are restored on
    return). The server is always stopped on the way out.

    Args:
        server: The server to run.
        stop_event: Set it from another thread to return; one is created if ``None``.
        start_timeout_s: Readiness timeout passed to the server's ``start``.
        poll_interval_s: How often to check that the JVM is still alive.

    Raises:
        StreamOpsError: (the server's :attr:`JvmServer.error_type`) the server could not
            start, or its JVM died while serving.

    Example:
        >>> serve_forever(EmbeddedZooKeeper(Path("var/zookeeper"), port=2181))  # doctest: +SKIP
    """
    event = stop_event if stop_event is not None else threading.Event()
    with _stop_on_signals(event, server.kind):
        try:
            if not server.running:
                server.start(timeout_s=start_timeout_s)
            logger.info(
                "%s serving on %s (pid %s, data %s, log %s); SIGTERM or Ctrl-C stops it",
                server.kind,
                server.address,
                server.pid,
                server.data_dir,
                server.log_path,
            )
            while not event.wait(poll_interval_s):
                if not server.running:
                    raise server.error_type(
                        f"{server.kind} on {server.address} exited unexpectedly; last lines of {server.log_path}:\n"
                        f"{server.log_tail()}"
                    )
        finally:
            server.stop()
