"""The environment of processes that run topology code is an allow-list (``stream_ops/topology_env.py``):
what is kept, what is dropped whatever its name, what an operator may pass through and what not."""

from __future__ import annotations

import os
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from stream_ops.cli import main
from stream_ops.errors import TopologyEnvironmentError
from stream_ops.topology_env import (
    PASS_ENV_VARIABLE,
    check_pass_env,
    exec_environment,
    reduce_environ,
    topology_environment,
)

KEPT = {
    "PATH": "/usr/bin",
    "HOME": "/home/w",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TZ": "UTC",
    "TMPDIR": "/tmp",
    "JAVA_HOME": "/usr/lib/jvm/17",
    "SPARK_HOME": "/opt/spark",
    "SPARK_LOCAL_IP": "10.0.0.5",
    "SPARK_LOCAL_HOSTNAME": "w1",
    "PYSPARK_PYTHON": "/venv/bin/python",
    "HADOOP_CONF_DIR": "/etc/hadoop",
    "VIRTUAL_ENV": "/venv",
    "PYTHONPATH": "/code",
    "STREAM_OPS_CACHE": "/cache",
}
DROPPED = {
    "DAGSTER_PG_PASSWORD": "pg",
    "DAGSTER_HOME": "/dagster",
    "PGPASSWORD": "pg",
    "STREAM_OPS_ZK_AUTH": "u:p",
    "STREAM_OPS_ZK_AUTH_FILE": "/secrets/zk",
    "STREAM_OPS_QUERY_TOKEN": "t" * 20,
    "STREAM_OPS_QUERY_TOKEN_FILE": "/secrets/token",
    "STREAM_OPS_ZOOKEEPER": "zk:2181",
    "PYSPARK_GATEWAY_SECRET": "gw",
    "AWS_SECRET_ACCESS_KEY": "aws",
    "KAFKA_PASSWORD": "kafka",
    "SOMETHING_NOBODY_LISTED": "x",
}


def test_only_the_allow_list_is_kept_whatever_the_other_names_are() -> None:
    assert topology_environment({**KEPT, **DROPPED}) == KEPT


def test_pass_through_names_are_kept_and_listed_so_reducing_again_changes_nothing() -> None:
    environ = {**KEPT, **DROPPED, PASS_ENV_VARIABLE: "KAFKA_PASSWORD"}
    reduced = topology_environment(environ, ["AWS_SECRET_ACCESS_KEY", "NOT_SET_HERE"])
    assert reduced == {
        **KEPT,
        "KAFKA_PASSWORD": "kafka",
        "AWS_SECRET_ACCESS_KEY": "aws",
        PASS_ENV_VARIABLE: "AWS_SECRET_ACCESS_KEY,KAFKA_PASSWORD,NOT_SET_HERE",
    }
    assert topology_environment(reduced) == reduced
    assert PASS_ENV_VARIABLE not in topology_environment({**KEPT, PASS_ENV_VARIABLE: " , "})


@pytest.mark.parametrize(
    "name",
    [
        "STREAM_OPS_ZK_AUTH",
        "STREAM_OPS_ZK_AUTH_FILE",
        "STREAM_OPS_QUERY_TOKEN",
        "STREAM_OPS_QUERY_TOKEN_FILE",
        "STREAM_OPS_QUERY_TLS_KEY",
        "DAGSTER_PG_PASSWORD",
        "DAGSTER_HOME",
        "PGPASSWORD",
        "PGPASSFILE",
        "POSTGRES_PASSWORD",
        "MYSQL_PASSWORD",
        "PYSPARK_GATEWAY_SECRET",
    ],
)
def test_secrets_of_stream_ops_dagster_and_databases_cannot_be_passed_through(name: str) -> None:
    with pytest.raises(TopologyEnvironmentError, match=f"{name} may not be passed through"):
        check_pass_env(["KAFKA_PASSWORD", name])
    with pytest.raises(TopologyEnvironmentError, match=name):
        topology_environment({**KEPT, name: "secret", PASS_ENV_VARIABLE: f"KAFKA_PASSWORD {name}"})


