"""A local stack started again on its home (issue 31, item 6): the topology it finds is resumed
when its plan and code are the same, killed and resubmitted when they changed; ``--fresh``
removes exactly what a stack leaves under its home."""

from __future__ import annotations

from pathlib import Path

from stream_ops.config import ClusterConfig
from stream_ops.coordination.cluster_state import find_topology
from stream_ops.coordination.store import ZkStore
from stream_ops.examples.wordcount import build_wordcount
from stream_ops.local_stack import STACK_DIRECTORIES, clear_stack_state, start_topology


def test_the_same_topology_is_resumed_and_a_changed_one_resubmitted(zk_store: ZkStore, tmp_path: Path) -> None:
    cluster = ClusterConfig(root=tmp_path / "home")
    first, how = start_topology(zk_store, cluster, build_wordcount(tmp_path / "in", queues=2), workers=1)
    assert how == "submitted"
    again, how = start_topology(zk_store, cluster, build_wordcount(tmp_path / "in", queues=2), workers=1)
    assert (again, how) == (first, "resumed")
    changed, how = start_topology(zk_store, cluster, build_wordcount(tmp_path / "in", queues=3), workers=1)
    assert how == "resubmitted" and changed != first
    record = find_topology(zk_store, "wordcount")
    assert record is not None and record.topology_id == changed


def test_fresh_removes_the_stacks_directories_and_nothing_else(tmp_path: Path) -> None:
    home = tmp_path / "home"
    for name in STACK_DIRECTORIES:
        (home / name / "deep").mkdir(parents=True)
    (home / "notes.txt").write_text("mine")
    (home / "mine").mkdir()
    removed = clear_stack_state(home)
    assert sorted(p.name for p in removed) == sorted(STACK_DIRECTORIES)
    assert sorted(p.name for p in home.iterdir()) == ["mine", "notes.txt"]
    assert clear_stack_state(home) == []
