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

That only holds on a tree the cluster created itself. ZooKeeper checks CREATE and DELETE on the
*parent* of a node, and its root ``/`` is world-writable: a client without credentials could
create the chroot and its top-level nodes first, with ``world:anyone`` ACLs, then delete and
recreate ``/storms/<id>`` under them. So, with credentials:

* :meth:`ZkStore.connect <stream_ops.coordination.store.ZkStore.connect>` creates a missing
  chroot together with every top-level node (:func:`cluster_roots`) in one transaction, all with
  the cluster ACL, so the chroot is never empty (an empty node could be deleted by whoever may
  delete in its parent);
* every connect checks that the chroot and each top-level node carry exactly the cluster ACL and
  refuses otherwise with :class:`~stream_ops.errors.ZooKeeperTreeNotOwnedError` naming them;
* :meth:`ZkStore.ensure_path <stream_ops.coordination.store.ZkStore.ensure_path>` checks the ACL
  of every node of the path that exists already;
* the chroot cannot be ``/`` (config validation).

Workers, the nimbus and the supervisor refuse to run without credentials at all unless told
``insecure`` explicitly (:func:`require_auth`): on an open tree any client that reaches
ZooKeeper chooses what they run. Told so, each says it once in its log.

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
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kazoo.security import ACL, Id, Permissions, make_digest_acl_credential

from stream_ops.config import ZooKeeperConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.errors import ZnodeNotFoundError, ZooKeeperAuthRequiredError, ZooKeeperTreeNotOwnedError

if TYPE_CHECKING:  # the store imports this module
    from stream_ops.coordination.store import ZkStore

__all__ = [
    "AclMismatch",
    "audit_acls",
    "cluster_acl",
    "cluster_roots",
    "digest_identity",
    "format_acl",
    "require_auth",
    "same_acl",
    "secure_tree",
    "super_digest_jvm_option",
    "tree_not_owned",
]

logger = logging.getLogger(__name__)

#: ZooKeeper's own subtree; never touched (exists only when the chroot is ``/``).
_ZOOKEEPER_INTERNAL = "/zookeeper"
#: Offending nodes named in a :class:`ZooKeeperTreeNotOwnedError` message (all are in its attribute).
_SHOWN_MISMATCHES = 3


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
    credentials = config.auth_credentials()
    if not credentials:
        return None
    acl = [ACL(Permissions.ALL, Id("digest", digest_identity(credentials)))]
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


def same_acl(actual: list[ACL] | None, expected: list[ACL] | None) -> bool:
    """Whether two ACLs grant the same permissions to the same ids (order does not matter)."""
    return _as_set(actual) == _as_set(expected)


def cluster_roots() -> tuple[str, ...]:
    """Every top-level znode of the cluster's tree: the one-level paths of :class:`ZkPaths`.

    Derived from :class:`ZkPaths`, so a new top-level constant there is created and checked at
    connect without touching this module.

    Example:
        >>> "/storms" in cluster_roots() and "/nimbus" in cluster_roots()
        True
        >>> "/nimbus/id-counter" in cluster_roots()
        False
    """
    return tuple(
        sorted(
            value
            for name, value in vars(ZkPaths).items()
            if name.isupper() and isinstance(value, str) and value.startswith("/") and value.count("/") == 1
        )
    )


def _owner_hint(config: ZooKeeperConfig, acl: list[ACL] | None) -> str:
    """Why a node's ACL differs, when it can be told: another password of the same user."""
    credentials = config.auth_credentials() or ""
    user = credentials.partition(":")[0]
    ours = digest_identity(credentials) if credentials else ""
    for entry in acl or []:
        if entry.id.scheme == "digest" and entry.id.id.partition(":")[0] == user and entry.id.id != ours:
            return (
                f"it belongs to digest user {user!r} with another password: check the credentials "
                "(--zk-auth-file / STREAM_OPS_ZK_AUTH) against the ones the cluster was created with"
            )
    return ""


