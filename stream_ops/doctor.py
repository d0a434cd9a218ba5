"""``stream-ops doctor``: what protects a running cluster, checked against the live system.

Each finding names one protection of the threat model (docs/operations.md, section 6 "Security"):
ZooKeeper credentials and the cluster's ownership of its tree, authentication and TLS of the
workers' state-query ports, and the files on the shared paths. The report only reads; it
changes nothing.

A finding is ``ok`` (in place), ``warn`` (off by a choice the deployment may make, e.g. TLS
on a private network, or a check that could not cover everything) or ``fail`` (missing); only
a failure makes the CLI exit non-zero.

Files. Each root (home, dist store, topics, checkpoints, local state) is looked up from ``/``
as the kernel would: every directory on the way, symbolic links followed, must be owned by the
user running doctor (the cluster's) or root and writable by no one else (a sticky directory
such as ``/tmp`` is fine), and the root itself must be such a directory with the cluster's
modes. Below the roots, paths are sampled breadth first and in turn from each walked root
(at most ``max_files`` in all), so each root is covered however large another is; roots the
cap cut short are named in a warning.
"""

from __future__ import annotations

import logging
import os
import pwd
import ssl
import stat
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from stream_ops.config import ClusterConfig, QueryConfig, ZooKeeperConfig, query_token
from stream_ops.coordination.acl import audit_acls
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import CoordinationError
from stream_ops.nimbus.assignment import live_workers
from stream_ops.runtime.query_client import QueryAccess

logger = logging.getLogger(__name__)

Status = Literal["ok", "warn", "fail"]

DEFAULT_MAX_FILES = 5000
"""Paths inspected below the roots unless told otherwise (each lstat is one system call)."""

_MAX_LINK_HOPS = 40
"""Symbolic links followed in one lookup before it is given up (the kernel's limit)."""


@dataclass(frozen=True)
class Finding:
    """One checked protection.

    Attributes:
        area: ``zookeeper``, ``query port`` or ``files``.
        check: what was checked.
        status: ``ok`` (in place), ``warn`` (off by the deployment's choice, or checked only in
            part) or ``fail`` (missing).
        detail: what was found, and what to do when it is not in place.
    """

    area: str
    check: str
    status: Status
    detail: str

    @property
    def ok(self) -> bool:
        """Whether the protection is in place (a warning is not)."""
        return self.status == "ok"

    @property
    def failed(self) -> bool:
        """Whether the protection is missing: what makes ``stream-ops doctor`` exit 1."""
        return self.status == "fail"

    def to_json_obj(self) -> dict[str, Any]:
        """``area``, ``check``, ``ok``, ``status`` and ``detail``."""
        return {"area": self.area, "check": self.check, "ok": self.ok, "status": self.status, "detail": self.detail}


def security_report(
    zookeeper: ZooKeeperConfig,
    cluster: ClusterConfig,
    query: QueryConfig | None = None,
    *,
    timeout_s: float = 2.0,
    max_files: int = DEFAULT_MAX_FILES,
) -> list[Finding]:
    """Check the protections of a running cluster.

    Example:
        >>> for finding in security_report(zk_config, cluster):  # doctest: +SKIP
        ...     print(finding.status, finding.check, finding.detail)

    Args:
        zookeeper: how this client reaches ZooKeeper (its credentials are the cluster's).
        cluster: the cluster's paths and umask.
        query: the state-query token and TLS settings clients use.
        timeout_s: per probe of a worker's query port.
        max_files: at most this many paths below the roots are inspected, shared among the
            roots; 0 inspects all.

    Returns:
        The findings, ZooKeeper first.
    """
    findings = [_auth_finding(zookeeper)]
    try:
        with ZkStore.connect(zookeeper) as store:
            findings.append(_tree_finding(store, zookeeper))
            findings.extend(_query_findings(store, zookeeper, query, timeout_s))
    except CoordinationError as e:
        findings.append(Finding("zookeeper", "the cluster owns its tree", "fail", str(e)))
    findings.extend(file_findings(cluster, max_files))
    return findings


