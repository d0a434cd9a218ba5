"""The dist store (Storm's ``stormdist``): plan, conf and code archive of each submission.

Workers never import the user's topology object. They read ``plan.json`` and import the
user functions named in it from ``code.zip``, the archive of the packages those functions
live in, whose sha256 is recorded at submission.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import sys
import zipfile
from pathlib import Path
from typing import Any

from stream_ops.errors import SubmissionError, WorkerError
from stream_ops.topology.plan import Plan

logger = logging.getLogger(__name__)

PLAN_FILE = "plan.json"
CONF_FILE = "conf.json"
CODE_FILE = "code.zip"
_SKIP_DIRS = {"__pycache__", ".git", ".venv", "node_modules"}


def _top_level_packages(plan: Plan) -> set[str]:
    names: set[str] = set()
    for stage in plan.stages:
        for op in stage.operations:
            names.add(op.function.partition(":")[0].split(".")[0])
    return names


def _package_root(name: str) -> Path | None:
    module = sys.modules.get(name)
    if module is None:
        return None
    paths = list(getattr(module, "__path__", []) or [])
    if paths:
        return Path(paths[0])
    file = getattr(module, "__file__", None)
    return Path(file) if file else None


def build_code_archive(plan: Plan) -> bytes:
    """Zip the top-level packages holding the plan's user functions.

    Packages installed in site-packages (and stream_ops itself) are left out: workers have
    them installed already.
    """
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in sorted(_top_level_packages(plan)):
            root = _package_root(name)
            if root is None or name == "stream_ops" or "site-packages" in root.parts:
                continue
            if root.is_file():
                archive.write(root, root.name)
                continue
            for path in sorted(root.rglob("*.py")):
                if _SKIP_DIRS.intersection(path.relative_to(root).parts):
                    continue
                archive.write(path, str(Path(name) / path.relative_to(root)))
    return buffer.getvalue()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_submission(dist_dir: Path, plan: Plan, conf: dict[str, Any], code: bytes) -> str:
    """Store plan, conf and code under ``dist_dir``; returns the code archive's sha256."""
    try:
        dist_dir.mkdir(parents=True, exist_ok=False)
    except FileExistsError as e:
        raise SubmissionError(f"dist store entry {dist_dir} already exists; topology ids must be unique") from e
    except OSError as e:
        raise SubmissionError(f"cannot create dist store entry {dist_dir}: {e}") from e
    (dist_dir / PLAN_FILE).write_text(plan.to_json(), encoding="utf-8")
    (dist_dir / CONF_FILE).write_text(json.dumps(conf, indent=2, sort_keys=True), encoding="utf-8")
    (dist_dir / CODE_FILE).write_bytes(code)
    return sha256_hex(code)


def read_plan(dist_dir: Path) -> Plan:
    """The plan of a submission."""
    try:
        return Plan.from_json((dist_dir / PLAN_FILE).read_bytes())
    except OSError as e:
        raise WorkerError(f"cannot read the plan in {dist_dir}: {e}; is the dist store shared with this worker?") from e


def install_code(dist_dir: Path, dest: Path, expected_sha256: str | None) -> Path:
    """Check the code archive's sha256, extract it to ``dest`` and put ``dest`` on sys.path.

    Returns:
        ``<dest>.zip``, a copy of the bytes that were checked, for ``SparkContext.addPyFile``:
        executors must get what was verified, not whatever the shared path holds a moment
        later, and Spark refuses two different files of the same name (every archive in the
        dist store is called ``code.zip``).

    Raises:
        WorkerError: The archive cannot be read, no sha256 was recorded, or it does not match.
    """
    source = dist_dir / CODE_FILE
    if expected_sha256 is None:
        raise WorkerError(
            f"no sha256 was recorded for {source} at submission; refusing to load it unchecked: "
            "resubmit the topology"
        )
    try:
        data = source.read_bytes()
    except OSError as e:
        raise WorkerError(f"cannot read the code archive {source}: {e}; is the dist store shared with this worker?") from e
    actual = sha256_hex(data)
    if actual != expected_sha256:
        raise WorkerError(
            f"code archive {source} has sha256 {actual}, but {expected_sha256} was submitted; "
            "it was modified after submission: resubmit the topology"
        )
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        archive.extractall(dest)
    verified = dest.with_name(f"{dest.name}.zip")
    verified.write_bytes(data)
    if str(dest) not in sys.path:
        sys.path.insert(0, str(dest))
    logger.info("installed code archive %s (%d bytes) at %s", dist_dir.name, len(data), dest)
    return verified
