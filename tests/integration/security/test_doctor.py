"""``stream-ops doctor`` reports each protection as the live cluster has it.

The secured cluster runs a word count first: the checkpoints its tasks' Spark queries wrote
(file source, queue source, callback sink) must have the cluster's modes with no chmod.
"""

from __future__ import annotations

import json
import stat
import threading
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from stream_ops.cli import main
from stream_ops.config import ClusterConfig, ZooKeeperConfig
from stream_ops.coordination.store import ZkStore
from stream_ops.doctor import security_report
from stream_ops.examples.wordcount import SAMPLE_SENTENCES, build_wordcount
from stream_ops.local_stack import expected_word_counts, wait_for_counts
from stream_ops.nimbus import submit
from stream_ops.nimbus.assignment import live_workers
from stream_ops.ports import free_port
from stream_ops.runtime.worker import Worker, WorkerSettings
from stream_ops.topics.producer import produce

FILES = ["home root", "dist root", "topics root", "checkpoints root", "local state root", "data files 0640 / directories 0750"]


def _by_check(findings: list[Any]) -> dict[str, str]:
    return {f.check if "worker" not in f.check else "worker refuses": f.status for f in findings}


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
            "digest credentials": "fail",
            "the cluster owns its tree": "fail",
            "bearer token": "fail",
            "TLS": "warn",
            "worker refuses": "fail",
            **dict.fromkeys(FILES, "ok"),
            "data files 0640 / directories 0750": "fail",
        }
        result = CliRunner().invoke(
            main, ["--zookeeper", zk_config.hosts, "--chroot", zk_config.chroot, "--home", str(root), "doctor"]
        )
        assert result.exit_code == 1 and "FAIL  query port  worker" in result.output, result.output
        assert "WARN  query port  TLS: off" in result.output and "f.jsonl (-rw-rw-rw-)" in result.output
    finally:
        stop.set()
        thread.join(60)


def test_a_secured_cluster_passes_with_its_spark_checkpoints(
    zk_config: ZooKeeperConfig, tmp_path: Path, spark: Any, wait_until: Any
) -> None:
    zk = zk_config.model_copy(update={"auth_digest": "stream-ops:doctor-test-password", "insecure": False})
    root = tmp_path / "cluster"
    stop, thread, settings = _start_worker(zk, root, spark)
    try:
        with ZkStore.connect(zk) as store:
            wait_until(lambda: settings.worker_id in live_workers(store), 60, "the worker to register")
            topology = build_wordcount(root / "input", queues=1)
            submit(store, ClusterConfig(root=root), topology, workers=1)
            produce(topology.chains[0].source.topic, ({"sentence": s} for s in SAMPLE_SENTENCES))
            wait_for_counts(store, topology.name, "words", expected_word_counts(list(SAMPLE_SENTENCES)), timeout_s=60)

        # Spark's own files of both tasks' queries, written through Hadoop, with no chmod.
        checkpoints = root / "checkpoints"
        modes = {p.relative_to(checkpoints).as_posix(): stat.S_IMODE(p.lstat().st_mode) for p in checkpoints.rglob("*")}
        names = {Path(p).name for p in modes}
        assert {"metadata", "offsets", "commits", "sources", "0"} <= names, sorted(modes)
        assert {p: m for p, m in modes.items() if m != (0o750 if (checkpoints / p).is_dir() else 0o640)} == {}
        assert stat.S_IMODE(checkpoints.stat().st_mode) == 0o750

        findings = _by_check(security_report(zk, ClusterConfig(root=root)))
        assert findings == {
            "digest credentials": "ok",
            "the cluster owns its tree": "ok",
            "bearer token": "ok",
            "TLS": "warn",  # optional, and off here
            "worker refuses": "ok",
            **dict.fromkeys(FILES, "ok"),
        }
        # Only a warning: the CLI passes (exit 0) and says what TLS off exposes.
        args = ["--zookeeper", zk.hosts, "--chroot", zk.chroot, "--zk-auth", "stream-ops:doctor-test-password"]
        result = CliRunner().invoke(main, [*args, "--home", str(root), "doctor", "--json"])
        assert result.exit_code == 0, result.output
        reported = {f["check"]: f for f in json.loads(result.output)}
        assert reported["TLS"]["status"] == "warn" and reported["TLS"]["ok"] is False
        assert "clear text" in reported["TLS"]["detail"]
        assert all(f["status"] == "ok" and f["ok"] for c, f in reported.items() if c != "TLS")
    finally:
        stop.set()
        thread.join(60)