def _what_to_do(chroot: str) -> str:
    """The part of a :class:`ZooKeeperTreeNotOwnedError` message that says what to do."""
    return (
        "A node whose ACL lets others create or delete in it lets them replace topologies, workers and "
        "assignments below it (ZooKeeper checks CREATE and DELETE on the parent). If the tree is this cluster's "
        "own, created before --zk-auth was turned on or with another --zk-open-reads, give it the cluster ACL once: "
        f"`stream-ops --zk-auth-file <file> --chroot {chroot} secure-tree`. Otherwise someone else created it: "
        f"delete it (zkCli `deleteall {chroot}`, as its owner or ZooKeeper's super user) and start again, or use "
        "another --chroot."
    )


def tree_not_owned(config: ZooKeeperConfig, mismatches: list[tuple[str, list[ACL] | None]]) -> ZooKeeperTreeNotOwnedError:
    """The error refusing to start on a tree whose chroot or top-level nodes are not the cluster's.

    Args:
        config: The cluster's configuration (its chroot and credentials).
        mismatches: ``(absolute path, actual ACL)`` of each offending node; ``None`` when even
            reading the ACL was refused.
    """
    expected = format_acl(cluster_acl(config))
    rows = [(path, "<unreadable: NoAuth>" if acl is None else format_acl(acl), expected) for path, acl in mismatches]
    shown = "; ".join(f"{path} has {actual}" for path, actual, _ in rows[:_SHOWN_MISMATCHES])
    if len(rows) > _SHOWN_MISMATCHES:
        shown += f" (and {len(rows) - _SHOWN_MISMATCHES} more of its top-level nodes)"
    hints = sorted({hint for _path, acl in mismatches if (hint := _owner_hint(config, acl))})
    message = (
        f"refusing to use the ZooKeeper tree {config.chroot}: {shown}; the cluster's ACL is {expected}. "
        + "".join(f"{hint}. " for hint in hints)
        + _what_to_do(config.chroot)
    )
    return ZooKeeperTreeNotOwnedError(message, mismatches=rows)


_warned: set[tuple[str, str, str]] = set()
_warned_lock = threading.Lock()


def require_auth(config: ZooKeeperConfig, process: str, *, warn: bool = True) -> None:
    """Refuse to run ``process`` (a worker, the nimbus, a supervisor) on an unauthenticated tree.

    Without ``auth_digest`` every znode is open: any client that reaches ZooKeeper can rewrite
    ``/storms/<id>`` and the assignments, so it chooses the code the workers run and where tasks
    go. That is acceptable only when said explicitly, for a local single-user stack
    (``stream-ops dev`` / ``demo``) or tests: ``insecure`` (``--insecure``). Then the process
    says so with one warning: once per process (and ``process``, hosts and chroot), however
    many times it checks.

    Args:
        config: The process's ZooKeeper configuration.
        process: What is starting, for the messages (``worker``, ``nimbus``, ``supervisor``).
        warn: Log the warning for an insecure tree. False for an early check made before the
            process image that runs (a ``stream-ops worker`` starts itself again without its
            environment first, and its :class:`~stream_ops.runtime.worker.Worker` warns).

    Raises:
        ZooKeeperAuthRequiredError: No credentials and not ``insecure``.

    Example:
        >>> require_auth(ZooKeeperConfig(insecure=True), "worker")
        >>> require_auth(ZooKeeperConfig(), "worker")
        Traceback (most recent call last):
        ...
        stream_ops.errors.ZooKeeperAuthRequiredError: refusing to start the worker without ZooKeeper ...
    """
    if config.auth_credentials():
        return
    if not config.insecure:
        raise ZooKeeperAuthRequiredError(
            f"refusing to start the {process} without ZooKeeper credentials: on an open tree any client that reaches "
            f"{config.hosts} can rewrite what it runs. Give the cluster's digest credentials (--zk-auth-file <file> "
            "or env STREAM_OPS_ZK_AUTH; ZooKeeperResource.auth_digest in Dagster), or, for a local single-user stack "
            f"only, say so explicitly: `stream-ops {process} --insecure` (ZooKeeperConfig.insecure=True)"
        )
    if not warn:
        return
    with _warned_lock:
        key = (process, config.hosts, config.chroot)
        if key in _warned:
            return
        _warned.add(key)
    logger.warning(
        "%s runs INSECURE: ZooKeeper %s%s has no credentials, so any client that reaches it can change what this %s runs",
        process,
        config.hosts,
        config.chroot,
        process,
    )


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
