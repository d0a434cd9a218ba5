"""``stream-ops doctor``: what protects a running cluster, checked against the live system.

Each finding names one protection of the threat model in the README's security section:
ZooKeeper credentials and the cluster's ownership of its tree, authentication and TLS of the
workers' state-query ports, and the modes of the files on the shared paths. The report only
reads; it changes nothing.
"""

from __future__ import annotations

import logging
import os
import ssl
import stat
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from stream_ops.config import ClusterConfig, QueryConfig, ZooKeeperConfig, query_token
from stream_ops.coordination.acl import audit_acls
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import CoordinationError
from stream_ops.nimbus.assignment import live_workers
from stream_ops.runtime.query_client import QueryAccess

logger = logging.getLogger(__name__)

_LOOSE_FILE_BITS = 0o027
"""Group write and any access for others: what a data file of the cluster must not allow."""


@dataclass(frozen=True)
class Finding:
    """One checked protection.

    Attributes:
        area: ``zookeeper``, ``query port`` or ``files``.
        check: what was checked.
        ok: whether the protection is in place.
        detail: what was found, and what to do when it is not in place.
    """

    area: str
    check: str
    ok: bool
    detail: str

    def to_json_obj(self) -> dict[str, Any]:
        return asdict(self)


def security_report(
    zookeeper: ZooKeeperConfig,
    cluster: ClusterConfig,
    query: QueryConfig | None = None,
    *,
    timeout_s: float = 2.0,
    max_files: int = 5000,
) -> list[Finding]:
    """Check the protections of a running cluster.

    Example:
        >>> for finding in security_report(zk_config, cluster):  # doctest: +SKIP
        ...     print(finding.ok, finding.check, finding.detail)

    Args:
        zookeeper: how this client reaches ZooKeeper (its credentials are the cluster's).
        cluster: the cluster's paths.
        query: the state-query token and TLS settings clients use.
        timeout_s: per probe of a worker's query port.
        max_files: at most this many files and directories are inspected on the shared paths.

    Returns:
        The findings, ZooKeeper first.
    """
    findings = [_auth_finding(zookeeper)]
    try:
        with ZkStore.connect(zookeeper) as store:
            findings.append(_tree_finding(store, zookeeper))
            findings.extend(_query_findings(store, zookeeper, query, timeout_s))
    except CoordinationError as e:
        findings.append(Finding("zookeeper", "the cluster owns its tree", False, str(e)))
    findings.append(_files_finding(cluster, max_files))
    return findings


def _auth_finding(zookeeper: ZooKeeperConfig) -> Finding:
    if zookeeper.auth_credentials():
        return Finding("zookeeper", "digest credentials", True, "every znode the cluster writes carries its digest ACL")
    return Finding(
        "zookeeper",
        "digest credentials",
        False,
        "none: any client that reaches ZooKeeper can rewrite /storms and the assignments (choose the code workers "
        "run). Give the cluster credentials with --zk-auth-file (see deployments/cluster/README.md)",
    )


def _tree_finding(store: ZkStore, zookeeper: ZooKeeperConfig) -> Finding:
    if not zookeeper.auth_credentials():
        return Finding("zookeeper", "the cluster owns its tree", False, f"{zookeeper.chroot} is open to everyone")
    mismatches = audit_acls(store)
    if mismatches:
        shown = "; ".join(str(m) for m in mismatches[:3]) + (" ..." if len(mismatches) > 3 else "")
        return Finding(
            "zookeeper",
            "the cluster owns its tree",
            False,
            f"{len(mismatches)} znode(s) without the cluster ACL: {shown}. Run `stream-ops secure-tree` if they are "
            "the cluster's own",
        )
    return Finding(
        "zookeeper", "the cluster owns its tree", True, f"every znode under {zookeeper.chroot} carries the cluster ACL"
    )


def _query_findings(store: ZkStore, zookeeper: ZooKeeperConfig, query: QueryConfig | None, timeout_s: float) -> Iterator[Finding]:
    config = query or QueryConfig()
    token = query_token(config, zookeeper)
    yield Finding(
        "query port",
        "bearer token",
        token is not None,
        "queries carry a token (explicit or derived from the ZooKeeper digest)"
        if token is not None
        else "none: anyone who reaches a worker's port reads its state; configure --zk-auth or --query-token-file",
    )
    yield Finding(
        "query port",
        "TLS",
        config.tls_ca is not None,
        f"clients verify workers against {config.tls_ca}"
        if config.tls_ca is not None
        else "off: tokens and state cross the network in clear text (--query-tls-cert/--query-tls-key/--query-tls-ca)",
    )
    access = QueryAccess.resolve(zookeeper, config)
    for worker_id, record in sorted(live_workers(store).items()):
        yield _probe_worker(worker_id, f"{access.scheme}://{record.host}:{record.port}", access.tls, timeout_s)


def _probe_worker(worker_id: str, base_url: str, tls: ssl.SSLContext | None, timeout_s: float) -> Finding:
    """Ask a worker's query port for state without a token: only 401 means it is protected."""
    check = f"worker {worker_id} refuses queries without a token"
    try:
        with urllib.request.urlopen(f"{base_url}/query?topology=doctor&task=0&keys=[]", timeout=timeout_s, context=tls):
            status = 200
    except urllib.error.HTTPError as e:
        status = e.code
    except (urllib.error.URLError, OSError) as e:
        return Finding("query port", check, False, f"{base_url} could not be probed: {getattr(e, 'reason', e)}")
    if status == 401:
        return Finding("query port", check, True, f"{base_url} answers 401 without a token")
    return Finding("query port", check, False, f"{base_url} answers {status} without a token: its state is readable by anyone")


def _files_finding(cluster: ClusterConfig, max_files: int) -> Finding:
    roots = [cluster.resolved_dist_dir(), cluster.resolved_topics_root(), cluster.resolved_checkpoints_root()]
    loose: list[str] = []
    seen = 0
    for path in _walk(roots, max_files):
        seen += 1
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(mode):
            loose.append(f"{path} (symlink)")
        elif mode & _LOOSE_FILE_BITS:
            loose.append(f"{path} ({stat.filemode(mode)})")
    if loose:
        shown = ", ".join(loose[:3]) + (" ..." if len(loose) > 3 else "")
        return Finding(
            "files",
            "data files 0640 / directories 0750",
            False,
            f"{len(loose)} of {seen} paths allow group writes or access by others, or are symlinks: {shown}. "
            "They were created before the cluster's umask (ClusterConfig.umask, 0o027) applied; chmod them",
        )
    return Finding(
        "files", "data files 0640 / directories 0750", True, f"{seen} paths under the dist store, topics and checkpoints checked"
    )


def _walk(roots: list[Path], limit: int) -> Iterator[Path]:
    count = 0
    for root in roots:
        if not root.exists():
            continue
        for directory, dirs, files in os.walk(root):
            for name in [*dirs, *files]:
                if count >= limit:
                    return
                count += 1
                yield Path(directory) / name