def _auth_finding(zookeeper: ZooKeeperConfig) -> Finding:
    if zookeeper.auth_credentials():
        return Finding("zookeeper", "digest credentials", "ok", "every znode the cluster writes carries its digest ACL")
    return Finding(
        "zookeeper",
        "digest credentials",
        "fail",
        "none: any client that reaches ZooKeeper can rewrite /storms and the assignments (choose the code workers "
        "run). Give the cluster credentials with --zk-auth-file (see deployments/cluster/README.md)",
    )


def _tree_finding(store: ZkStore, zookeeper: ZooKeeperConfig) -> Finding:
    if not zookeeper.auth_credentials():
        return Finding("zookeeper", "the cluster owns its tree", "fail", f"{zookeeper.chroot} is open to everyone")
    mismatches = audit_acls(store)
    if mismatches:
        shown = "; ".join(str(m) for m in mismatches[:3]) + (" ..." if len(mismatches) > 3 else "")
        return Finding(
            "zookeeper",
            "the cluster owns its tree",
            "fail",
            f"{len(mismatches)} znode(s) without the cluster ACL: {shown}. Run `stream-ops secure-tree` if they are "
            "the cluster's own",
        )
    return Finding(
        "zookeeper", "the cluster owns its tree", "ok", f"every znode under {zookeeper.chroot} carries the cluster ACL"
    )


def _query_findings(store: ZkStore, zookeeper: ZooKeeperConfig, query: QueryConfig | None, timeout_s: float) -> Iterator[Finding]:
    config = query or QueryConfig()
    token = query_token(config, zookeeper)
    yield Finding(
        "query port",
        "bearer token",
        "ok" if token is not None else "fail",
        "queries carry a token (explicit or derived from the ZooKeeper digest)"
        if token is not None
        else "none: anyone who reaches a worker's port reads its state; configure --zk-auth or --query-token-file",
    )
    # Optional by design: on a private network the token is what keeps state private.
    yield Finding(
        "query port",
        "TLS",
        "ok" if config.tls_ca is not None else "warn",
        f"clients verify workers against {config.tls_ca}"
        if config.tls_ca is not None
        else "off: queries, their bearer token and the state workers return cross the network in clear text, so "
        "whoever can watch the traffic between clients and workers reads them and, with the token, can query every "
        "worker. Fine on a private network; otherwise --query-tls-cert/--query-tls-key/--query-tls-ca "
        "(deployments/cluster/README.md)",
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
        return Finding("query port", check, "fail", f"{base_url} could not be probed: {getattr(e, 'reason', e)}")
    if status == 401:
        return Finding("query port", check, "ok", f"{base_url} answers 401 without a token")
    return Finding("query port", check, "fail", f"{base_url} answers {status} without a token: its state is readable by anyone")


# --- files -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Policy:
    """What the cluster's files must not allow, and who may own them."""

    loose_bits: int
    owners: frozenset[int]

    @classmethod
    def of(cls, cluster: ClusterConfig) -> _Policy:
        # Group and others never write; the umask takes more (others' access by default).
        return cls(loose_bits=(cluster.umask | 0o022) & 0o077, owners=frozenset({os.geteuid(), 0}))

    def problem(self, st: os.stat_result) -> str | None:
        """What is wrong with a path of the cluster's own, or None."""
        if st.st_uid not in self.owners:
            return f"owned by {_user(st.st_uid)}"
        if st.st_mode & self.loose_bits:
            return stat.filemode(st.st_mode)
        return None

    def chmod_advice(self) -> str:
        """``g-w,o-rwx`` for the default umask: what takes the loose bits away."""
        parts = []
        for who, shift in (("g", 3), ("o", 0)):
            bits = (self.loose_bits >> shift) & 0o7
            if bits:
                parts.append(who + "-" + "".join(c for c, b in (("r", 4), ("w", 2), ("x", 1)) if bits & b))
        return ",".join(parts)


@dataclass
class _Root:
    """One root of the cluster's files and what its lookup found."""

    kind: str
    path: Path
    walk: bool
    resolved: Path | None = None
    problems: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)


