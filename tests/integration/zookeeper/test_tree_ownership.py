"""With digest credentials the cluster owns its ZooKeeper tree (issue 17, item 3).

ZooKeeper checks CREATE and DELETE on the *parent* of a node and its root ``/`` is
world-writable, so the cluster's ACLs only protect a tree the cluster created itself. These tests
squat a chroot the way the issue's attacker did (an anonymous client creating it and its
top-level nodes with ``world:anyone`` ACLs) and check that a secured connect, a secured
``ensure_path`` and a secured worker start all refuse it, naming the node; and that on a tree the
cluster created, an anonymous client can neither delete nor recreate ``/storms/<id>``.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NotEmptyError
from kazoo.security import OPEN_ACL_UNSAFE
from pydantic import ValidationError

from stream_ops.config import ZooKeeperConfig
from stream_ops.coordination.acl import audit_acls, cluster_acl, cluster_roots, digest_identity, format_acl
from stream_ops.coordination.embedded import EmbeddedZooKeeper
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore, encode_json
from stream_ops.errors import ZooKeeperTreeNotOwnedError
from stream_ops.ports import free_port

CLUSTER_AUTH = "stream-ops:tree-owner-password"
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def chroot() -> str:
    return f"/test-owned-{uuid.uuid4().hex}"


@pytest.fixture
def anonymous(zookeeper: EmbeddedZooKeeper) -> Iterator[KazooClient]:
    """A root-level client without credentials: what anyone who reaches ZooKeeper has."""
    client = KazooClient(hosts=zookeeper.hosts, timeout=4.0)
    client.start(timeout=5)
    try:
        yield client
    finally:
        client.stop()
        client.close()


def _secured(zookeeper: EmbeddedZooKeeper, chroot: str, open_reads: bool = False) -> ZooKeeperConfig:
    return ZooKeeperConfig(
        hosts=zookeeper.hosts,
        chroot=chroot,
        session_timeout_s=4.0,
        connect_timeout_s=5.0,
        auth_digest=CLUSTER_AUTH,
        open_reads=open_reads,
    )


def _squat(client: KazooClient, chroot: str, nodes: tuple[str, ...] = (ZkPaths.STORMS, ZkPaths.WORKERS)) -> None:
    """Create ``chroot`` and some top-level nodes the way the issue's attacker did (world ACL)."""
    client.create(chroot, b"", acl=OPEN_ACL_UNSAFE)
    for node in nodes:
        client.create(f"{chroot}{node}", b"", acl=OPEN_ACL_UNSAFE)


def _cleanup(client: KazooClient, chroot: str) -> None:
    """Delete a squatted tree (open ACLs: anyone may)."""
    client.delete(chroot, recursive=True)


def test_squatted_chroot_makes_a_secured_connect_fail_naming_the_node(
    zookeeper: EmbeddedZooKeeper, chroot: str, anonymous: KazooClient
) -> None:
    _squat(anonymous, chroot)
    try:
        with pytest.raises(ZooKeeperTreeNotOwnedError) as refused:
            ZkStore.connect(_secured(zookeeper, chroot))
        message = str(refused.value)
        assert f"{chroot} has world:anyone=cdrwa" in message
        assert "secure-tree" in message and "deleteall" in message  # says what to do
        assert {path for path, _actual, _expected in refused.value.mismatches} == {
            chroot,
            f"{chroot}{ZkPaths.STORMS}",
            f"{chroot}{ZkPaths.WORKERS}",
        }
        # Nothing was created under a chroot that is not the cluster's.
        assert sorted(anonymous.get_children(chroot)) == ["storms", "workers"]
        assert "tree-owner-password" not in message
    finally:
        _cleanup(anonymous, chroot)


def test_a_squatted_top_level_node_under_an_owned_chroot_is_refused(zookeeper: EmbeddedZooKeeper, chroot: str) -> None:
    config = _secured(zookeeper, chroot)
    with ZkStore.connect(config) as cluster:
        # A top-level node whose ACL lets anyone in (here: recreated so by the cluster itself).
        cluster.delete(ZkPaths.STORMS)
        cluster.client.create(ZkPaths.STORMS, b"", acl=OPEN_ACL_UNSAFE)
        with pytest.raises(ZooKeeperTreeNotOwnedError, match=f"{chroot}/storms has world:anyone=cdrwa") as refused:
            ZkStore.connect(config)
        assert [path for path, _a, _e in refused.value.mismatches] == [f"{chroot}/storms"]
        cluster.delete_recursive("/")
        cluster.client.delete("/")


def test_a_tree_the_cluster_created_passes_and_carries_only_its_acl(
    zookeeper: EmbeddedZooKeeper, chroot: str, anonymous: KazooClient
) -> None:
    config = _secured(zookeeper, chroot, open_reads=True)
    with ZkStore.connect(config) as cluster:
        # The chroot comes with every top-level node, all with the cluster's ACL.
        assert cluster.children("/") == sorted(node.lstrip("/") for node in cluster_roots())
        assert audit_acls(cluster) == []
        expected = f"digest:{digest_identity(CLUSTER_AUTH)}=cdrwa, world:anyone=r"
        assert format_acl(cluster.get_acl("/")) == expected
        assert format_acl(cluster.get_acl(ZkPaths.STORMS)) == expected
        # What an anonymous client sees (ZooKeeper hides the digest hash from it).
        assert format_acl(anonymous.get_acls(chroot)[0]) == "digest:stream-ops:x=cdrwa, world:anyone=r"
    with ZkStore.connect(config) as again:  # and the next connect accepts it
        again.delete_recursive("/")
        again.client.delete("/")


