"""Digest authentication and ACLs on every znode stream_ops creates (stream_ops.coordination.acl).

With ``auth_digest`` set, the cluster's identity alone may write assignments, owners and
commits; with ``open_reads`` anyone may read them. A client without the credentials gets a
:class:`CoordinationError` naming NoAuth and the credentials to use.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from pathlib import Path

import pytest
from kazoo.security import OPEN_ACL_UNSAFE, Permissions
from pydantic import ValidationError

from stream_ops.config import ClusterConfig, ZooKeeperConfig
from stream_ops.coordination.acl import audit_acls, cluster_acl, digest_identity, format_acl, secure_tree
from stream_ops.coordination.embedded import EmbeddedZooKeeper
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import WorkerRecord
from stream_ops.coordination.store import ZkStore, encode_json
from stream_ops.errors import CoordinationError, StreamOpsError, TransactionFailedError, ZooKeeperTreeNotOwnedError
from stream_ops.examples.wordcount import build_wordcount
from stream_ops.nimbus import current_leader, reassign, run_nimbus, submit
from stream_ops.runtime.ownership import acquire, commit

CLUSTER_AUTH = "stream-ops:correct-horse-battery-staple"
NOAUTH = "NoAuthError.*cluster's digest credentials"


def _config(zookeeper: EmbeddedZooKeeper, chroot: str, auth: str | None = None, open_reads: bool = False) -> ZooKeeperConfig:
    return ZooKeeperConfig(
        hosts=zookeeper.hosts,
        chroot=chroot,
        session_timeout_s=4.0,
        connect_timeout_s=5.0,
        auth_digest=auth,
        open_reads=open_reads,
    )


@pytest.fixture
def chroot() -> str:
    return f"/test-acl-{uuid.uuid4().hex}"


def _register_worker(store: ZkStore, worker_id: str) -> None:
    store.ensure_path(ZkPaths.WORKERS)
    host, _, port = worker_id.rpartition(":")
    record = WorkerRecord(
        worker_id=worker_id, host=host, port=int(port), pid=os.getpid(), capacity=8, started_at=time.time(), tls=False
    )
    store.create_json(ZkPaths.worker(worker_id), record.to_json_obj(), ephemeral=True)


def _submitted(store: ZkStore, tmp_path: Path) -> str:
    """A word count submitted and assigned to one (registered, not running) worker slot."""
    _register_worker(store, "127.0.0.1:1")
    return submit(store, ClusterConfig(root=tmp_path / "cluster"), build_wordcount(tmp_path / "in", name="wc-acl"), workers=1)


@pytest.mark.parametrize("open_reads", [False, True], ids=["closed", "open-reads"])
def test_every_node_stream_ops_creates_carries_the_cluster_acl(
    zookeeper: EmbeddedZooKeeper, chroot: str, tmp_path: Path, open_reads: bool
) -> None:
    config = _config(zookeeper, chroot, CLUSTER_AUTH, open_reads)
    with ZkStore.connect(config) as store:
        topology_id = _submitted(store, tmp_path)
        ownership = acquire(store, topology_id, 0, "127.0.0.1:1")  # ephemeral owner, in a transaction
        commit(store, ownership, 0, offsets=[], rows=0)
        store.create_json(ZkPaths.heartbeat(topology_id, 0), {"txid": 0}, ephemeral=True)
        lock = store.client.Lock(ZkPaths.compaction_lock(topology_id, 0))  # kazoo recipe
        assert lock.acquire(timeout=5)
        stop = threading.Event()
        nimbus = threading.Thread(target=run_nimbus, args=(config, stop), kwargs={"interval_s": 0.2}, daemon=True)
        nimbus.start()
        try:
            deadline = time.monotonic() + 10
            while current_leader(store) is None:  # election nodes exist
                assert time.monotonic() < deadline, "nimbus was not elected"
                time.sleep(0.05)
            assert audit_acls(store) == []
            nodes = [
                ZkPaths.storm(topology_id),
                ZkPaths.assignment(topology_id),
                ZkPaths.owner(topology_id, 0),
                ZkPaths.transactional_task(topology_id, 0),
                ZkPaths.worker("127.0.0.1:1"),
                "/",
            ]
            expected = f"digest:{digest_identity(CLUSTER_AUTH)}=cdrwa" + (", world:anyone=r" if open_reads else "")
            for node in nodes:
                assert format_acl(store.get_acl(node)) == expected, node
        finally:
            lock.release()
            stop.set()
            nimbus.join(15)
        store.delete_recursive("/")


def test_unauthenticated_client_cannot_write_assignments_owners_or_commits(
    zookeeper: EmbeddedZooKeeper, chroot: str, tmp_path: Path
) -> None:
    with ZkStore.connect(_config(zookeeper, chroot, CLUSTER_AUTH, open_reads=True)) as cluster:
        topology_id = _submitted(cluster, tmp_path)
        ownership = acquire(cluster, topology_id, 0, "127.0.0.1:1")
        _register_worker(cluster, "127.0.0.1:2")  # a slot a rogue reassign could move tasks to
        assignment_before = cluster.get_json(ZkPaths.assignment(topology_id))
        commit_before = cluster.get_json(ZkPaths.transactional_task(topology_id, 1))
        assert assignment_before is not None and commit_before is not None

        with ZkStore.connect(_config(zookeeper, chroot)) as stranger:
            # Reads are open...
            value, stat = stranger.get_json(ZkPaths.assignment(topology_id))  # type: ignore[misc]
            assert value == assignment_before[0]
            # ...writes are not: move an assignment,
            with pytest.raises(CoordinationError, match=NOAUTH):
                stranger.set_json(ZkPaths.assignment(topology_id), {**value, "tasks": {}}, version=stat.version)
            with pytest.raises(CoordinationError, match="NoAuth"):
                reassign(stranger, topology_id, exclude_slots=["127.0.0.1:1"])
            # take or drop an owner node,
            with pytest.raises(CoordinationError, match=NOAUTH):
                stranger.create_json(ZkPaths.owner(topology_id, 1), {"worker_id": "evil:1", "epoch": 99}, ephemeral=True)
            with pytest.raises(StreamOpsError, match="NoAuth"):
                acquire(stranger, topology_id, 1, "evil:1")
            with pytest.raises(CoordinationError, match=NOAUTH):
                stranger.delete(ZkPaths.owner(topology_id, 0))
            # write a commit, alone or in a transaction,
            tx_path = ZkPaths.transactional_task(topology_id, 1)
            with pytest.raises(CoordinationError, match=NOAUTH):
                stranger.set_json(tx_path, {**commit_before[0], "committed_txid": 1000})
            tx = stranger.transaction()
            tx.set_data(tx_path, encode_json({**commit_before[0], "committed_txid": 1000}))
            with pytest.raises(TransactionFailedError, match=NOAUTH) as failed:
                stranger.commit_transaction(tx)
            assert failed.value.reason == "NoAuthError"
            # register a worker slot, or change the ACL back to open.
            with pytest.raises(CoordinationError, match=NOAUTH):
                _register_worker(stranger, "evil:1")
            with pytest.raises(CoordinationError, match="NoAuth"):
                stranger.set_acl(ZkPaths.assignment(topology_id), OPEN_ACL_UNSAFE)

        # Nothing changed.
        assert cluster.get_json(ZkPaths.assignment(topology_id)) == assignment_before
        assert cluster.get_json(tx_path) == commit_before
        assert cluster.get_json(ZkPaths.owner(topology_id, 0))[0]["epoch"] == ownership.epoch  # type: ignore[index]
        assert cluster.get_json(ZkPaths.owner(topology_id, 1)) is None
        cluster.delete_recursive("/")


def test_another_identity_cannot_write_either(zookeeper: EmbeddedZooKeeper, chroot: str, tmp_path: Path) -> None:
    with ZkStore.connect(_config(zookeeper, chroot, CLUSTER_AUTH, open_reads=True)) as cluster:
        topology_id = _submitted(cluster, tmp_path)
        impostor_config = _config(zookeeper, chroot, "stream-ops:wrong-password")
        # The tree is not the impostor's: connecting refuses, naming the likely cause.
        with pytest.raises(ZooKeeperTreeNotOwnedError, match="with another password"):
            ZkStore.connect(impostor_config)
        # Skipping that check does not help it write.
        with ZkStore.connect(impostor_config, verify_tree=False) as impostor:
            assert impostor.get_json(ZkPaths.assignment(topology_id)) is not None
            with pytest.raises(CoordinationError, match=NOAUTH):
                impostor.update_json(ZkPaths.assignment(topology_id), lambda a: {**a, "tasks": {}})
        cluster.delete_recursive("/")


def test_without_open_reads_strangers_cannot_even_connect(zookeeper: EmbeddedZooKeeper, chroot: str, tmp_path: Path) -> None:
    with ZkStore.connect(_config(zookeeper, chroot, CLUSTER_AUTH)) as cluster:
        topology_id = _submitted(cluster, tmp_path)
        with pytest.raises(CoordinationError, match="NoAuth"):
            ZkStore.connect(_config(zookeeper, chroot))
        with ZkStore.connect(_config(zookeeper, "/")) as outside, pytest.raises(CoordinationError, match=NOAUTH):
            outside.get_json(f"{chroot}{ZkPaths.assignment(topology_id)}")
        cluster.delete_recursive("/")


def test_secure_tree_protects_a_cluster_created_without_credentials(
    zookeeper: EmbeddedZooKeeper, chroot: str, tmp_path: Path
) -> None:
    open_config = _config(zookeeper, chroot)
    with ZkStore.connect(open_config) as store:
        topology_id = _submitted(store, tmp_path)
        assert audit_acls(store) == []  # open is what an open cluster expects
    secured = _config(zookeeper, chroot, CLUSTER_AUTH, open_reads=True)
    with pytest.raises(ZooKeeperTreeNotOwnedError, match="secure-tree"):
        ZkStore.connect(secured)  # an open tree is not the cluster's until secure_tree adopts it
    with ZkStore.connect(secured, verify_tree=False) as cluster:
        mismatches = audit_acls(cluster)
        assert {m.path for m in mismatches} >= {"/", ZkPaths.assignment(topology_id)}
        assert all("world:anyone=cdrwa" in m.actual for m in mismatches)
        assert secure_tree(cluster) == len(mismatches)
        assert audit_acls(cluster) == []
        assert secure_tree(cluster) == 0
        with ZkStore.connect(open_config) as stranger, pytest.raises(CoordinationError, match=NOAUTH):
            stranger.set_json(ZkPaths.assignment(topology_id), {})
        with ZkStore.connect(secured):  # adopted: the checked connect accepts it now
            pass
        cluster.delete_recursive("/")


def test_acl_configuration_is_validated_and_the_password_never_printed() -> None:
    with pytest.raises(ValidationError, match="open_reads only narrows an ACL"):
        ZooKeeperConfig(open_reads=True)
    for bad in ("no-colon", ":password", "user:"):
        with pytest.raises(ValidationError, match="user:password"):
            ZooKeeperConfig(auth_digest=bad)
    config = ZooKeeperConfig(auth_digest=CLUSTER_AUTH, open_reads=True)
    assert "battery" not in repr(config) and "battery" not in str(config)
    assert cluster_acl(ZooKeeperConfig()) is None
    acl = cluster_acl(config)
    assert acl is not None
    assert [(a.id.scheme, a.perms) for a in acl] == [("digest", Permissions.ALL), ("world", Permissions.READ)]
    assert acl[0].id.id == digest_identity(CLUSTER_AUTH) and "battery" not in acl[0].id.id