def file_findings(cluster: ClusterConfig, max_files: int = DEFAULT_MAX_FILES) -> list[Finding]:
    """The ``files`` findings: one per root, then one for the paths below the walked roots.

    Args:
        cluster: the cluster's paths and umask.
        max_files: at most this many paths below the roots are inspected, taken in turn from
            each root; 0 inspects all.
    """
    policy = _Policy.of(cluster)
    roots = _roots(cluster)
    findings = [_root_finding(root, policy) for root in roots]
    walked = [root for root in roots if root.walk and root.resolved is not None and not root.problems]
    skipped = [root.kind for root in roots if root.walk and root.problems]
    findings.append(_paths_finding(walked, skipped, policy, max_files))
    return findings


def _roots(cluster: ClusterConfig) -> list[_Root]:
    candidates = [
        _Root("home", cluster.root, walk=False),
        _Root("dist", cluster.resolved_dist_dir(), walk=True),
        _Root("topics", cluster.resolved_topics_root(), walk=True),
        _Root("checkpoints", cluster.resolved_checkpoints_root(), walk=True),
        _Root("local state", cluster.resolved_local_state_dir(), walk=True),
    ]
    seen: set[str] = set()
    roots = []
    for root in candidates:
        key = os.path.abspath(root.path)
        if key not in seen:
            seen.add(key)
            roots.append(root)
    return roots


def _root_finding(root: _Root, policy: _Policy) -> Finding:
    check = f"{root.kind} root"
    exists = _look_up(root, policy)
    shown = f"{root.path}" + "".join(f" -> {link}" for link in root.links)
    if root.problems:
        problems = list(dict.fromkeys(root.problems))  # a directory passed twice (a link, "..") counts once
        return Finding(
            "files",
            check,
            "fail",
            f"{shown}: {'; '.join(problems)}. Another user could read or replace the cluster's files there: "
            f"make each directory on the way owned by the cluster's user (or root) and not writable by others "
            f"(chmod {policy.chmod_advice()}); doctor takes the user it runs as for the cluster's",
        )
    if not exists:
        return Finding("files", check, "ok", f"{shown} does not exist yet; every directory above it is the cluster's or root's")
    assert root.resolved is not None
    mode = stat.filemode(root.resolved.lstat().st_mode)
    return Finding("files", check, "ok", f"{shown} is {mode}, and every directory above it is the cluster's or root's")


def _look_up(root: _Root, policy: _Policy) -> bool:
    """Follow ``root.path`` from ``/`` as the kernel would, recording in ``root`` every
    directory on the way that someone else could change; returns whether the root exists."""
    pending = list(Path(os.path.abspath(root.path)).parts[1:])
    current = Path("/")
    _check_directory_on_the_way(current, policy, root.problems)
    hops = 0
    while pending:
        name = pending.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            current = current.parent
            continue
        candidate = current / name
        try:
            st = candidate.lstat()
        except FileNotFoundError:
            return False
        except OSError as e:
            root.problems.append(f"{candidate} cannot be inspected ({e.strerror})")
            return False
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if hops > _MAX_LINK_HOPS:
                root.problems.append(f"{candidate}: more than {_MAX_LINK_HOPS} symbolic links")
                return False
            if st.st_uid not in policy.owners:
                root.problems.append(f"the symbolic link {candidate} is owned by {_user(st.st_uid)}")
            target = Path(os.readlink(candidate))
            root.links.append(str(target))
            if target.is_absolute():
                current = Path("/")
                pending = list(target.parts[1:]) + pending
            else:
                pending = list(target.parts) + pending
            continue
        if not stat.S_ISDIR(st.st_mode):
            root.problems.append(f"{candidate} is not a directory")
            return False
        current = candidate
        if pending:
            _check_directory_on_the_way(current, policy, root.problems)
        else:
            problem = policy.problem(st)
            if problem is not None:
                root.problems.append(f"{current} is {problem}")
    root.resolved = current
    return True


