"""Processes that run or move tasks refuse an unauthenticated ZooKeeper unless told ``--insecure``;
credentials come from a file; default paths are absolute (issue 17, items 2, 3 and 8)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from kazoo.client import KazooClient
from kazoo.security import OPEN_ACL_UNSAFE

from stream_ops.cli import main
from stream_ops.config import ZooKeeperConfig
from stream_ops.coordination.acl import audit_acls
from stream_ops.coordination.embedded import EmbeddedZooKeeper
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.local_stack import LocalStack
from stream_ops.nimbus.assignment import live_workers
from stream_ops.ports import free_port

REPO = Path(__file__).resolve().parents[3]
PASSWORD = "cli-file-password-7c1e"
CLUSTER_AUTH = f"stream-ops:{PASSWORD}"
_CREDENTIAL_ENV = ("STREAM_OPS_ZK_AUTH", "STREAM_OPS_ZK_AUTH_FILE", "STREAM_OPS_ZK_OPEN_READS", "STREAM_OPS_ZK_INSECURE")


@pytest.fixture(autouse=True)
def _clean_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI exports credentials into os.environ for its children: keep each test's to itself."""
    for name in _CREDENTIAL_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def auth_file(tmp_path: Path) -> Path:
    path = tmp_path / "zk-auth"
    path.write_text(CLUSTER_AUTH + "\n", encoding="utf-8")
    path.chmod(0o600)
    return path


def _invoke(zk_config: ZooKeeperConfig, tmp_path: Path, *args: str) -> object:
    base = ["--zookeeper", zk_config.hosts, "--chroot", zk_config.chroot, "--home", str(tmp_path / "home")]
    return CliRunner().invoke(main, [*base, *args])


def _worker_command(zk_config: ZooKeeperConfig, tmp_path: Path, port: int, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "stream_ops.cli",
        "--zookeeper",
        zk_config.hosts,
        "--chroot",
        zk_config.chroot,
        "--home",
        str(tmp_path / "home"),
        "--session-timeout",
        "4",
        "worker",
        "--port",
        str(port),
        "--trigger-seconds",
        "0.5",
        *extra,
    ]


def _run_to_end(command: list[str], timeout_s: float = 120.0) -> tuple[int | None, str]:
    """Run ``command`` in its own process group; a process that does not end in time is killed (group included)."""
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=timeout_s)
        return proc.returncode, output
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return None, output


def test_worker_without_credentials_refuses_and_with_insecure_starts(zk_config: ZooKeeperConfig, tmp_path: Path) -> None:
    port = free_port()
    code, output = _run_to_end(_worker_command(zk_config, tmp_path, port))
    assert code == 1, output[-2000:]
    assert "refusing to start the worker without ZooKeeper credentials" in output
    assert "--insecure" in output and "Traceback" not in output

    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            _worker_command(zk_config, tmp_path, port, "--insecure"),
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,
        )
    try:
        with ZkStore.connect(zk_config) as store:
            deadline = time.monotonic() + 120
            while f"127.0.0.1:{port}" not in live_workers(store):
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, f"the --insecure worker did not register; {log}"
                time.sleep(0.2)
        assert log.read_text().count("runs INSECURE") == 1  # and it says so in its log, once
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.mark.parametrize("verb", ["nimbus", "supervisor"])
def test_nimbus_and_supervisor_refuse_an_unauthenticated_tree(
    zk_config: ZooKeeperConfig, tmp_path: Path, verb: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"the {verb} started on an unauthenticated tree")

    # Fail fast instead of running until a signal if the refusal is ever lost.
    monkeypatch.setattr("stream_ops.nimbus.leader.run_nimbus", started)
    monkeypatch.setattr("stream_ops.runtime.supervisor.Supervisor.run", started)
    result = _invoke(zk_config, tmp_path, verb)
    assert result.exit_code == 1  # type: ignore[attr-defined]
    assert f"refusing to start the {verb} without ZooKeeper credentials" in result.output  # type: ignore[attr-defined]
    assert f"stream-ops {verb} --insecure" in result.output  # type: ignore[attr-defined]


def test_insecure_together_with_credentials_is_a_usage_error(zk_config: ZooKeeperConfig, tmp_path: Path, auth_file: Path) -> None:
    result = _invoke(zk_config, tmp_path, "--zk-auth-file", str(auth_file), "worker", "--insecure")
    assert result.exit_code == 2  # type: ignore[attr-defined]
    assert "only allows running without auth_digest" in result.output  # type: ignore[attr-defined]
    assert PASSWORD not in result.output  # type: ignore[attr-defined]


