"""Import a submission's modules from its own verified archive, in any process.

``sys.modules`` is shared by everything in a process: a worker's driver process runs the
tasks of every topology assigned to it, and Spark reuses its Python worker processes for
the tasks of every topology (``spark.python.worker.reuse``). Without care, the first
``userpkg`` imported wins: a resubmitted v2 keeps running v1, and two topologies shipping
different packages called ``userpkg`` share one of them.

So a bound reference (see :class:`~stream_ops.topology.code_scope.CodeScope`) is imported
like this, under one process-wide lock:

1. the archive copy this process will import from is checked against the scope's
   ``code_sha256`` (once per process): in a Spark Python worker the copy Spark shipped
   (``SparkFiles``), in the worker's driver its private copy;
2. every ``sys.modules`` entry under one of the archive's top-level names that this scope
   did not import itself (another submission's, an installed package's) is removed, and the
   modules this scope imported before are put back;
3. the module is imported with the archive's top-level names claimed by a meta-path finder
   that loads them from that archive only (``zipimport``: nothing is extracted, no bytecode
   is written, ``sys.path`` order does not matter);
4. what was imported is remembered for the scope, so resolving again (a per-batch updater)
   gives the same classes and module state, never a second copy.

Objects resolved this way keep working while another scope is active: their functions hold
their own module globals. Imports a user function runs at call time, inside its body, go
through the shared ``sys.modules`` and see the scope activated last: import at module level.
A process keeps the modules of every submission it ran until it exits.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.machinery
import logging
import os
import sys
import threading
import zipimport
from collections.abc import Iterator, Sequence
from types import ModuleType

from stream_ops.errors import TopologyLoadError
from stream_ops.topology.code_scope import STREAM_OPS_PACKAGE, CodeScope

logger = logging.getLogger(__name__)


class _ArchiveFinder(importlib.abc.MetaPathFinder):
    """Finds the claimed top-level names in the claiming archive, for the claiming thread only."""

    def __init__(self) -> None:
        self.claims: dict[str, str] = {}
        self.thread: int | None = None

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if path is not None or self.thread != threading.get_ident():
            return None  # submodules are found through their package's __path__, inside the archive
        archive = self.claims.get(fullname)
        if archive is None:
            return None
        return zipimport.zipimporter(archive).find_spec(fullname)


class ArchiveImports:
    """The process-wide bookkeeping of which scope's modules are in ``sys.modules``."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._finder = _ArchiveFinder()
        self._modules: dict[str, dict[str, ModuleType]] = {}
        self._archives: dict[str, str] = {}
        self._owner: dict[str, str] = {}

    def import_module(self, module_name: str, scope: CodeScope) -> ModuleType:
        """Import ``module_name`` as the archive of ``scope`` defines it (see the module doc).

        Raises:
            TopologyLoadError: The module is outside the scope, the archive copy is missing or
                differs from the verified one, or importing it failed.
        """
        top = module_name.partition(".")[0]
        if top == STREAM_OPS_PACKAGE:
            return importlib.import_module(module_name)
        if top not in scope.modules:
            raise TopologyLoadError(
                f"module {module_name!r} is not in the code archive of submission {scope.digest[:16]} "
                f"(modules {list(scope.modules)}); workers import only submitted code"
            )
        with self._lock:
            archive = self._archive(scope)
            self._activate(scope)
            known = self._modules[scope.digest].get(module_name)
            if known is not None and sys.modules.get(module_name) is known:
                return known  # imported from this archive before: the same module, no scan
            if self._finder not in sys.meta_path:
                sys.meta_path.insert(0, self._finder)
            self._finder.claims = {name: archive for name in scope.modules}
            self._finder.thread = threading.get_ident()
            try:
                return importlib.import_module(module_name)
            except Exception as e:
                raise TopologyLoadError(
                    f"importing {module_name!r} from the code archive of submission {scope.digest[:16]} failed: "
                    f"{type(e).__name__}: {e}"
                ) from e
            finally:
                self._finder.claims = {}
                self._finder.thread = None
                self._remember(scope, archive)

    def _archive(self, scope: CodeScope) -> str:
        """Step 1: the verified local copy of the scope's archive."""
        known = self._archives.get(scope.digest)
        if known is not None:
            return known
        problems = []
        for candidate in _candidates(scope):
            try:
                with open(candidate, "rb") as file:
                    actual = hashlib.file_digest(file, "sha256").hexdigest()
            except OSError as e:
                problems.append(f"{candidate}: {e.strerror or e}")
                continue
            if actual == scope.code_sha256:
                self._archives[scope.digest] = candidate
                logger.info("code archive of submission %s: importing from %s", scope.digest[:16], candidate)
                return candidate
            problems.append(f"{candidate} has sha256 {actual}, not the verified {scope.code_sha256}")
        raise TopologyLoadError(
            f"no verified copy of the code archive of submission {scope.digest[:16]} in this process "
            f"({'; '.join(problems) or 'no candidate'}); the worker restarts the task"
        )

    def _activate(self, scope: CodeScope) -> None:
        """Step 2: only this scope's modules under its top-level names stay in sys.modules."""
        cache = self._modules.setdefault(scope.digest, {})
        tops = set(scope.modules)
        if all(self._owner.get(t) == scope.digest and sys.modules.get(t) is cache.get(t) for t in tops):
            return
        purged = [
            name for name, module in list(sys.modules.items()) if name.partition(".")[0] in tops and cache.get(name) is not module
        ]
        for name in purged:
            sys.modules.pop(name, None)
        sys.modules.update(cache)
        for top in tops:
            self._owner[top] = scope.digest
        if purged:
            logger.debug("submission %s: set aside %d modules of other code: %s", scope.digest[:16], len(purged), purged[:10])

    def _remember(self, scope: CodeScope, archive: str) -> None:
        """Step 4: keep what this scope imported from its archive."""
        cache = self._modules.setdefault(scope.digest, {})
        tops = set(scope.modules)
        prefix = archive + os.sep
        for name, module in list(sys.modules.items()):
            if name.partition(".")[0] in tops and name not in cache:
                origin = getattr(getattr(module, "__spec__", None), "origin", None) or ""
                if origin.startswith(prefix):
                    cache[name] = module


def _candidates(scope: CodeScope) -> Iterator[str]:
    """Where this process may find the scope's archive, the copy Spark shipped first in a Python worker."""
    shipped = _spark_files_copy(scope.file_name)
    if shipped is not None:
        yield shipped
    yield scope.archive


def _spark_files_copy(file_name: str) -> str | None:
    """``SparkFiles.get(file_name)`` inside a Spark task (a Python worker), else None."""
    try:
        from pyspark import SparkFiles, TaskContext
    except ImportError:
        return None
    if TaskContext.get() is None:
        return None
    try:
        path = SparkFiles.get(file_name)
    except Exception:  # noqa: BLE001 - no SparkFiles root here: use the worker's copy
        return None
    return path if os.path.isfile(path) else None


ARCHIVE_IMPORTS = ArchiveImports()
"""This process's bookkeeping: ``sys.modules`` is per process, and so is this."""


def import_in_scope(module_name: str, scope: CodeScope) -> ModuleType:
    """Import ``module_name`` from the verified archive of ``scope`` (stream_ops as installed)."""
    return ARCHIVE_IMPORTS.import_module(module_name, scope)
