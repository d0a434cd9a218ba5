"""The code archive's sha256, recorded at submission, is checked before a worker loads it.

A ``code.zip`` changed in the shared dist store after submission (an attacker with write access
to the shared path, or a corrupted copy) is refused with an error that names the archive, both
hashes and the fix, nothing of it is extracted or imported, and the worker runs none of the
topology's tasks until the archive is the submitted one again.
"""

from __future__ import annotations

import io
import logging
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from stream_ops.config import ClusterConfig, ZooKeeperConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import WorkerError
from stream_ops.examples.wordcount import build_wordcount
from stream_ops.local_stack import free_port
from stream_ops.nimbus import live_workers, reassign, submit
from stream_ops.nimbus.dist_store import CODE_FILE, install_code, sha256_hex, write_submission
from stream_ops.nimbus.submission import read_storm
from stream_ops.runtime.worker import Worker, WorkerSettings
from stream_ops.topology.plan import build_plan


def _zip(files: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return buffer.getvalue()


GOOD = {"userpkg/__init__.py": "", "userpkg/ops.py": "def split(s):\n    return s.split()\n"}
EVIL = {"userpkg/__init__.py": "import os; os.environ['PWNED'] = '1'\n", "userpkg/ops.py": "def split(s):\n    return []\n"}


def test_install_code_refuses_a_tampered_archive(tmp_path: Path) -> None:
    dist = tmp_path / "dist" / "wc-1-1700000000"
    sha = write_submission(dist, build_plan(build_wordcount(tmp_path / "in")), {}, _zip(GOOD))
    (dist / CODE_FILE).write_bytes(_zip(EVIL))
    dest = tmp_path / "code"
    path_before = list(sys.path)

    with pytest.raises(WorkerError) as refused:
        install_code(dist, dest, sha)

    message = str(refused.value)
    assert str(dist / CODE_FILE) in message
    assert sha in message and sha256_hex(_zip(EVIL)) in message
    assert "modified after submission" in message and "resubmit" in message
    assert not dest.exists(), "nothing of a refused archive may be extracted"
    assert sys.path == path_before


def test_install_code_loads_the_submitted_archive(tmp_path: Path) -> None:
    dist = tmp_path / "dist" / "wc-1-1700000000"
    sha = write_submission(dist, build_plan(build_wordcount(tmp_path / "in")), {}, _zip(GOOD))
    dest = tmp_path / "code"
    try:
        install_code(dist, dest, sha)
        assert (dest / "userpkg" / "ops.py").read_text().startswith("def split")
    finally:
        if str(dest) in sys.path:
            sys.path.remove(str(dest))


def test_worker_refuses_a_tampered_archive_and_runs_nothing(
    zk_config: ZooKeeperConfig, tmp_path: Path, spark, wait_until, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = ClusterConfig(root=tmp_path / "cluster")
    caplog.set_level(logging.ERROR, logger="stream_ops.runtime.worker")
    with ZkStore.connect(zk_config) as store:
        # Submitted while no worker runs: nothing can load the archive before it is tampered with.
        topology_id = submit(store, cluster, build_wordcount(tmp_path / "in", name="wc-tampered"), workers=1)
        storm = read_storm(store, topology_id)
        archive = Path(storm.dist_dir) / CODE_FILE
        submitted = archive.read_bytes()
        assert storm.code_sha256 == sha256_hex(submitted)
        archive.write_bytes(_zip(EVIL))

        settings = WorkerSettings(host="127.0.0.1", port=free_port(), trigger_seconds=0.2, heartbeat_interval_s=0.5)
        worker = Worker(zk_config, cluster, settings, spark_factory=lambda: spark)
        stop = threading.Event()
        thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
        thread.start()
        try:
            wait_until(lambda: settings.worker_id in live_workers(store), 60, "the worker to register")
            reassign(store, topology_id)

            def refused() -> bool:
                return any(
                    "could not start" in r.getMessage() and "modified after submission" in r.getMessage()
                    for r in caplog.records
                )

            wait_until(refused, 30, "the worker to refuse the tampered archive")
            assert worker.running_tasks == []
            assert store.children(ZkPaths.owners(topology_id)) == []
            code_dir = cluster.resolved_local_state_dir() / "code" / topology_id
            assert not (code_dir / "userpkg").exists(), "the tampered archive was extracted"
            assert "PWNED" not in __import__("os").environ

            # Put the submitted archive back: the same worker now installs it and runs the tasks.
            archive.write_bytes(submitted)
            wait_until(lambda: len(worker.running_tasks) == 4, 90, "the tasks to start from the genuine archive")
        finally:
            stop.set()
            thread.join(60)
        assert not thread.is_alive()