def test_credentials_come_from_a_file_given_once(zk_config: ZooKeeperConfig, tmp_path: Path, auth_file: Path) -> None:
    listed = _invoke(zk_config, tmp_path, "--zk-auth-file", str(auth_file), "list", "--json")
    assert listed.exit_code == 0, listed.output  # type: ignore[attr-defined]
    with ZkStore.connect(zk_config.model_copy(update={"auth_digest": CLUSTER_AUTH})) as store:
        assert audit_acls(store) == []  # the chroot it created is the file's identity's
        assert store.get_acl("/")[0].id.scheme == "digest"
        store.delete_recursive("/")
        store.client.delete("/")

    twice = _invoke(zk_config, tmp_path, "--zk-auth", CLUSTER_AUTH, "--zk-auth-file", str(auth_file), "list")
    assert twice.exit_code == 2  # type: ignore[attr-defined]
    assert "give the ZooKeeper credentials once" in twice.output  # type: ignore[attr-defined]
    empty = tmp_path / "empty"
    empty.write_text("\n", encoding="utf-8")
    blank = _invoke(zk_config, tmp_path, "--zk-auth-file", str(empty), "list")
    assert blank.exit_code == 2 and "is empty" in blank.output  # type: ignore[attr-defined]


def test_chroot_root_with_credentials_is_refused_by_the_cli(zk_config: ZooKeeperConfig, tmp_path: Path, auth_file: Path) -> None:
    result = CliRunner().invoke(main, ["--zookeeper", zk_config.hosts, "--chroot", "/", "--zk-auth-file", str(auth_file), "list"])
    assert result.exit_code == 2
    assert "must own its tree" in result.output and PASSWORD not in result.output


def test_secure_tree_adopts_a_tree_created_before_credentials(
    zookeeper: EmbeddedZooKeeper, tmp_path: Path, auth_file: Path
) -> None:
    chroot = f"/test-adopt-{uuid.uuid4().hex}"
    open_config = ZooKeeperConfig(hosts=zookeeper.hosts, chroot=chroot, session_timeout_s=4.0)
    with ZkStore.connect(open_config) as store:
        store.ensure_path(ZkPaths.STORMS)
    secured = ["--zookeeper", zookeeper.hosts, "--chroot", chroot, "--zk-auth-file", str(auth_file)]
    refused = CliRunner().invoke(main, [*secured, "list"])
    assert refused.exit_code == 1 and "secure-tree" in refused.output
    adopted = CliRunner().invoke(main, [*secured, "secure-tree"])
    assert adopted.exit_code == 0, adopted.output
    assert f"{chroot}/storms" not in adopted.output.splitlines()[-1]  # the summary line
    assert CliRunner().invoke(main, [*secured, "list"]).exit_code == 0
    with ZkStore.connect(open_config.model_copy(update={"auth_digest": CLUSTER_AUTH})) as store:
        assert audit_acls(store) == []
        store.delete_recursive("/")
        store.client.delete("/")


def test_default_home_and_data_dir_are_absolute_and_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("STREAM_OPS_HOME", raising=False)
    top = CliRunner().invoke(main, ["--help"], terminal_width=400)
    assert f"[default: {tmp_path / 'var' / 'stream_ops'}]" in top.output
    zk = CliRunner().invoke(main, ["zookeeper", "start", "--help"], terminal_width=400)
    assert f"[default: {tmp_path / 'var' / 'zookeeper'}]" in zk.output


def test_local_stack_runs_insecure_explicitly_and_drops_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_OPS_ZK_AUTH", CLUSTER_AUTH)  # the caller's, not for the local ZooKeeper
    stack = LocalStack(home=tmp_path)
    stack.zookeeper = SimpleNamespace(hosts="127.0.0.1:2181")  # type: ignore[assignment]
    assert stack.zk_config.insecure and stack.zk_config.auth_digest is None
    env = stack.env()
    assert env["STREAM_OPS_ZK_INSECURE"] == "true"
    assert "STREAM_OPS_ZK_AUTH" not in env


def test_squatted_open_tree_is_refused_by_the_cli_before_anything_runs(
    zookeeper: EmbeddedZooKeeper, tmp_path: Path, auth_file: Path
) -> None:
    chroot = f"/test-squat-{uuid.uuid4().hex}"
    anonymous = KazooClient(hosts=zookeeper.hosts, timeout=4.0)
    anonymous.start(timeout=5)
    try:
        anonymous.create(f"{chroot}{ZkPaths.WORKERS}", b"", acl=OPEN_ACL_UNSAFE, makepath=True)
        result = CliRunner().invoke(
            main, ["--zookeeper", zookeeper.hosts, "--chroot", chroot, "--zk-auth-file", str(auth_file), "list"]
        )
        assert result.exit_code == 1
        assert f"{chroot} has world:anyone=cdrwa" in result.output
        assert PASSWORD not in result.output
    finally:
        anonymous.delete(chroot, recursive=True)
        anonymous.stop()
        anonymous.close()