@pytest.mark.parametrize("name", ["", "1ABC", "A-B", "A=B", "A B"])
def test_a_pass_through_must_be_a_variable_name(name: str) -> None:
    with pytest.raises(TopologyEnvironmentError, match="is not an environment variable name"):
        check_pass_env([name])


def test_reduce_environ_reduces_this_process_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "environ", os.environ.copy())  # a copy: the test process keeps its own
    os.environ.clear()
    os.environ.update({**KEPT, **DROPPED})
    dropped = reduce_environ(["KAFKA_PASSWORD"])
    assert dropped == sorted(set(DROPPED) - {"KAFKA_PASSWORD"})
    assert dict(os.environ) == {**KEPT, "KAFKA_PASSWORD": "kafka", PASS_ENV_VARIABLE: "KAFKA_PASSWORD"}


def test_exec_environment_reads_the_block_the_process_was_started_with(tmp_path: Path) -> None:
    block = tmp_path / "environ"
    block.write_bytes(b"PATH=/bin\0EMPTY=\0WITH_EQUALS=a=b\0\0")
    assert exec_environment(block) == {"PATH": "/bin", "EMPTY": "", "WITH_EQUALS": "a=b"}
    assert exec_environment(tmp_path / "missing") is None


@pytest.mark.parametrize(
    ("args", "env"),
    [(["--pass-env", "KAFKA_PASSWORD", "--pass-env", "DAGSTER_PG_PASSWORD"], {}), ([], {PASS_ENV_VARIABLE: "PGPASSWORD"})],
)
def test_the_worker_refuses_a_secret_pass_through_before_it_starts(args: list[str], env: dict[str, str]) -> None:
    result = CliRunner().invoke(main, ["--zookeeper", "127.0.0.1:1", "--zk-auth", "u:zk-pass-123", "worker", *args], env=env)
    assert result.exit_code == 1
    assert "may not be passed through to topology code" in result.output
    assert "zk-pass-123" not in result.output


def test_a_workers_restart_command_line_parses_to_the_same_settings_without_its_secrets(tmp_path: Path) -> None:
    from stream_ops.cli import _WORKER_SECRET_OPTIONS, _given_options

    # What stream-ops worker rebuilds to start itself again (exec) without its secrets.
    token_file = tmp_path / "token"
    token_file.write_text("query-token-hush-0123456789\n")
    group_args = ["--zookeeper", "zk1:2181", "--chroot", "/c", "--home", str(tmp_path), "--zk-auth", "u:hush-zk"]
    group_args += ["--query-token-file", str(token_file), "--zk-open-reads", "--topology-default", "a=1", "--log-level", "DEBUG"]
    worker_args = ["--port", "6701", "--spark-conf", "spark.x=1", "--spark-conf", "spark.y=a=b", "--pass-env", "KAFKA_PASSWORD"]
    worker_args += ["--no-kafka-connector", "--stop-on-stdin-eof", "--secrets-fd", "7", "--dist-dir", "d"]

    def parse(group: list[str], worker: list[str]) -> tuple[click.Context, click.Context]:
        parent = main.make_context("stream-ops", [*group, "worker", *worker])
        command = main.get_command(parent, "worker")
        assert command is not None
        return parent, command.make_context("worker", list(worker), parent=parent)

    parent, child = parse(group_args, worker_args)
    rebuilt_group = _given_options(parent, skip=_WORKER_SECRET_OPTIONS)
    rebuilt_worker = _given_options(child, skip=frozenset({"secrets_fd"}))
    assert not any("hush" in arg or arg == str(token_file) for arg in rebuilt_group + rebuilt_worker)
    parent_again, child_again = parse(rebuilt_group, rebuilt_worker)
    assert {k: v for k, v in parent_again.params.items() if k not in _WORKER_SECRET_OPTIONS} == {
        k: v for k, v in parent.params.items() if k not in _WORKER_SECRET_OPTIONS
    }
    assert {**child_again.params, "secrets_fd": 7} == child.params