def _check_directory_on_the_way(directory: Path, policy: _Policy, problems: list[str]) -> None:
    """A directory above a root: whoever owns it or can write it can replace what is below."""
    st = directory.lstat()
    if st.st_uid not in policy.owners:
        problems.append(f"{directory} (above it) is owned by {_user(st.st_uid)}")
    elif st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        problems.append(f"{directory} (above it) is {stat.filemode(st.st_mode)}: writable by others")


def _paths_finding(roots: list[_Root], skipped: list[str], policy: _Policy, max_files: int) -> Finding:
    check = f"data files {0o666 & ~policy.loose_bits:04o} / directories {0o777 & ~policy.loose_bits:04o}"
    walkers = {root.kind: _breadth_first(root.resolved) for root in roots if root.resolved is not None}
    counts = dict.fromkeys(walkers, 0)
    loose: dict[str, list[str]] = {kind: [] for kind in walkers}
    total = 0
    active = list(walkers)
    while active and (max_files <= 0 or total < max_files):
        for kind in list(active):
            if 0 < max_files <= total:
                break
            item = next(walkers[kind], None)
            if item is None:
                active.remove(kind)
                continue
            total += 1
            counts[kind] += 1
            path, st, unreadable = item
            problem = "symlink" if st is not None and stat.S_ISLNK(st.st_mode) else unreadable
            if problem is None and st is not None:
                problem = policy.problem(st)
            if problem is not None:
                loose[kind].append(f"{path} ({problem})")
    unreached = [kind for kind in active if next(walkers[kind], None) is not None]
    covered = ", ".join(f"{kind} {counts[kind]}" + (" (cut short)" if kind in unreached else "") for kind in walkers)
    summary = f"{total} paths checked ({covered or 'no roots to walk'})"
    if skipped:
        summary += f" (not walked: {', '.join(skipped)}, whose root fails)"
    cut = ""
    if unreached:
        cut = (
            f"; the cap of {max_files} paths was reached before the rest of {', '.join(unreached)} was checked: "
            "run doctor --max-files 0 to check every path"
        )
    found = sum(len(paths) for paths in loose.values())
    if found:
        # The first two of each root: a loose checkpoint is not hidden behind a thousand topic files.
        shown = "; ".join(
            f"{kind}: {', '.join(paths[:2])}" + (f" and {len(paths) - 2} more" if len(paths) > 2 else "")
            for kind, paths in loose.items()
            if paths
        )
        return Finding(
            "files",
            check,
            "fail",
            f"{found} of {summary} allow group writes or access by others, belong to another user, are symlinks "
            f"or cannot be read: {shown}. chmod -R {policy.chmod_advice()} them (what stream_ops and Spark create from "
            f"then on has the cluster's modes by itself){cut}",
        )
    if unreached:
        return Finding("files", check, "warn", f"none loose among {summary}{cut}")
    return Finding("files", check, "ok", f"{summary}: none allow group writes or access by others")


def _breadth_first(root: Path) -> Iterator[tuple[Path, os.stat_result | None, str | None]]:
    """Every path below ``root``, shallow ones first (a cap keeps a sample of every directory
    level, not the whole of the first subtree): (path, its lstat, why it could not be read)."""
    queue = deque([root])
    while queue:
        directory = queue.popleft()
        try:
            scanned = os.scandir(directory)
        except FileNotFoundError:
            continue
        except OSError as e:
            yield directory, None, f"cannot be listed: {e.strerror}"
            continue
        with scanned:  # read as consumed: a huge directory is not held in memory past the cap
            for entry in scanned:
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                except OSError as e:
                    yield Path(entry.path), None, f"cannot be inspected: {e.strerror}"
                    continue
                yield Path(entry.path), st, None
                if stat.S_ISDIR(st.st_mode):
                    queue.append(Path(entry.path))


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
