"""A worker started with its environment reduced to the allow-list gets what the rest said as
arguments and secrets (:func:`~stream_ops.runtime.processes.worker_launch_from_env`), so it need
not start itself again without it: it parses to the same settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest

from stream_ops import cli
from stream_ops.runtime.processes import WORKER_COMMAND_ENV, WORKER_OPTION_ENV, WORKER_SECRET_ENV, worker_launch_from_env


def _variables(command: click.Command) -> set[str]:
    return {p.envvar for p in command.params if isinstance(p, click.Option) and isinstance(p.envvar, str)}


def _parsed(args: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The global and worker options ``stream-ops <args>`` parses to (the current environment read too)."""
    split = args.index("worker")
    group = cli.main.make_context("stream-ops", [*args[:split], "worker"])
    worker = cli.worker.make_context("worker", args[split + 1 :], parent=group)
    return dict(group.params), dict(worker.params)


def test_every_variable_a_worker_reads_is_said_another_way() -> None:
    read = _variables(cli.main) | _variables(cli.worker)
    assert read == set(WORKER_OPTION_ENV) | WORKER_COMMAND_ENV | WORKER_SECRET_ENV


def test_arguments_parse_to_what_the_environment_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = {name: tmp_path / name for name in ("auth", "token", "ca.pem", "cert.pem", "key.pem")}
    for path in files.values():
        path.write_text("x\n")
    env = {
        "STREAM_OPS_ZK_AUTH_FILE": str(files["auth"]),
        "STREAM_OPS_ZK_OPEN_READS": "true",
        "STREAM_OPS_LOCAL_DIR": str(tmp_path / "local"),
        "STREAM_OPS_QUERY_TOKEN_FILE": str(files["token"]),
        "STREAM_OPS_QUERY_TLS_CA": str(files["ca.pem"]),
        "STREAM_OPS_TOPOLOGY_DEFAULTS": "state_topic=kafka retries=3",
        "STREAM_OPS_QUERY_TLS_CERT": str(files["cert.pem"]),
        "STREAM_OPS_QUERY_TLS_KEY": str(files["key.pem"]),
    }
    for name in set(WORKER_OPTION_ENV) | WORKER_COMMAND_ENV | WORKER_SECRET_ENV:
        monkeypatch.delenv(name, raising=False)
    global_args, worker_args, secrets = worker_launch_from_env(env)
    from_args = _parsed([*global_args, "worker", *worker_args])
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert from_args == _parsed(["worker"])
    assert secrets.zk_auth is None and secrets.query_token is None


def test_secrets_go_to_the_pipe_never_to_the_arguments() -> None:
    global_args, worker_args, secrets = worker_launch_from_env(
        {"STREAM_OPS_ZK_AUTH": "user:password", "STREAM_OPS_QUERY_TOKEN": "token", "STREAM_OPS_ZK_OPEN_READS": "false"}
    )
    assert (global_args, worker_args) == (["--no-zk-open-reads"], [])
    assert (secrets.zk_auth, secrets.query_token) == ("user:password", "token")
