"""Start and stop ``stream-ops worker`` processes (used by the supervisor, the local stack and
the Dagster worker op)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from stream_ops.config import ZooKeeperConfig
from stream_ops.runtime.worker_pipe import WorkerSecrets, write_secrets


def worker_command(
    zookeeper: ZooKeeperConfig,
    home: Path,
    *,
    host: str,
    port: int,
    extra_args: Sequence[str] = (),
    global_args: Sequence[str] = (),
) -> list[str]:
    """The command line of one worker process on ``host:port``.

    ``global_args`` go before the ``worker`` verb (``--zk-open-reads``, ``--local-dir``, ...),
    ``extra_args`` after it. Never a secret: command lines are public (``ps``).
    """
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
        *global_args,
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


def start_worker(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str],
    secrets: WorkerSecrets,
    stop_with_parent: bool = True,
    output: int | None = None,
) -> subprocess.Popen[bytes]:
    """Start a worker command (:func:`worker_command`) with exactly ``env``, in its own process
    group, its secrets written on its stdin (``--secrets-fd 0``), never in its environment or
    on its command line.

    Args:
        cmd: The worker's command line.
        env: Its whole environment (:func:`~stream_ops.topology_env.topology_environment`).
        secrets: Its ZooKeeper credentials and query token.
        stop_with_parent: Keep stdin open as a lifeline (``--stop-on-stdin-eof``): the worker
            stops cleanly when this process closes it or dies, even by SIGKILL.
        output: Where its stdout and stderr go (``subprocess.PIPE`` to read them); None: this
            process's own.
    """
    args = [*cmd, "--secrets-fd", "0", *(["--stop-on-stdin-eof"] if stop_with_parent else [])]
    proc = subprocess.Popen(
        args,
        stdin=subprocess.PIPE,
        stdout=output,
        stderr=subprocess.STDOUT if output is not None else None,
        env=dict(env),
        start_new_session=True,
    )
    assert proc.stdin is not None
    try:
        write_secrets(proc.stdin, secrets)
    except BrokenPipeError:
        pass  # it exited before reading them: its exit code and output say why
    if not stop_with_parent:
        proc.stdin.close()
    return proc


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
