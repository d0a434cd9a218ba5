"""The attacks of issue 17 on what a worker runs, against a real ZooKeeper and real workers.

* plan.json edited in the shared dist store so a persist factory is ``subprocess:Popen``;
* ``/storms/{id}`` rewritten to point at another dist directory with its own hash;
* a bytecode file and a symlink planted where workers used to extract and copy code;
* a symlink leaving the package, at submit.

Each test checks the effect an attack would have (a marker file a payload would create, a
victim file it would overwrite), so it fails on a worker that runs the payload.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import py_compile
import stat
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from user_packages import forget, import_ops, tagging_topology, write_package

from stream_ops.coordination.paths import ZkPaths
from stream_ops.errors import SubmissionError, TopologyLoadError
from stream_ops.examples.wordcount_db import build_wordcount_db
from stream_ops.local_stack import wait_for_counts
from stream_ops.nimbus import list_topologies, live_workers, reassign, submit
from stream_ops.nimbus.dist_store import MANIFEST_FILE, PLAN_FILE, load_submission, write_submission
from stream_ops.nimbus.submission import read_storm
from stream_ops.topics.producer import produce
from stream_ops.topology.plan import Plan

FACTORY = "stream_ops.examples.wordcount_db:WordCountDB"


def _refused(caplog: pytest.LogCaptureFixture, *needles: str) -> bool:
    return any(all(n in r.getMessage() for n in needles) for r in caplog.records if r.levelno >= logging.WARNING)


def _start_worker(worker_pool: Any, store: Any, topology_id: str, wait_until: Any) -> Any:
    worker = worker_pool.start()
    wait_until(lambda: worker.worker_id in live_workers(store), 60, "the worker to register")
    reassign(store, topology_id)
    return worker


def test_a_plan_json_edited_to_run_a_command_is_refused_before_it_is_parsed(
    worker_pool, zk_store, tmp_path: Path, wait_until, caplog, monkeypatch
) -> None:
    caplog.set_level(logging.WARNING)
    marker = tmp_path / "pwned"
    topology_id = submit(zk_store, worker_pool.cluster, build_wordcount_db(tmp_path / "in", name="db-tampered"), workers=1)
    plan_file = worker_pool.cluster.resolved_dist_dir() / topology_id / PLAN_FILE
    popen = {"class": "subprocess:Popen", "args": {"args": ["/bin/sh", "-c", f"touch {marker}"]}}
    plan_json = json.loads(plan_file.read_text())
    for stage in plan_json["stages"]:
        if stage.get("persist"):
            stage["persist"]["factory"] = popen
    plan_file.write_text(json.dumps(plan_json))
    parsed: list[str] = []
    original = Plan.from_json.__func__  # type: ignore[attr-defined]

    def spy(cls: type[Plan], text: str | bytes) -> Plan:
        parsed.append(text.decode() if isinstance(text, bytes) else text)
        return original(cls, text)

    monkeypatch.setattr(Plan, "from_json", classmethod(spy))

    worker = _start_worker(worker_pool, zk_store, topology_id, wait_until)
    wait_until(
        lambda: _refused(caplog, str(plan_file), "modified after submission") or marker.exists(),
        60,
        "the worker to refuse the edited plan",
    )
    assert not marker.exists(), "the command in the edited plan ran"
    assert not any("subprocess:Popen" in text for text in parsed), "the edited plan was parsed"
    assert worker.running_tasks == [] and zk_store.children(ZkPaths.owners(topology_id)) == []


def test_an_edited_plan_with_a_matching_root_still_resolves_nothing_outside_its_archive(worker_pool, zk_store, tmp_path) -> None:
    """Defense in depth: whoever rewrites the files *and* the root cannot name subprocess:Popen."""
    topology_id = submit(zk_store, worker_pool.cluster, build_wordcount_db(tmp_path / "in", name="db-rerooted"), workers=1)
    dist = worker_pool.cluster.resolved_dist_dir() / topology_id
    text = (dist / PLAN_FILE).read_text().replace(FACTORY, "subprocess:Popen")
    manifest = json.loads((dist / MANIFEST_FILE).read_text())
    manifest["files"][PLAN_FILE] = hashlib.sha256(text.encode()).hexdigest()
    manifest_bytes = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    (dist / PLAN_FILE).write_text(text)
    (dist / MANIFEST_FILE).write_bytes(manifest_bytes)
    zk_store.update_json(
        ZkPaths.storm(topology_id), lambda d: {**d, "submission_sha256": hashlib.sha256(manifest_bytes).hexdigest()}
    )
    with pytest.raises(TopologyLoadError, match="'subprocess:Popen'.*neither in the submitted code archive"):
        load_submission(worker_pool.cluster.resolved_dist_dir(), read_storm(zk_store, topology_id))


def _evil_package(name: str, marker: Path) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(f"{name}/__init__.py", f"open({str(marker)!r}, 'w').write('pwned')\n\nclass Factory:\n    pass\n")
    return buffer.getvalue()


def test_a_storm_record_pointed_at_another_dist_dir_is_refused(worker_pool, zk_store, tmp_path: Path, wait_until, caplog) -> None:
    caplog.set_level(logging.WARNING)
    marker = tmp_path / "pwned"
    topology_id = submit(zk_store, worker_pool.cluster, build_wordcount_db(tmp_path / "in", name="db-redirected"), workers=1)
    legit = worker_pool.cluster.resolved_dist_dir() / topology_id
    # The attacker cannot write the cluster's dist store, only ZooKeeper and a directory of its own:
    # a complete submission of its own there, and a record naming it with its hashes.
    evil_pkg = "evilpkg_redirect"
    evil_dir = tmp_path / "attacker" / topology_id
    evil_code = _evil_package(evil_pkg, marker)
    evil_plan = Plan.from_json((legit / PLAN_FILE).read_text().replace(FACTORY, f"{evil_pkg}:Factory"))
    written = write_submission(evil_dir, evil_plan, {}, evil_code)
    hashes = {
        "dist_dir": str(evil_dir),
        "code_sha256": hashlib.sha256(evil_code).hexdigest(),
        "submission_sha256": written.submission_sha256,
    }
    zk_store.update_json(ZkPaths.storm(topology_id), lambda d: {**d, **hashes})

    worker = _start_worker(worker_pool, zk_store, topology_id, wait_until)
    wait_until(
        lambda: _refused(caplog, str(evil_dir), str(legit)) or marker.exists(), 60, "the worker to refuse the redirected record"
    )
    assert not marker.exists(), "the worker ran the code the rewritten record pointed at"
    assert evil_pkg not in sys.modules
    assert worker.running_tasks == []


def test_a_planted_bytecode_file_and_symlink_where_code_used_to_go_are_never_used(
    worker_pool, zk_store, tmp_path: Path, wait_until
) -> None:
    name = "plantpkg"
    marker, victim = tmp_path / "pwned", tmp_path / "victim.txt"
    victim.write_text("precious")
    src = tmp_path / "src"
    write_package(src, name, "v1")
    topology = tagging_topology("planted", import_ops(src, name), tmp_path / "in")
    try:
        topology_id = submit(zk_store, worker_pool.cluster, topology, workers=1)
    finally:
        forget(name)
    # Planted before any worker runs, where workers used to extract code and copy the zip.
    shared_code = worker_pool.cluster.resolved_local_state_dir() / "code"
    evil_source = tmp_path / "evil_ops.py"
    evil_source.write_text(
        f"open({str(marker)!r}, 'w').write('pwned')\n"
        + (src / name / "ops.py").read_text().replace("VERSION = 'v1'", "VERSION = 'evil'")
    )
    pycache = shared_code / topology_id / name / "__pycache__"
    pycache.mkdir(parents=True)
    tag = sys.implementation.cache_tag
    py_compile.compile(
        str(evil_source), cfile=str(pycache / f"ops.{tag}.pyc"), invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH
    )
    (shared_code / f"{topology_id}.zip").symlink_to(victim)

    worker = _start_worker(worker_pool, zk_store, topology_id, wait_until)
    try:
        produce(topology.chains[0].source.topic, [{"sentence": "hello"}])
        wait_for_counts(zk_store, "planted", "words", {"hello-v1-v1": 1}, timeout_s=90)
    finally:
        assert victim.read_bytes() == b"precious", "the verified zip was written through the planted symlink"
        assert not marker.exists(), "the planted bytecode ran"
    scope = worker._plans[topology_id].code
    private = Path(scope.archive).parent
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    assert not private.is_relative_to(worker_pool.cluster.root.resolve()), "the private copy is not on the shared path"
    try:
        assert sys.modules[f"{name}.ops"].__spec__.origin.startswith(scope.archive + "/"), "imported from the verified zip"
    finally:
        forget(name)
    assert sorted(p.name for p in shared_code.iterdir()) == [topology_id, f"{topology_id}.zip"], "nothing written there"


def test_submit_refuses_a_symlink_leaving_the_package(zk_store, tmp_path: Path) -> None:
    name = "linkpkg"
    outside = tmp_path / "home" / ".secrets.py"
    outside.parent.mkdir()
    outside.write_text("PASSWORD = 'not for the cluster'\n")
    src = tmp_path / "src"
    write_package(src, name, "v1")
    link = src / name / "settings.py"
    link.symlink_to(outside)
    from stream_ops.config import ClusterConfig

    cluster = ClusterConfig(root=tmp_path / "cluster")
    try:
        topology = tagging_topology("linked", import_ops(src, name), tmp_path / "in")
        with pytest.raises(SubmissionError) as refused:
            submit(zk_store, cluster, topology, workers=1)
    finally:
        forget(name)
    assert str(link) in str(refused.value) and "outside the package" in str(refused.value)
    assert list_topologies(zk_store) == []
    assert not cluster.resolved_dist_dir().exists() or not any(cluster.resolved_dist_dir().iterdir())
