"""Fixtures for the Dagster layer against the real ZooKeeper of ``tests/conftest.py``.

Workers are not started: tests write the znodes workers would write (owners, heartbeats,
committed txids) through the ``sim_workers`` fixture to make tasks look alive, stale or dead.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from stream_ops.config import ZooKeeperConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import HeartbeatRecord, OwnerRecord, TransactionalRecord, WorkerRecord
from stream_ops.coordination.store import ZkStore
from stream_ops.dsl.streams import Topology
from stream_ops.examples.wordcount import build_wordcount
from stream_ops.orchestration import StreamClusterResource, ZooKeeperResource

WORKERS = ("127.0.0.1:6700", "127.0.0.1:6701")


@pytest.fixture
def input_path(tmp_path: Path) -> Path:
    return tmp_path / "input" / "sentences"


@pytest.fixture
def wordcount(input_path: Path) -> Topology:
    """The 2-queue word count: stages ``sentences`` (source) and ``count`` (keyed), 4 tasks."""
    return build_wordcount(input_path)


@pytest.fixture
def make_wordcount(input_path: Path) -> Any:
    """Build word counts with other names or queue counts on the same input."""

    def make(name: str = "wordcount", queues: int = 2) -> Topology:
        return build_wordcount(input_path, name=name, queues=queues)

    return make


@pytest.fixture
def zookeeper_resource(zk_config: ZooKeeperConfig) -> ZooKeeperResource:
    return ZooKeeperResource(
        hosts=zk_config.hosts,
        chroot=zk_config.chroot,
        session_timeout_s=zk_config.session_timeout_s,
        connect_timeout_s=zk_config.connect_timeout_s,
        insecure=True,  # the test ZooKeeper has no credentials; worker runs refuse that unless told
    )


@pytest.fixture
def cluster_resource(tmp_path: Path) -> StreamClusterResource:
    return StreamClusterResource(root=str(tmp_path / "cluster"))


@pytest.fixture
def resources(zookeeper_resource: ZooKeeperResource, cluster_resource: StreamClusterResource) -> dict[str, Any]:
    """The resources the orchestration assets and sensors require."""
    return {"zookeeper": zookeeper_resource, "stream_cluster": cluster_resource}


class SimulatedWorkers:
    """Writes the znodes live workers would write, so tests control what the sensor sees."""

    def __init__(self, store: ZkStore) -> None:
        self.store = store

    def register(self, worker_ids: tuple[str, ...] = WORKERS) -> None:
        """Register worker slots the way a worker does (ephemeral ``/workers/{host:port}``)."""
        for worker_id in worker_ids:
            host, _, port = worker_id.rpartition(":")
            record = WorkerRecord(
                worker_id=worker_id, host=host, port=int(port), pid=1, capacity=4, started_at=time.time(), tls=False
            )
            self.store.create_json(ZkPaths.worker(worker_id), record.to_json_obj(), ephemeral=True)

    def beat(
        self,
        topology_id: str,
        task_id: int,
        *,
        worker_id: str = WORKERS[0],
        age_s: float = 0.0,
        committed_txid: int = 0,
        rows_per_s: float = 0.0,
        rows_out_per_s: float = 0.0,
        lag_files: int = 0,
        state_keys: int = 0,
        dead_letters: int = 0,
    ) -> None:
        """Write owner, a heartbeat ``age_s`` old and the committed txid of a running task."""
        now = time.time()
        owner = OwnerRecord(worker_id=worker_id, epoch=1, since=now)
        heartbeat = HeartbeatRecord(
            worker_id=worker_id,
            time=now - age_s,
            epoch=1,
            txid_in_flight=committed_txid + 1,
            committed_txid=committed_txid,
            rows_per_s=rows_per_s,
            rows_out_per_s=rows_out_per_s,
            lag_files=lag_files,
            state_keys=state_keys,
            dead_letters=dead_letters,
        )
        tx = TransactionalRecord(committed_txid=committed_txid, committed_epoch=1, epoch=1)
        for path, record in (
            (ZkPaths.owner(topology_id, task_id), owner),
            (ZkPaths.heartbeat(topology_id, task_id), heartbeat),
            (ZkPaths.transactional_task(topology_id, task_id), tx),
        ):
            if self.store.exists(path):
                self.store.set_json(path, record.to_json_obj())
            else:
                self.store.create_json(path, record.to_json_obj())

    def kill_task(self, topology_id: str, task_id: int) -> None:
        """What a worker's death leaves behind: the task's owner and heartbeat nodes vanish."""
        self.store.delete_recursive(ZkPaths.heartbeat(topology_id, task_id))
        self.store.delete_recursive(ZkPaths.owner(topology_id, task_id))


@pytest.fixture
def sim_workers(zk_store: ZkStore) -> SimulatedWorkers:
    """Simulated workers writing through this test's store."""
    return SimulatedWorkers(zk_store)
