"""ZooKeeper ACLs for a cluster that authenticates with a digest identity.

With :attr:`ZooKeeperConfig.auth_digest <stream_ops.config.ZooKeeperConfig.auth_digest>` set
(``user:password``), every znode stream_ops creates (the chroot, storms, tasks, assignments,
workers, owners, heartbeats, commits, locks, elections) gets :func:`cluster_acl`:

============================  ==========================================================
ACL entry                     meaning
============================  ==========================================================
``digest:<user>:<hash>`` ALL  only the cluster's identity reads, writes, creates, deletes
``world:anyone`` READ         only with ``open_reads``: anyone may read (dashboards, zkCli)
============================  ==========================================================

So a client without the cluster's credentials cannot move an assignment, take an owner node
or write a commit: ZooKeeper answers ``NoAuth`` and :class:`~stream_ops.coordination.store.ZkStore`
raises :class:`~stream_ops.errors.CoordinationError` saying which credentials to use.

The ACL names the digest identity explicitly (not ZooKeeper's ``auth`` scheme, which means
"whoever created it"), so every process of the cluster, whatever other identities its session
carries, produces the same ACL, and :func:`audit_acls` can check it.

Digest authentication sends ``user:password`` to the server in clear text: on a network that
is not trusted, run ZooKeeper's TLS client port as well.

Example:
    >>> from stream_ops.config import ZooKeeperConfig
    >>> cfg = ZooKeeperConfig(auth_digest="stream-ops:s3cret", open_reads=True)
    >>> [(a.id.scheme, a.perms) for a in cluster_acl(cfg)]
    [('digest', 31), ('world', 1)]
    >>> digest_identity("stream-ops:s3cret")
    'stream-ops:Kc1jOZoA6mdy3b0wBIVXxBWRwYc='
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kazoo.security import ACL, Id, Permissions, make_digest_acl_credential

from stream_ops.config import ZooKeeperConfig
from stream_ops.errors import ZnodeNotFoundError

if TYPE_CHECKING:  # the store imports this module
    from stream_ops.coordination.store import ZkStore

__all__ = [
    "AclMismatch",
    "audit_acls",
    "cluster_acl",
    "digest_identity",
    "format_acl",
    "secure_tree",
    "super_digest_jvm_option",
]

logger = logging.getLogger(__name__)

#: ZooKeeper's own subtree; never touched (exists only when the chroot is ``/``).
_ZOOKEEPER_INTERNAL = "/zookeeper"


def _split(credentials: str) -> tuple[str, str]:
    user, sep, password = credentials.partition(":")
    if not sep or not user or not password:
        raise ValueError("digest credentials must be written user:password, both non-empty")
    return user, password


def digest_identity(credentials: str) -> str:
    """The ``user:base64(sha1(user:password))`` id ZooKeeper stores for digest credentials.

    Args:
        credentials: ``user:password``.

    Raises:
        ValueError: ``credentials`` is not ``user:password``.
    """
    user, password = _split(credentials)
    return str(make_digest_acl_credential(user, password))


def super_digest_jvm_option(credentials: str) -> str:
    """JVM option that makes ``credentials`` ZooKeeper's super user (for operators only).

    The super user bypasses every ACL; give it to the ZooKeeper servers
    (``-Dzookeeper.DigestAuthenticationProvider.superDigest=...``) so an operator can repair
    or delete a tree whose cluster password was lost. Never give it to stream_ops processes.

    Example:
        >>> super_digest_jvm_option("super:admin-secret")  # doctest: +SKIP
        '-Dzookeeper.DigestAuthenticationProvider.superDigest=super:...'
    """
    return f"-Dzookeeper.DigestAuthenticationProvider.superDigest={digest_identity(credentials)}"


def cluster_acl(config: ZooKeeperConfig) -> list[ACL] | None:
    """The ACL every znode of this cluster gets, or ``None`` (open) without ``auth_digest``.

    Returns:
        ``[digest:<identity> ALL]`` plus ``[world:anyone READ]`` when ``open_reads`` is set.
    """
    if not config.auth_digest:
        return None
    acl = [ACL(Permissions.ALL, Id("digest", digest_identity(config.auth_digest)))]
    if config.open_reads:
        acl.append(ACL(Permissions.READ, Id("world", "anyone")))
    return acl


def format_acl(acl: list[ACL] | None) -> str:
    """Readable form of an ACL, e.g. ``digest:stream-ops:...=cdrwa, world:anyone=r``."""
    if not acl:
        return "<open>"
    letters = (
        (Permissions.CREATE, "c"),
        (Permissions.DELETE, "d"),
        (Permissions.READ, "r"),
        (Permissions.WRITE, "w"),
        (Permissions.ADMIN, "a"),
    )
    parts = []
    for entry in acl:
        perms = "".join(letter for bit, letter in letters if entry.perms & bit)
        parts.append(f"{entry.id.scheme}:{entry.id.id}={perms}")
    return ", ".join(sorted(parts))


def _as_set(acl: list[ACL] | None) -> frozenset[tuple[int, str, str]]:
    return frozenset((a.perms, a.id.scheme, a.id.id) for a in acl or [])


@dataclass(frozen=True)
class AclMismatch:
    """A znode whose ACL is not the cluster's."""

    path: str
    actual: str
    expected: str

    def __str__(self) -> str:
        return f"{self.path}: {self.actual} (expected {self.expected})"


