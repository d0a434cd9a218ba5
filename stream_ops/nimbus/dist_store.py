"""The dist store (Storm's ``stormdist``): plan, conf and code archive of each submission.

Workers never import the user's topology object. They read ``plan.json`` and import the
user functions named in it from ``code.zip`` (see :mod:`stream_ops.nimbus.code_archive`).

Integrity: at submission, ``manifest.json`` lists the sha256 of ``plan.json``, ``conf.json``
and ``code.zip`` and the topology id; the sha256 of the manifest, the submission's
*integrity root*, is recorded in ``/storms/{id}`` (``StormRecord.submission_sha256``).
:func:`load_submission` is the only way to read a submission: it finds the entry where the
reader's own dist store keeps it, checks the root, the manifest and every file, and parses
only the bytes it checked. Whoever can write the shared path but not ZooKeeper cannot make a
worker run anything; whoever can write ZooKeeper but not the dist store cannot point a worker
elsewhere.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stream_ops.coordination.records import StormRecord
from stream_ops.durable_files import DIR_MODE, FILE_MODE, fsync_dir, make_dirs
from stream_ops.errors import SubmissionError, SubmissionIntegrityError, TopologyLoadError
from stream_ops.nimbus.code_archive import archive_modules
from stream_ops.topology.plan import Plan
from stream_ops.topology.plan_code import bound_places, check_references

logger = logging.getLogger(__name__)

PLAN_FILE = "plan.json"
CONF_FILE = "conf.json"
CODE_FILE = "code.zip"
MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "stream-ops-submission/1"
_SUBMITTED_FILES = (CODE_FILE, CONF_FILE, PLAN_FILE)
_TOPOLOGY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest_bytes(topology_id: str, hashes: dict[str, str]) -> bytes:
    """The canonical manifest of a submission (its sha256 is the integrity root).

    Example:
        >>> manifest_bytes("wc-1-1700000000", {"code.zip": "a", "conf.json": "b", "plan.json": "c"})[:40]
        b'{"files":{"code.zip":"a","conf.json":"b"'
    """
    document = {"files": dict(sorted(hashes.items())), "format": MANIFEST_FORMAT, "topology_id": topology_id}
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode("utf-8")


@dataclass(frozen=True)
class WrittenSubmission:
    """What :func:`write_submission` stored: the hashes to record in ``/storms/{id}``."""

    submission_sha256: str
    """The integrity root: sha256 of ``manifest.json``."""
    code_sha256: str


def write_submission(
    dist_dir: Path, plan: Plan, conf: dict[str, Any], code: bytes, *, topology_id: str | None = None
) -> WrittenSubmission:
    """Store plan, conf, code and their manifest under ``dist_dir`` (a new directory).

    Args:
        dist_dir: ``<dist store>/<topology id>``.
        topology_id: The id the manifest binds the files to; defaults to ``dist_dir.name``.

    Raises:
        SubmissionError: ``dist_dir`` exists already or cannot be written.
    """
    topology_id = topology_id or dist_dir.name
    if bound_places(plan):
        raise SubmissionError("a plan bound to a worker's code archive cannot be submitted; submit the topology's own plan")
    files = {
        PLAN_FILE: plan.to_json().encode("utf-8"),
        CONF_FILE: json.dumps(conf, indent=2, sort_keys=True).encode("utf-8"),
        CODE_FILE: code,
    }
    hashes = {name: sha256_hex(data) for name, data in files.items()}
    manifest = manifest_bytes(topology_id, hashes)
    try:
        make_dirs(dist_dir.parent)
        dist_dir.mkdir(mode=DIR_MODE)  # 0750 whatever the caller's umask (a submit from Dagster, a script)
    except FileExistsError as e:
        raise SubmissionError(f"dist store entry {dist_dir} already exists; topology ids must be unique") from e
    except OSError as e:
        raise SubmissionError(f"cannot create dist store entry {dist_dir}: {e}") from e
    try:
        for name, data in (*files.items(), (MANIFEST_FILE, manifest)):
            _write_new(dist_dir / name, data)
        fsync_dir(dist_dir)
    except OSError as e:
        raise SubmissionError(f"cannot write the dist store entry {dist_dir}: {e}") from e
    return WrittenSubmission(submission_sha256=sha256_hex(manifest), code_sha256=hashes[CODE_FILE])


@dataclass(frozen=True)
class VerifiedSubmission:
    """A submission whose every byte matched its integrity root; parsed from those bytes."""

    topology_id: str
    submission_sha256: str
    dist_dir: Path
    plan: Plan
    """As submitted: not bound to any code archive; every reference names the archive or stream_ops."""
    conf: dict[str, Any]
    code: bytes
    code_sha256: str
    modules: tuple[str, ...]
    """Top-level modules of the code archive."""


def submission_dir(dist_root: Path | None, record: StormRecord) -> Path:
    """Where a reader finds a submission: ``<its own dist store>/<topology id>``.

    Args:
        dist_root: The reader's configured dist store (``ClusterConfig.resolved_dist_dir()``);
            None only for readers without one (a state-query client), which then use the
            record's ``dist_dir`` (the integrity root still protects the content).

    Raises:
        SubmissionIntegrityError: The topology id is not a plain name, or the record names
            another dist store entry than the reader's.
    """
    topology_id = record.topology_id
    if not _TOPOLOGY_ID.fullmatch(topology_id) or topology_id in (".", ".."):
        raise SubmissionIntegrityError(f"topology id {topology_id!r} in /storms is not a plain name; refusing to load it")
    if dist_root is None:
        return Path(record.dist_dir)
    location = dist_root / topology_id
    if Path(record.dist_dir).resolve() != location.resolve():
        raise SubmissionIntegrityError(
            f"/storms/{topology_id} names dist directory {record.dist_dir}, but this process's dist store keeps "
            f"{topology_id} at {location}; it loads submissions only from its own dist store. If the record was "
            "not rewritten, give this process the submitter's dist store (the same --home, or ClusterConfig.dist_dir)"
        )
    return location


def load_submission(dist_root: Path | None, record: StormRecord) -> VerifiedSubmission:
    """Verify a submission against the integrity root in its record, then parse it.

    Order: the location (:func:`submission_dir`); the manifest's sha256 against the record;
    the manifest's topology id; each file's sha256 against the manifest; then, and only then,
    ``plan.json``, ``conf.json`` and the archive's member list are parsed from the verified
    bytes, and every code reference of the plan is checked to name the archive or stream_ops.

    Raises:
        SubmissionIntegrityError: A file (or the record) was changed after submission; the
            message names the file and both hashes.
        TopologyLoadError: The verified plan or archive cannot be used (a reference outside
            the archive, bytecode or an unsafe name in the archive).

    Example:
        >>> submission = load_submission(cluster.resolved_dist_dir(), read_storm(store, topology_id))
        >>> submission.plan.topology
        'wordcount'
    """
    dist_dir = submission_dir(dist_root, record)
    expected = record.submission_sha256
    manifest = _read(dist_dir / MANIFEST_FILE)
    actual = sha256_hex(manifest)
    if actual != expected:
        raise SubmissionIntegrityError(
            f"{dist_dir / MANIFEST_FILE} has sha256 {actual}, but {expected} was recorded in /storms/"
            f"{record.topology_id} at submission; the dist store entry (or the record) was modified after "
            "submission: resubmit the topology"
        )
    hashes = _manifest_hashes(manifest, record.topology_id, dist_dir)
    verified: dict[str, bytes] = {}
    for name in _SUBMITTED_FILES:
        data = _read(dist_dir / name)
        actual = sha256_hex(data)
        if actual != hashes[name]:
            raise SubmissionIntegrityError(
                f"{dist_dir / name} has sha256 {actual}, but {hashes[name]} was submitted; it was modified after "
                "submission: resubmit the topology"
            )
        verified[name] = data
    try:
        plan = Plan.from_json(verified[PLAN_FILE])
        conf = json.loads(verified[CONF_FILE])
    except ValueError as e:
        raise TopologyLoadError(f"the verified plan or conf of {record.topology_id} does not parse: {e}") from e
    places = bound_places(plan)
    if places:
        raise TopologyLoadError(
            f"plan.json of {record.topology_id} carries code bindings ({', '.join(places)}), which only workers add; "
            "it was not written by stream-ops submit: resubmit the topology"
        )
    modules = archive_modules(verified[CODE_FILE])
    check_references(plan, modules)
    logger.debug("verified submission %s (root %s)", record.topology_id, expected[:16])
    return VerifiedSubmission(
        topology_id=record.topology_id,
        submission_sha256=expected,
        dist_dir=dist_dir,
        plan=plan,
        conf=conf if isinstance(conf, dict) else {},
        code=verified[CODE_FILE],
        code_sha256=hashes[CODE_FILE],
        modules=modules,
    )


def _manifest_hashes(manifest: bytes, topology_id: str, dist_dir: Path) -> dict[str, str]:
    try:
        document = json.loads(manifest)
        files = document["files"]
        ok = document.get("format") == MANIFEST_FORMAT and set(files) == set(_SUBMITTED_FILES)
    except (ValueError, KeyError, TypeError, AttributeError):
        ok = False
    if not ok:
        raise SubmissionIntegrityError(f"{dist_dir / MANIFEST_FILE} is not a {MANIFEST_FORMAT} manifest; resubmit the topology")
    if document.get("topology_id") != topology_id:
        raise SubmissionIntegrityError(
            f"{dist_dir / MANIFEST_FILE} belongs to submission {document.get('topology_id')!r}, not {topology_id!r}: "
            f"/storms/{topology_id} was pointed at another submission; resubmit the topology"
        )
    return {name: str(files[name]) for name in _SUBMITTED_FILES}


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise SubmissionIntegrityError(
            f"cannot read {path}: {e.strerror or e}; is the dist store shared with this process, and the submission complete?"
        ) from e


def _write_new(path: Path, data: bytes) -> None:
    """Create ``path`` (never through an existing name or symlink) with ``data``, synced."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), FILE_MODE)
    with os.fdopen(fd, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
