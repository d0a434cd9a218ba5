"""Taking and committing tasks against a real ZooKeeper (no Spark)."""

from __future__ import annotations

import pytest

from stream_ops.config import ClusterConfig
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import OwnershipLostError, TaskBusyError
from stream_ops.examples.wordcount import build_wordcount
from stream_ops.nimbus.submission import submit
from stream_ops.runtime.ownership import acquire, commit, release


def test_owner_node_left_by_this_session_is_taken_back(zk_config, zk_store, tmp_path):
    """A start that raced a reconnect can leave an owner node in our own live session."""
    topology_id = submit(zk_store, ClusterConfig(root=tmp_path), build_wordcount(tmp_path / "in"), workers=1)
    first = acquire(zk_store, topology_id, 0, "host:1")
    again = acquire(zk_store, topology_id, 0, "host:1")  # no runner holds `first` any more
    assert again.epoch == first.epoch + 1
    with pytest.raises(OwnershipLostError):
        commit(zk_store, first, 0, offsets=[], rows=0)
    commit(zk_store, again, 0, offsets=[], rows=0)


def test_another_workers_owner_node_is_respected(zk_config, zk_store, tmp_path):
    topology_id = submit(zk_store, ClusterConfig(root=tmp_path), build_wordcount(tmp_path / "in"), workers=1)
    held = acquire(zk_store, topology_id, 0, "host:1")
    with ZkStore.connect(zk_config) as other:
        with pytest.raises(TaskBusyError):
            acquire(other, topology_id, 0, "host:1")  # same name, other session: not ours
        with pytest.raises(TaskBusyError):
            acquire(other, topology_id, 0, "host:2")
        release(zk_store, held)
        assert acquire(other, topology_id, 0, "host:2").epoch == held.epoch + 1
