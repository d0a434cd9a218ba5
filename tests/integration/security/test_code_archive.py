"""A submission is checked against the integrity root recorded at submission before a worker
loads any of it, and the verified archive is imported from a fresh private copy.

A ``code.zip`` changed in the shared dist store after submission (an attacker with write access
to the shared path, or a corrupted copy) is refused with an error that names the file, both
hashes and the fix; nothing of it is parsed, written or imported, and the worker runs none of
the topology's tasks until the entry is the submitted one again.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import stat
import sys
import tempfile
import threading
import zipfile
from pathlib import Path

import pytest
from pydantic import ValidationError

from stream_ops.config import ClusterConfig, ZooKeeperConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import StormRecord
from stream_ops.coordination.store import ZkStore
from stream_ops.dsl.build_plan import build_plan
from stream_ops.errors import SubmissionIntegrityError, WorkerError
from stream_ops.examples.wordcount import build_wordcount
from stream_ops.nimbus import live_workers, reassign, submit
from stream_ops.nimbus.dist_store import CODE_FILE, MANIFEST_FILE, PLAN_FILE, load_submission, sha256_hex, write_submission
from stream_ops.nimbus.submission import read_storm
from stream_ops.ports import free_port
from stream_ops.runtime.user_code import PrivateArchives
from stream_ops.runtime.worker import Worker, WorkerSettings
from stream_ops.topology.functions import resolve_function


def _zip(files: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return buffer.getvalue()


GOOD = {"userpkg/__init__.py": "", "userpkg/ops.py": "def split(s):\n    return s.split()\n"}
EVIL = {"userpkg/__init__.py": "import os; os.environ['PWNED'] = '1'\n", "userpkg/ops.py": "def split(s):\n    return []\n"}


def _submitted(tmp_path: Path, code: bytes) -> tuple[Path, StormRecord]:
    """A submission written to ``<tmp>/dist/wc-1-1700000000`` and the record a submit would create."""
    dist_root = tmp_path / "dist"
    dist = dist_root / "wc-1-1700000000"
    written = write_submission(dist, build_plan(build_wordcount(tmp_path / "in")), {}, code)
    record = StormRecord(
        topology_id=dist.name,
        name="wc",
        status="ACTIVE",
        workers=1,
        dist_dir=str(dist.resolve()),
        submitted_at=0.0,
        num_tasks=4,
        code_sha256=written.code_sha256,
        submission_sha256=written.submission_sha256,
    )
    return dist_root, record


def test_load_submission_refuses_a_tampered_archive(tmp_path: Path) -> None:
    dist_root, record = _submitted(tmp_path, _zip(GOOD))
    dist = dist_root / record.topology_id
    (dist / CODE_FILE).write_bytes(_zip(EVIL))
    path_before, modules_before = list(sys.path), set(sys.modules)

    with pytest.raises(SubmissionIntegrityError) as refused:
        load_submission(dist_root, record)

    message = str(refused.value)
    assert str(dist / CODE_FILE) in message
    assert sha256_hex(_zip(GOOD)) in message and sha256_hex(_zip(EVIL)) in message
    assert "modified after submission" in message and "resubmit" in message
    assert sys.path == path_before and "userpkg" not in set(sys.modules) - modules_before


def test_load_submission_refuses_a_record_with_another_root_or_place(tmp_path: Path) -> None:
    dist_root, record = _submitted(tmp_path, _zip(GOOD))
    assert load_submission(dist_root, record).modules == ("userpkg",)

    other_root = record.model_copy(update={"submission_sha256": sha256_hex(b"another manifest")})
    with pytest.raises(SubmissionIntegrityError, match=f"{MANIFEST_FILE} has sha256 .* was recorded in /storms/"):
        load_submission(dist_root, other_root)

    elsewhere = tmp_path / "elsewhere" / record.topology_id
    elsewhere.parent.mkdir()
    (dist_root / record.topology_id).rename(elsewhere)
    moved = record.model_copy(update={"dist_dir": str(elsewhere)})
    with pytest.raises(SubmissionIntegrityError) as refused:
        load_submission(dist_root, moved)
    assert str(elsewhere) in str(refused.value) and str(dist_root / record.topology_id) in str(refused.value)

    unrooted = {k: v for k, v in record.to_json_obj().items() if k != "submission_sha256"}
    with pytest.raises(ValidationError, match="has no submission_sha256.*kill and resubmit the topology"):
        StormRecord.model_validate(unrooted)


def test_the_verified_archive_is_imported_from_a_fresh_private_copy(tmp_path: Path) -> None:
    dist_root, record = _submitted(tmp_path, _zip(GOOD))
    submission = load_submission(dist_root, record)
    archives = PrivateArchives()
    parent = tmp_path / "local"
    try:
        scope = archives.install(submission, parent)
        copy = Path(scope.archive)
        assert copy.read_bytes() == _zip(GOOD) and scope.code_sha256 == sha256_hex(_zip(GOOD))
        assert stat.S_IMODE(copy.parent.stat().st_mode) == 0o700 and copy.parent.parent == parent
        assert record.submission_sha256[:16] in copy.name
        assert archives.install(submission, parent) == scope, "one copy per submission and process"
        assert resolve_function("userpkg.ops:split", scope=scope)("a b") == ["a", "b"]
        assert sorted(os.listdir(copy.parent)) == [copy.name], "nothing extracted or compiled next to it"
    finally:
        for name in [m for m in sys.modules if m == "userpkg" or m.startswith("userpkg.")]:
            del sys.modules[name]
        archives.remove_all()
    assert not copy.parent.exists()


def test_worker_refuses_a_tampered_archive_and_runs_nothing(
    zk_config: ZooKeeperConfig, tmp_path: Path, spark, wait_until, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = ClusterConfig(root=tmp_path / "cluster")
    caplog.set_level(logging.ERROR)
    with ZkStore.connect(zk_config) as store:
        # Submitted while no worker runs: nothing can load the archive before it is tampered with.
        topology_id = submit(store, cluster, build_wordcount(tmp_path / "in", name="wc-tampered"), workers=1)
        storm = read_storm(store, topology_id)
        archive = cluster.resolved_dist_dir() / topology_id / CODE_FILE
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
                return any("modified after submission" in r.getMessage() for r in caplog.records)

            wait_until(refused, 30, "the worker to refuse the tampered archive")
            assert worker.running_tasks == []
            assert store.children(ZkPaths.owners(topology_id)) == []
            assert "PWNED" not in os.environ
            digest = storm.submission_sha256
            assert not any(digest[:16] in p.name for p in Path(tempfile.gettempdir()).glob("stream-ops-code-*"))

            # Put the submitted archive back: the same worker now verifies it and runs the tasks.
            archive.write_bytes(submitted)
            wait_until(lambda: len(worker.running_tasks) == 4, 90, "the tasks to start from the genuine archive")
        finally:
            stop.set()
            thread.join(60)
        assert not thread.is_alive()


def test_plan_json_of_a_verified_submission_is_the_parsed_one(tmp_path: Path) -> None:
    dist_root, record = _submitted(tmp_path, _zip(GOOD))
    plan_bytes = (dist_root / record.topology_id / PLAN_FILE).read_bytes()
    assert load_submission(dist_root, record).plan.to_json().encode() == plan_bytes
    assert hashlib.sha256(plan_bytes).hexdigest() in (dist_root / record.topology_id / MANIFEST_FILE).read_text()


def test_a_private_copy_is_never_made_where_others_could_swap_it(tmp_path: Path) -> None:
    dist_root, record = _submitted(tmp_path, _zip(GOOD))
    submission = load_submission(dist_root, record)
    elsewhere = tmp_path / "attacker"
    elsewhere.mkdir()
    planted = tmp_path / "local" / "code"
    planted.parent.mkdir()
    planted.symlink_to(elsewhere)  # a pre-planted link where the worker's local code directory goes
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    archives = PrivateArchives()
    for parent in (planted, shared):
        with pytest.raises(WorkerError, match="others could replace the code"):
            archives.install(submission, parent)
    assert list(elsewhere.iterdir()) == [] and list(shared.iterdir()) == []
