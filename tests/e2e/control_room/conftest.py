"""One secured cluster shared by the control-room attack scenarios (issue: control room security).

The cluster is set up as the cluster README secures it, on the session's ZooKeeper: digest
credentials (a fresh chroot created with the cluster ACL), the state-query token derived from
them, and a real ``stream-ops worker`` process (its own process group, Spark started inside it)
whose environment also holds the secrets a Dagster host has (``DAGSTER_PG_PASSWORD``), as a
careless deployment would give it. Every scenario module in this folder attacks that one
cluster; each leaves it as it found it (topologies it submits are killed by the scenario).

Fixtures:
    secured_cluster: the package-scoped :class:`SecuredCluster`.
"""

from __future__ import annotations

import os
import secrets
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from stream_ops.config import ClusterConfig, QueryConfig, ZooKeeperConfig, query_token
from stream_ops.coordination.embedded import EmbeddedZooKeeper
from stream_ops.coordination.store import ZkStore
from stream_ops.local_stack import WorkerProcess
from stream_ops.nimbus.assignment import live_workers
from stream_ops.ports import free_port
from stream_ops.runtime.processes import spawn, stop_process, worker_command

# The scenarios share tests/e2e's helpers (e2e_helpers), also when this folder runs alone.
E2E_DIR = str(Path(__file__).resolve().parents[1])
if E2E_DIR not in sys.path:
    sys.path.insert(0, E2E_DIR)

#: Secret-looking variables a worker must never show to topology code (values are unique per run).
PLANTED_SECRETS = ("DAGSTER_PG_PASSWORD", "STREAM_OPS_ZK_AUTH", "STREAM_OPS_QUERY_TOKEN")

WORKER_ARGS = ["--trigger-seconds", "0.2", "--heartbeat-interval", "0.5"]


@dataclass
class SecuredCluster:
    """A ZooKeeper chroot with digest credentials and one CLI worker process.

    Attributes:
        zk_config: The cluster's ZooKeeper settings, credentials included.
        cluster: The shared paths (``home``).
        token: The state-query bearer token the worker requires.
        worker: The worker process (``worker.proc``, ``worker.log``, ``worker.port``).
        planted: The secret values planted in the worker's environment, by variable name.
    """

    zk_config: ZooKeeperConfig
    cluster: ClusterConfig
    token: str
    home: Path
    worker: WorkerProcess
    planted: dict[str, str] = field(default_factory=dict)

    @property
    def query_config(self) -> QueryConfig:
        """What a legitimate query client of this cluster passes (the token)."""
        return QueryConfig(token=self.token)

    @property
    def worker_address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.worker.port)

    def store(self) -> ZkStore:
        """A new authenticated session (close it: use ``with``)."""
        return ZkStore.connect(self.zk_config)

    def worker_log(self) -> str:
        return self.worker.log.read_text(errors="replace")


@pytest.fixture(scope="package")
def secured_cluster(zookeeper: EmbeddedZooKeeper, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredCluster]:
    home = tmp_path_factory.mktemp("control-room")
    zk_config = ZooKeeperConfig(
        hosts=zookeeper.hosts,
        chroot=f"/control-room-{uuid.uuid4().hex}",
        session_timeout_s=4.0,
        connect_timeout_s=5.0,
        auth_digest=f"stream-ops:{secrets.token_urlsafe(24)}",
    )
    token = query_token(QueryConfig(), zk_config)
    assert token is not None
    with ZkStore.connect(zk_config):
        pass  # the first authenticated connect creates the chroot with the cluster ACL
    planted = {
        "DAGSTER_PG_PASSWORD": f"pg-{secrets.token_hex(8)}",
        "STREAM_OPS_ZK_AUTH": zk_config.auth_credentials() or "",
        "STREAM_OPS_QUERY_TOKEN": token,
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_OPS_")}
    env.update(planted, PYTHONUNBUFFERED="1")
    port = free_port()
    log = home / "logs" / f"worker-{port}.log"
    proc = spawn(worker_command(zk_config, home, host="127.0.0.1", port=port, extra_args=WORKER_ARGS), log, env)
    worker = WorkerProcess(port, log, proc)
    try:
        deadline = time.monotonic() + 90
        with ZkStore.connect(zk_config) as store:
            while worker.worker_id not in live_workers(store):
                if proc.poll() is not None:
                    pytest.fail(f"the secured worker exited with {proc.returncode}:\n{log.read_text(errors='replace')[-4000:]}")
                if time.monotonic() > deadline:
                    pytest.fail(f"the secured worker did not register within 90 s:\n{log.read_text(errors='replace')[-4000:]}")
                time.sleep(0.2)
        yield SecuredCluster(zk_config, ClusterConfig(root=home), token, home, worker, planted)
    finally:
        stop_process(proc)
