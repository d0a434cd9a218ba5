"""``stream-ops doctor``'s file checks on real directories: the roots themselves (modes,
owners, symbolic links and every directory above them) and a capped walk that reaches every
root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stream_ops.config import ClusterConfig
from stream_ops.doctor import Finding, file_findings
from stream_ops.durable_files import make_dirs

ROOTS = {"home": "", "dist": "dist", "topics": "topics", "checkpoints": "checkpoints", "local state": "local"}
PATHS_CHECK = "data files 0640 / directories 0750"


def _cluster(tmp_path: Path) -> ClusterConfig:
    """A home whose roots are all there, 0750, as the cluster's processes create them."""
    home = tmp_path / "home"
    for sub in ROOTS.values():
        (home / sub).mkdir(mode=0o750, exist_ok=True)
        (home / sub).chmod(0o750)
    return ClusterConfig(root=home)


def _by_check(findings: list[Finding]) -> dict[str, Finding]:
    return {f.check: f for f in findings}


def _write_files(directory: Path, count: int, mode: int = 0o640) -> None:
    make_dirs(directory)
    for i in range(count):
        fd = os.open(directory / f"f{i:05d}.jsonl", os.O_WRONLY | os.O_CREAT, mode)
        os.fchmod(fd, mode)  # whatever the process umask is (a worker of another test sets 027)
        os.close(fd)


def test_well_moded_roots_pass(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    _write_files(cluster.resolved_topics_root() / "t" / "queue-00000", 3)
    findings = _by_check(file_findings(cluster))
    assert {check: f.status for check, f in findings.items()} == {
        "home root": "ok",
        "dist root": "ok",
        "topics root": "ok",
        "checkpoints root": "ok",
        "local state root": "ok",
        PATHS_CHECK: "ok",
    }, findings
    assert "drwxr-x---" in findings["topics root"].detail
    assert findings[PATHS_CHECK].detail.startswith("5 paths checked (dist 0, topics 5,"), findings[PATHS_CHECK].detail


@pytest.mark.parametrize("kind", list(ROOTS))
def test_a_world_writable_root_fails_naming_it(tmp_path: Path, kind: str) -> None:
    cluster = _cluster(tmp_path)
    root = cluster.root / ROOTS[kind]
    root.chmod(0o777)
    findings = _by_check(file_findings(cluster))
    failing = findings.pop(f"{kind} root")
    assert failing.status == "fail" and f"{root.resolve()} is drwxrwxrwx" in failing.detail, failing
    assert "chmod g-w,o-rwx" in failing.detail
    if kind == "home":
        # Whoever can write the home can replace every root in it.
        assert all(f.status == "fail" and "(above it)" in f.detail for c, f in findings.items() if c != PATHS_CHECK)
    else:
        assert all(f.status == "ok" for f in findings.values()), findings


def test_a_root_readable_by_others_fails_where_the_umask_keeps_them_out(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    cluster.resolved_checkpoints_root().chmod(0o755)
    assert _by_check(file_findings(cluster))["checkpoints root"].status == "fail"
    relaxed = cluster.model_copy(update={"umask": 0o022})  # a cluster that lets others read
    findings = _by_check(file_findings(relaxed))
    assert findings["checkpoints root"].status == "ok"
    assert PATHS_CHECK not in findings and "data files 0644 / directories 0755" in findings


def test_a_topics_root_linked_into_a_world_writable_directory_fails(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    world = tmp_path / "world"
    world.mkdir()
    world.chmod(0o777)
    (world / "topics").mkdir(mode=0o750)
    topics = cluster.resolved_topics_root()
    topics.rmdir()
    topics.symlink_to(world / "topics")
    finding = _by_check(file_findings(cluster))["topics root"]
    assert finding.status == "fail", finding
    assert f"-> {world / 'topics'}" in finding.detail and f"{world} (above it) is drwxrwxrwx" in finding.detail

    # The same link into a directory nobody else can write passes, and a sticky one (as /tmp) too.
    world.chmod(0o750)
    assert _by_check(file_findings(cluster))["topics root"].status == "ok"
    world.chmod(0o1777)
    assert _by_check(file_findings(cluster))["topics root"].status == "ok"


def test_a_root_linked_to_a_file_or_nowhere(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    dist = cluster.resolved_dist_dir()
    dist.rmdir()
    dist.symlink_to(tmp_path / "missing")
    finding = _by_check(file_findings(cluster))["dist root"]
    assert finding.status == "ok" and "does not exist yet" in finding.detail, finding
    (tmp_path / "missing").write_text("")
    finding = _by_check(file_findings(cluster))["dist root"]
    assert finding.status == "fail" and "is not a directory" in finding.detail, finding


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a path to another user needs root")
def test_roots_and_links_owned_by_another_user_fail(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    os.chown(cluster.resolved_checkpoints_root(), 65534, 65534)
    findings = _by_check(file_findings(cluster))
    assert findings["checkpoints root"].status == "fail" and "owned by" in findings["checkpoints root"].detail
    # A link another user planted in a sticky directory (/tmp's attack) is not followed as ours.
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    (sticky / "target").mkdir(mode=0o750)
    (sticky / "link").symlink_to(sticky / "target")
    os.lchown(sticky / "link", 65534, 65534)
    topics = cluster.resolved_topics_root()
    topics.rmdir()
    topics.symlink_to(sticky / "link")
    finding = _by_check(file_findings(cluster))["topics root"]
    assert finding.status == "fail" and f"the symbolic link {sticky / 'link'} is owned by" in finding.detail, finding


def test_many_well_moded_files_do_not_hide_a_loose_checkpoint(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    for queue in range(3):
        _write_files(cluster.resolved_topics_root() / "wc" / f"queue-{queue:05d}", 2000)
    _write_files(cluster.resolved_dist_dir() / "wc", 1000)
    offsets = cluster.resolved_checkpoints_root() / "wc" / "task-00000" / "offsets"
    _write_files(offsets, 1, mode=0o644)
    finding = _by_check(file_findings(cluster))[PATHS_CHECK]  # the default cap: 5,000 paths
    assert finding.status == "fail", finding
    assert f"{offsets / 'f00000.jsonl'} (-rw-r--r--)" in finding.detail
    assert "cut short" in finding.detail and "topics" in finding.detail, "the roots it did not finish are named"


def test_a_cut_short_walk_is_a_warning_naming_what_it_did_not_reach(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    _write_files(cluster.resolved_topics_root() / "wc" / "queue-00000", 300)
    _write_files(cluster.resolved_checkpoints_root() / "wc", 5)
    finding = _by_check(file_findings(cluster, max_files=100))[PATHS_CHECK]
    assert finding.status == "warn", finding
    assert "100 paths checked" in finding.detail and "topics" in finding.detail.split("before the rest of")[1]
    assert "checkpoints 6" in finding.detail, "the small root was walked whole"
    assert "--max-files 0" in finding.detail
    assert _by_check(file_findings(cluster, max_files=0))[PATHS_CHECK].status == "ok"


def test_a_symlink_or_foreign_entry_below_a_root_fails(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    queue = cluster.resolved_topics_root() / "wc" / "queue-00000"
    _write_files(queue, 1)
    (queue / "planted.jsonl").symlink_to("/etc/hostname")
    finding = _by_check(file_findings(cluster))[PATHS_CHECK]
    assert finding.status == "fail" and "planted.jsonl (symlink)" in finding.detail, finding
