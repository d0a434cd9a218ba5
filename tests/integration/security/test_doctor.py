"""``stream-ops doctor`` reports each protection as the live cluster has it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from stream_ops.cli import main
from stream_ops.config import ClusterConfig, ZooKeeperConfig
from stream_ops.coordination.store import ZkStore
from stream_ops.doctor import security_report
from stream_ops.nimbus.assignment import live_workers
from stream_ops.ports import free_port
from stream_ops.runtime.worker import Worker, WorkerSettings


def _by_check(findings: list[Any]) -> dict[str, bool]:
    return {f.check if "worker" not in f.check else "worker refuses": f.ok for f in findings}


def _start_worker(zk: ZooKeeperConfig, root: Path, spark: Any) -> tuple[threading.Event, threading.Thread, WorkerSettings]:
    settings = WorkerSettings(host="127.0.0.1", port=free_port(), trigger_seconds=0.2, heartbeat_interval_s=0.5)
    worker = Worker(zk, ClusterConfig(root=root), settings, spark_factory=lambda: spark)
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    thread.start()
    return stop, thread, settings


def test_an_open_cluster_fails_every_protection(zk_config: ZooKeeperConfig, tmp_path: Path, spark: Any, wait_until: Any) -> None:
    root = tmp_path / "cluster"
    stop, thread, settings = _start_worker(zk_config, root, spark)
    try:
        with ZkStore.connect(zk_config) as store:
            wait_until(lambda: settings.worker_id in live_workers(store), 60, "the worker to register")
        loose = root / "topics" / "t" / "queue-00000" / "f.jsonl"
        loose.parent.mkdir(parents=True)
        loose.write_text("{}\n")
        loose.chmod(0o666)
        findings = _by_check(security_report(zk_config, ClusterConfig(root=root)))
        assert findings == {
            "digest credentials": False,
            "the cluster owns its tree": False,
            "bearer token": False,
            "TLS": False,
            "worker refuses": False,
            "data files 0640 / directories 0750": False,
        }
        result = CliRunner().invoke(
            main, ["--zookeeper", zk_config.hosts, "--chroot", zk_config.chroot, "--home", str(root), "doctor"]
        )
        assert result.exit_code == 1 and "FAIL  query port  worker" in result.output, result.output
    finally:
        stop.set()
        thread.join(60)


def test_a_secured_cluster_passes_what_it_has(zk_config: ZooKeeperConfig, tmp_path: Path, spark: Any, wait_until: Any) -> None:
    zk = zk_config.model_copy(update={"auth_digest": "stream-ops:doctor-test-password", "insecure": False})
    root = tmp_path / "cluster"
    stop, thread, settings = _start_worker(zk, root, spark)
    try:
        with ZkStore.connect(zk) as store:
            wait_until(lambda: settings.worker_id in live_workers(store), 60, "the worker to register")
        findings = _by_check(security_report(zk, ClusterConfig(root=root)))
        assert findings == {
            "digest credentials": True,
            "the cluster owns its tree": True,
            "bearer token": True,
            "TLS": False,  # optional, and off here
            "worker refuses": True,
            "data files 0640 / directories 0750": True,
        }
    finally:
        stop.set()
        thread.join(60)
