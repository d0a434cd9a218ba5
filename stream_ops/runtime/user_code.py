"""A worker's way from a ``/storms/{id}`` record to a plan whose code it may run.

1. :func:`~stream_ops.nimbus.dist_store.load_submission` reads the submission from the
   worker's *own* dist store (a record naming another place is refused), verifies plan, conf
   and code against the integrity root in the record and parses only the verified bytes;
2. the verified archive is written into a fresh private directory (``mkdtemp``: 0700, a new
   name every time, created with ``O_EXCL | O_NOFOLLOW``, so nothing planted beforehand is
   used or written through), on local disk: under ``ClusterConfig.local_state_dir`` when it
   is configured, else the system temp directory, never under the shared root; it is removed
   when the process exits. Its name carries its process (:mod:`stream_ops.runtime.owned_dirs`),
   so what a SIGKILLed worker left is removed by the next worker of this user installing code
   in the same place;
3. that copy is shipped to Spark's executors under the same unique name
   (``SparkContext.addPyFile``);
4. the plan is bound to the archive (:func:`~stream_ops.topology.plan_code.bind_plan`): every
   reference resolves in that archive or stream_ops only, imported in isolation from other
   submissions in the driver and in Spark's Python workers alike
   (:mod:`stream_ops.topology.isolation`).
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import stat
import tempfile
import threading
from pathlib import Path

from pyspark.sql import SparkSession

from stream_ops.config import ClusterConfig
from stream_ops.coordination.records import StormRecord
from stream_ops.errors import WorkerError
from stream_ops.nimbus.dist_store import VerifiedSubmission, load_submission
from stream_ops.runtime.owned_dirs import OwnedDirs
from stream_ops.topology.code_scope import CodeScope
from stream_ops.topology.plan import Plan
from stream_ops.topology.plan_code import bind_plan

logger = logging.getLogger(__name__)

CODE_DIRS = OwnedDirs("stream-ops-code")
"""The private code directories: ``stream-ops-code-<submission digest>-<owner>-<random>``."""


def private_code_parent(cluster: ClusterConfig) -> Path:
    """Where a worker creates its private archive directories (local disk, not the shared root)."""
    if cluster.local_state_dir is not None:
        return cluster.local_state_dir / "code"
    return Path(tempfile.gettempdir())


class PrivateArchives:
    """The verified archives this process installed: one fresh private copy per submission.

    The first install under a parent directory removes there the copies of processes that are
    gone (:meth:`OwnedDirs.remove_dead`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._scopes: dict[str, CodeScope] = {}
        self._dirs: list[Path] = []
        self._swept: set[Path] = set()

    def install(self, submission: VerifiedSubmission, parent: Path) -> CodeScope:
        """A private copy of the submission's archive (reused within this process while it exists).

        Raises:
            WorkerError: The private directory or file cannot be created.
        """
        digest = submission.submission_sha256
        with self._lock:
            scope = self._scopes.get(digest)
            if scope is not None and os.path.isfile(scope.archive):
                return scope
            try:
                parent.mkdir(parents=True, exist_ok=True)
                _check_parent(parent)
                if parent not in self._swept:
                    self._swept.add(parent)
                    CODE_DIRS.remove_dead(parent)
                directory = CODE_DIRS.create(parent, digest[:16])
                self._dirs.append(directory)
                archive = directory / f"{directory.name}.zip"
                fd = os.open(archive, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
                with os.fdopen(fd, "wb") as file:
                    file.write(submission.code)
            except OSError as e:
                raise WorkerError(
                    f"cannot write a private copy of the code archive of {submission.topology_id} under {parent}: {e}; "
                    "set a writable local directory (--local-dir / ClusterConfig.local_state_dir)"
                ) from e
            scope = CodeScope(
                digest=digest,
                code_sha256=submission.code_sha256,
                archive=str(archive),
                file_name=archive.name,
                modules=submission.modules,
            )
            self._scopes[digest] = scope
            logger.info(
                "installed the verified code archive of %s (%d bytes, modules %s) at %s",
                submission.topology_id,
                len(submission.code),
                list(submission.modules),
                archive,
            )
            return scope

    def remove_all(self) -> None:
        """Delete every private directory this process created (at exit)."""
        with self._lock:
            for directory in self._dirs:
                shutil.rmtree(directory, ignore_errors=True)
            self._dirs.clear()
            self._scopes.clear()


def _check_parent(parent: Path) -> None:
    """Refuse a parent directory in which someone else could swap our private directory.

    Whoever may rename entries in the parent could replace the verified copy between its
    check and its import: the parent must be a real directory, owned by this user or sticky
    (like /tmp), and not writable by others unless sticky.

    Raises:
        WorkerError: Naming the directory and what to do.
    """
    info = os.lstat(parent)
    sticky = bool(info.st_mode & stat.S_ISVTX)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        problem = "is a symlink or not a directory"
    elif info.st_uid != os.getuid() and not sticky:
        problem = f"belongs to uid {info.st_uid}, not to this worker's user, and is not sticky"
    elif info.st_mode & 0o022 and not sticky:
        problem = f"is writable by others (mode {stat.S_IMODE(info.st_mode):o}) and not sticky"
    else:
        return
    raise WorkerError(
        f"{parent} {problem}, so others could replace the code this worker verified; use a local directory "
        "only this user can write (--local-dir / ClusterConfig.local_state_dir)"
    )


PRIVATE_ARCHIVES = PrivateArchives()
atexit.register(PRIVATE_ARCHIVES.remove_all)


def load_user_code(cluster: ClusterConfig, storm: StormRecord, spark: SparkSession) -> Plan:
    """Verify, install and ship a submission's code; the plan bound to it (see the module doc).

    Raises:
        SubmissionIntegrityError: The submission is not what was submitted, or not in this
            worker's dist store.
        TopologyLoadError: The plan references code outside its archive and stream_ops.
        WorkerError: The private copy cannot be written.

    Example:
        >>> plan = load_user_code(cluster, read_storm(store, topology_id), spark)
        >>> plan.code.modules
        ('userpkg',)
    """
    submission = load_submission(cluster.resolved_dist_dir(), storm)
    scope = PRIVATE_ARCHIVES.install(submission, private_code_parent(cluster))
    if submission.modules:
        spark.sparkContext.addPyFile(scope.archive)
    return bind_plan(submission.plan, scope)
