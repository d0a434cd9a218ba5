"""A JVM server run as a child process group: the shared lifecycle of the embedded ZooKeeper
(:mod:`stream_ops.coordination.embedded`) and the embedded Kafka broker
(:mod:`stream_ops.kafka.embedded`).

A subclass writes its configuration and calls :meth:`JvmServer._launch` with its command line
from its own ``start``, then waits until it serves. This class owns the rest: the process in
its own session (so a stop reaches the JVM and anything it started), the log file, the
idempotent SIGTERM-then-SIGKILL stop, a crash-like kill, the context manager.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

logger = logging.getLogger(__name__)

_LOG_TAIL_LINES = 40


class JvmServer:
    """Lifecycle of one JVM server process writing its output to ``data_dir / log_file_name``.

    Subclasses set :attr:`kind` (for messages) and :attr:`log_file_name`, implement ``start``
    and :attr:`address`, and call :meth:`_launch` / :meth:`_terminate` from ``start``.
    """

    kind = "server"
    log_file_name = "server.log"

    def __init__(self, data_dir: Path, host: str) -> None:
        self.data_dir = data_dir
        self.host = host
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_handle: IO[bytes] | None = None
        self._lock = threading.RLock()

    def start(self, timeout_s: float = 30.0) -> None:
        """Start the server and wait until it serves."""
        raise NotImplementedError

    @property
    def address(self) -> str:
        """``host:port`` clients connect to."""
        raise NotImplementedError

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
        """Start ``cmd`` in its own session, output appended to :attr:`log_path`; stopped at exit."""
        self._log_handle = open(self.log_path, "ab")  # noqa: SIM115 - closed in _cleanup()
        self._proc = subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=self._log_handle,
            stderr=subprocess.STDOUT,
            cwd=self.data_dir,
            start_new_session=True,
        )
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
