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


#: Variables ``stream-ops`` reads for the options a worker is started with, each as the option
#: (before the ``worker`` verb, or after it) that says the same on a command line.
WORKER_OPTION_ENV: Mapping[str, tuple[str, str]] = {
    "STREAM_OPS_ZK_AUTH_FILE": ("global", "--zk-auth-file"),
    "STREAM_OPS_ZK_OPEN_READS": ("global", "--zk-open-reads"),
    "STREAM_OPS_LOCAL_DIR": ("global", "--local-dir"),
    "STREAM_OPS_QUERY_TOKEN_FILE": ("global", "--query-token-file"),
    "STREAM_OPS_QUERY_TLS_CA": ("global", "--query-tls-ca"),
    "STREAM_OPS_TOPOLOGY_DEFAULTS": ("global", "--topology-default"),
    "STREAM_OPS_QUERY_TLS_CERT": ("worker", "--query-tls-cert"),
    "STREAM_OPS_QUERY_TLS_KEY": ("worker", "--query-tls-key"),
}

#: Variables of a worker's options that :func:`worker_command` always gives on the command line.
WORKER_COMMAND_ENV = frozenset({"STREAM_OPS_ZOOKEEPER", "STREAM_OPS_CHROOT", "STREAM_OPS_HOME", "STREAM_OPS_SESSION_TIMEOUT"})

#: Variables of a worker's secret options, passed on its secrets pipe (:class:`WorkerSecrets`).
WORKER_SECRET_ENV = frozenset({"STREAM_OPS_ZK_AUTH", "STREAM_OPS_QUERY_TOKEN"})


def worker_launch_from_env(env: Mapping[str, str]) -> tuple[list[str], list[str], WorkerSecrets]:
    """What ``env`` tells a worker through the variables its options read, said instead as
    arguments (global ones, the worker verb's) and secrets for its pipe.

    A worker that finds variables beyond the allow-list in its environment starts itself again
    without them (``stream-ops worker``), importing everything a second time (~1 s). A worker
    started with :func:`~stream_ops.topology_env.topology_environment` of ``env``, these
    arguments and these secrets on ``--secrets-fd`` runs with the same settings and starts once.
    """
    global_args: list[str] = []
    worker_args: list[str] = []
    for name, (where, option) in WORKER_OPTION_ENV.items():
        value = env.get(name)
        if not value:
            continue
        target = global_args if where == "global" else worker_args
        if option == "--zk-open-reads":
            target.append(option if value.strip().lower() in ("1", "true", "yes", "on", "t", "y") else "--no-zk-open-reads")
        elif option == "--topology-default":
            for item in value.split():
                target += [option, item]
        else:
            target += [option, value]
    secrets = WorkerSecrets(zk_auth=env.get("STREAM_OPS_ZK_AUTH") or None, query_token=env.get("STREAM_OPS_QUERY_TOKEN") or None)
    return global_args, worker_args, secrets