def _walk(store: ZkStore, path: str) -> list[str]:
    found = [path]
    for child in store.children(path):
        child_path = f"{path.rstrip('/')}/{child}"
        if child_path == _ZOOKEEPER_INTERNAL:
            continue
        found.extend(_walk(store, child_path))
    return found


def audit_acls(store: ZkStore, path: str = "/") -> list[AclMismatch]:
    """Every znode at or under ``path`` whose ACL differs from the store's :func:`cluster_acl`.

    Nodes that vanish during the walk (ephemeral owners, heartbeats) are skipped. With no
    ``auth_digest`` the expected ACL is ZooKeeper's open one.

    Args:
        store: A connected :class:`~stream_ops.coordination.store.ZkStore`; it must be allowed
            to read the ACLs (the cluster's identity, or any client with ``open_reads``).
        path: Subtree to check (relative to the chroot).

    Returns:
        The mismatches, in tree order; empty when every node is protected.

    Example:
        >>> for mismatch in audit_acls(store):  # doctest: +SKIP
        ...     print(mismatch)
    """
    expected_acl = cluster_acl(store.config)
    expected = _as_set(expected_acl) if expected_acl else _as_set([ACL(Permissions.ALL, Id("world", "anyone"))])
    mismatches = []
    for node in _walk(store, path):
        try:
            actual = store.get_acl(node)
        except ZnodeNotFoundError:
            continue
        if _as_set(actual) != expected:
            mismatches.append(
                AclMismatch(node, format_acl(actual), format_acl(expected_acl) if expected_acl else "world:anyone=cdrwa")
            )
    return mismatches


def secure_tree(store: ZkStore, path: str = "/") -> int:
    """Give every znode at or under ``path`` the cluster ACL (migrating an open cluster).

    Run it once with the cluster's credentials after turning ``auth_digest`` on for a
    cluster whose nodes were created without it (ZooKeeper only checks ``ADMIN`` on each node,
    which open nodes grant to anyone). Nodes that vanish meanwhile are skipped.

    Returns:
        The number of nodes whose ACL was changed.

    Raises:
        ValueError: The store has no ``auth_digest`` (there is no cluster ACL to apply).
        CoordinationError: A node refuses the change (it belongs to another identity).
    """
    acl = cluster_acl(store.config)
    if acl is None:
        raise ValueError("secure_tree needs ZooKeeperConfig.auth_digest: it applies the cluster's digest ACL")
    wanted = _as_set(acl)
    changed = 0
    for node in _walk(store, path):
        try:
            if _as_set(store.get_acl(node)) != wanted:
                store.set_acl(node, acl)
                changed += 1
        except ZnodeNotFoundError:
            continue
    logger.info("secured %d znodes under %s%s", changed, store.config.chroot, path)
    return changed
