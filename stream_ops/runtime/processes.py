"""Start and stop ``stream-ops worker`` processes (used by the supervisor and the local stack)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from stream_ops.config import ZooKeeperConfig


def worker_command(
    zookeeper: ZooKeeperConfig,
    home: Path,
    *,
    host: str,
    port: int,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The command line of one worker process on ``host:port``."""
    return [
        sys.executable,
        "-m",
        "stream_ops.cli",
        "--zookeeper",
        zookeeper.hosts,
        "--chroot",
        zookeeper.chroot,
        "--home",
        str(home),
        "--session-timeout",
        str(zookeeper.session_timeout_s),
        "worker",
        "--host",
        host,
        "--port",
        str(port),
        *extra_args,
    ]


def spawn(cmd: Sequence[str], log: Path, env: Mapping[str, str] | None = None) -> subprocess.Popen[Any]:
    """Start ``cmd`` in its own process group (so its JVM dies with it), output to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(
            list(cmd),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )


def kill_group(proc: subprocess.Popen[Any], sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to the process group of ``proc`` (a crash, for SIGKILL)."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def stop_process(proc: subprocess.Popen[Any], timeout_s: float = 20.0) -> None:
    """SIGTERM the process group, then SIGKILL it if it is still there after ``timeout_s``."""
    if proc.poll() is not None:
        return
    kill_group(proc, signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(proc, signal.SIGKILL)
        proc.wait(5)
