"""The cluster scripts give each process only the secrets it needs (issue 17, item 8): a worker
gets the ZooKeeper credentials and the query token, never the PostgreSQL password."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stream_ops.cluster_stack import deployment_dir, write_env_file

SECRETS = {
    "STREAM_OPS_ZK_AUTH": "stream-ops:zk-secret-41",
    "STREAM_OPS_QUERY_TOKEN": "query-token-0123456789abcdef",
    "DAGSTER_PG_PASSWORD": "pg-superuser-secret-77",
}


@pytest.fixture
def script_env(tmp_path: Path) -> dict[str, str]:
    cluster_env = write_env_file(tmp_path / "cluster.env", {"STREAM_OPS_PYTHON": sys.executable})
    secrets_env = write_env_file(tmp_path / "secrets.env", SECRETS, secret=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STREAM_OPS_", "DAGSTER_PG_"))}
    env.update(STREAM_OPS_CLUSTER_ENV=str(cluster_env), STREAM_OPS_SECRETS_FILE=str(secrets_env))
    return env


def _environment_after(script_env: dict[str, str], load: str) -> dict[str, str]:
    """The environment a process started after ``load`` (a load_secrets call) would inherit."""
    common = deployment_dir() / "bin" / "_common.sh"
    result = subprocess.run(["bash", "-c", f'source "{common}"; {load}; env -0'], env=script_env, capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr.decode()
    pairs = [item.split("=", 1) for item in result.stdout.decode().split("\0") if "=" in item]
    return {k: v for k, v in pairs}


def test_workers_and_the_cli_get_the_zookeeper_credentials_and_query_token_only(script_env: dict[str, str]) -> None:
    env = _environment_after(script_env, 'load_secrets "${STREAM_OPS_SECRETS[@]}"')
    assert env["STREAM_OPS_ZK_AUTH"] == SECRETS["STREAM_OPS_ZK_AUTH"]
    assert env["STREAM_OPS_QUERY_TOKEN"] == SECRETS["STREAM_OPS_QUERY_TOKEN"]
    assert "DAGSTER_PG_PASSWORD" not in env
    assert SECRETS["DAGSTER_PG_PASSWORD"] not in "\n".join(env.values())


def test_dagster_gets_the_postgres_password_and_the_zookeeper_credentials(script_env: dict[str, str]) -> None:
    env = _environment_after(script_env, 'load_secrets "${DAGSTER_SECRETS[@]}"')
    assert {k: env.get(k) for k in SECRETS} == SECRETS


def test_each_script_loads_only_what_it_needs() -> None:
    bin_dir = deployment_dir() / "bin"
    calls = {
        script.name: [line.strip() for line in script.read_text().splitlines() if line.strip().startswith("load_secrets")]
        for script in bin_dir.glob("*.sh")
        if script.name != "_common.sh"
    }
    assert calls["stream-ops-worker.sh"] == ['load_secrets "${STREAM_OPS_SECRETS[@]}"']
    assert calls["nimbus.sh"][0].startswith("load_secrets STREAM_OPS_ZK_AUTH")
    assert calls["postgres-local.sh"] == ["load_secrets DAGSTER_PG_PASSWORD"]
    assert calls["dagster.sh"] == ['load_secrets "${DAGSTER_SECRETS[@]}"']
    for name in ("spark-master.sh", "spark-worker.sh", "zookeeper.sh", "zookeeper-status.sh"):
        assert calls[name] == [], name


def test_a_secrets_file_readable_by_others_is_refused(script_env: dict[str, str]) -> None:
    Path(script_env["STREAM_OPS_SECRETS_FILE"]).chmod(0o644)
    common = deployment_dir() / "bin" / "_common.sh"
    result = subprocess.run(
        ["bash", "-c", f'source "{common}"; load_secrets STREAM_OPS_ZK_AUTH'],
        env=script_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1 and "chmod 600" in result.stderr