def test_chroot_root_is_refused_with_credentials(zookeeper: EmbeddedZooKeeper) -> None:
    with pytest.raises(ValidationError, match="must own its tree.*--chroot /stream_ops") as refused:
        ZooKeeperConfig(hosts=zookeeper.hosts, chroot="/", auth_digest=CLUSTER_AUTH)
    assert "tree-owner-password" not in str(refused.value)
    ZooKeeperConfig(hosts=zookeeper.hosts, chroot="/")  # an open cluster may still use it


def test_anonymous_client_cannot_delete_and_recreate_a_storm_in_a_tree_the_cluster_created(
    zookeeper: EmbeddedZooKeeper, chroot: str, anonymous: KazooClient
) -> None:
    # With open reads, the most an anonymous client gets from a cluster-created tree.
    with ZkStore.connect(_secured(zookeeper, chroot, open_reads=True)) as cluster:
        storm = ZkPaths.storm("wc-1-1700000000")
        record = {"status": "ACTIVE", "dist_dir": "/srv/dist/wc-1-1700000000", "code_sha256": "0" * 64}
        cluster.create_json(storm, record)
        forged = encode_json({**record, "dist_dir": "/tmp/evil", "code_sha256": "f" * 64})
        # ZooKeeper checks DELETE and CREATE on the parent: /storms grants them to the cluster only.
        with pytest.raises(NoAuthError):
            anonymous.delete(f"{chroot}{storm}")
        with pytest.raises(NoAuthError):
            anonymous.create(f"{chroot}{ZkPaths.storm('evil-1-1700000000')}", forged, acl=OPEN_ACL_UNSAFE)
        with pytest.raises(NoAuthError):
            anonymous.set(f"{chroot}{storm}", forged)
        # Nor can it remove or replace /storms or /workers themselves (the chroot's ACL)...
        for node in (ZkPaths.STORMS, ZkPaths.WORKERS):
            with pytest.raises(NoAuthError):
                anonymous.delete(f"{chroot}{node}")
        # ...or the chroot: it is never empty, and its children are the cluster's to delete.
        with pytest.raises(NotEmptyError):
            anonymous.delete(chroot)
        assert cluster.get_json(storm)[0] == record  # type: ignore[index]
        cluster.delete_recursive("/")
        cluster.client.delete("/")


def test_ensure_path_refuses_an_existing_node_that_is_not_the_clusters(zookeeper: EmbeddedZooKeeper, chroot: str) -> None:
    with ZkStore.connect(_secured(zookeeper, chroot)) as cluster:
        cluster.client.create(f"{ZkPaths.LOCKS}/squatted", b"", acl=OPEN_ACL_UNSAFE)
        with pytest.raises(ZooKeeperTreeNotOwnedError, match=f"{chroot}/locks/squatted has world:anyone=cdrwa"):
            cluster.ensure_path(f"{ZkPaths.LOCKS}/squatted/below")
        assert not cluster.exists(f"{ZkPaths.LOCKS}/squatted/below")  # nothing created under it
        cluster.ensure_path(f"{ZkPaths.LOCKS}/ours/below")  # the cluster's own nodes pass
        assert cluster.get_acl(f"{ZkPaths.LOCKS}/ours") == cluster_acl(cluster.config)
        cluster.delete_recursive("/")
        cluster.client.delete("/")


def test_ensure_paths_refuses_an_existing_node_that_is_not_the_clusters(zookeeper: EmbeddedZooKeeper, chroot: str) -> None:
    with ZkStore.connect(_secured(zookeeper, chroot)) as cluster:
        cluster.client.create(f"{ZkPaths.LOCKS}/squatted", b"", acl=OPEN_ACL_UNSAFE)
        with pytest.raises(ZooKeeperTreeNotOwnedError, match=f"{chroot}/locks/squatted has world:anyone=cdrwa"):
            cluster.ensure_paths([f"{ZkPaths.LOCKS}/ours", f"{ZkPaths.LOCKS}/squatted/below"])
        assert not cluster.exists(f"{ZkPaths.LOCKS}/squatted/below")  # nothing created under it
        cluster.ensure_paths([f"{ZkPaths.LOCKS}/ours/below", ZkPaths.STORMS])  # the cluster's own nodes pass
        assert cluster.get_acl(f"{ZkPaths.LOCKS}/ours/below") == cluster_acl(cluster.config)
        cluster.delete_recursive("/")
        cluster.client.delete("/")


def test_a_secured_worker_refuses_to_start_on_a_squatted_chroot(
    zookeeper: EmbeddedZooKeeper, chroot: str, anonymous: KazooClient, tmp_path: Path
) -> None:
    _squat(anonymous, chroot)
    auth_file = tmp_path / "zk-auth"
    auth_file.write_text(CLUSTER_AUTH + "\n", encoding="utf-8")
    auth_file.chmod(0o600)
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "stream_ops.cli",
                "--zookeeper",
                zookeeper.hosts,
                "--chroot",
                chroot,
                "--home",
                str(tmp_path / "home"),
                "--session-timeout",
                "4",
                "--zk-auth-file",
                str(auth_file),
                "worker",
                "--port",
                str(free_port()),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
        )
        assert result.returncode == 1, result.stderr[-2000:]
        assert f"{chroot} has world:anyone=cdrwa" in result.stderr
        assert "Traceback" not in result.stderr and "tree-owner-password" not in result.stderr
        assert anonymous.get_children(f"{chroot}{ZkPaths.WORKERS}") == []  # it never registered
    finally:
        _cleanup(anonymous, chroot)
