"""The code archive of a submission (``code.zip``): the modules a plan's references live in.

Rule: every top-level module or package a plan references is shipped, wherever it is
installed (a checkout, site-packages), except ``stream_ops`` itself, which every worker has.
Workers resolve a plan's references only inside the verified archive or stream_ops
(:class:`~stream_ops.topology.code_scope.CodeScope`), so what a worker runs is exactly what
was submitted, never a version installed on the worker.

What is shipped: the ``.py`` files of each package, with their file modes; never
``__pycache__``/``.pyc`` (workers compile the verified source), nor ``.git``, ``.venv`` or
``node_modules``. Refused at submit, naming the file or module: a symlink leaving its
package, compiled extension modules (they cannot be imported from a zip), namespace
packages spread over several directories, and modules named like the standard library.
"""

from __future__ import annotations

import importlib
import io
import logging
import os
import stat
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from types import ModuleType

from stream_ops.errors import SubmissionError, TopologyLoadError
from stream_ops.topology.code_scope import STREAM_OPS_PACKAGE, forbidden_top_level
from stream_ops.topology.plan import Plan
from stream_ops.topology.plan_code import plan_references

logger = logging.getLogger(__name__)

_SKIP_DIRS = frozenset({"__pycache__", ".git", ".venv", "node_modules"})
_EXTENSION_SUFFIXES = (".so", ".pyd", ".dylib")
_BYTECODE_SUFFIXES = (".pyc", ".pyo")


def shipped_modules(plan: Plan) -> dict[str, list[str]]:
    """Top-level module -> the references naming it, for every module the archive must hold."""
    by_module: dict[str, list[str]] = {}
    for reference in plan_references(plan):
        top = reference.module.partition(".")[0]
        if top != STREAM_OPS_PACKAGE:
            by_module.setdefault(top, []).append(reference.ref)
    return dict(sorted(by_module.items()))


def build_code_archive(plan: Plan) -> bytes:
    """Zip every top-level module or package the plan's references name (see the module doc).

    Raises:
        SubmissionError: A referenced module cannot be shipped; the message names it (or the
            offending file) and what to do.

    Example:
        >>> data = build_code_archive(build_plan(my_topology))   # doctest: +SKIP
        >>> archive_modules(data)                                  # doctest: +SKIP
        ('mypkg',)
    """
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, refs in shipped_modules(plan).items():
            problem = forbidden_top_level(name)
            if problem is not None:
                raise SubmissionError(
                    f"the plan references {', '.join(repr(r) for r in sorted(set(refs)))}, in module {name!r}: {problem}. Workers import "
                    "only modules shipped in the code archive and stream_ops: call it from a function of your own package"
                )
            for arcname, path in _module_files(name, _import(name)):
                _add(archive, path, arcname)
    data = buffer.getvalue()
    logger.debug("code archive: %d bytes", len(data))
    return data


def archive_modules(data: bytes) -> tuple[str, ...]:
    """The top-level modules of a code archive, after checking it is one ``build_code_archive`` makes.

    Raises:
        TopologyLoadError: Not a zip, or a member with an unsafe name, bytecode, or a top-level
            name that would replace a standard-library module or stream_ops.
    """
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = archive.namelist()
    except zipfile.BadZipFile as e:
        raise TopologyLoadError(f"the code archive is not a zip file: {e}; resubmit the topology") from e
    modules: set[str] = set()
    for name in names:
        parts = PurePosixPath(name).parts
        if name.startswith("/") or "\\" in name or not parts or any(p in ("", ".", "..") for p in parts):
            raise TopologyLoadError(f"the code archive holds {name!r}, an unsafe member name; resubmit the topology")
        if "__pycache__" in parts or name.endswith(_BYTECODE_SUFFIXES):
            raise TopologyLoadError(
                f"the code archive holds bytecode {name!r}; workers import only source they compile themselves: "
                "resubmit the topology with stream-ops submit"
            )
        if len(parts) == 1 and not name.endswith(".py"):
            raise TopologyLoadError(f"the code archive holds {name!r} at its top level, which is not a Python module")
        top = parts[0][:-3] if len(parts) == 1 else parts[0]
        problem = forbidden_top_level(top)
        if problem is not None:
            raise TopologyLoadError(f"the code archive ships a top-level module {top!r}: {problem}; resubmit the topology")
        modules.add(top)
    return tuple(sorted(modules))


def _import(name: str) -> ModuleType:
    module = sys.modules.get(name)
    if module is not None:
        return module
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise SubmissionError(f"cannot import {name!r} to ship it in the code archive: {e}") from e


def _module_files(name: str, module: ModuleType) -> Iterator[tuple[str, Path]]:
    """(name in the archive, file) for every file of a top-level module or package."""
    locations = list(getattr(module, "__path__", None) or [])
    if locations:
        if len(locations) != 1:
            raise SubmissionError(
                f"package {name!r} is a namespace package spread over {locations}; workers import it from one "
                "archive directory: give it an __init__.py in one place"
            )
        root = Path(locations[0])
        if not root.is_dir():
            raise SubmissionError(
                f"package {name!r} was imported from {root}, not from a source directory; submit from an environment "
                "that imports it from its source (a checkout or an installed package)"
            )
        yield from _package_files(name, root)
        return
    file = getattr(module, "__file__", None)
    if not file:
        raise SubmissionError(f"module {name!r} is built into Python; it cannot be shipped: call it from your own package")
    path = Path(file)
    if not path.is_file():
        raise SubmissionError(f"module {name!r} was imported from {path}, not from a source file; submit from its source")
    if path.suffix != ".py":
        raise SubmissionError(
            f"module {name!r} ({path}) is not Python source (compiled extensions cannot be imported from the code "
            "archive): install it on every worker and call it from a function of your own package"
        )
    if path.is_symlink():
        raise SubmissionError(
            f"module {name!r} is {path}, a symlink to {path.resolve()}; ship the file itself (copy it in place of the link)"
        )
    yield f"{name}.py", path


def _package_files(name: str, root: Path) -> Iterator[tuple[str, Path]]:
    """The ``.py`` files under a package directory; symlinks may not leave it."""
    real_root = root.resolve()
    seen = {real_root}
    pending = [root]
    while pending:
        directory = pending.pop()
        for entry in sorted(os.scandir(directory), key=lambda e: e.name):
            path = Path(entry.path)
            relative = path.relative_to(root)
            is_dir = entry.is_dir()  # follows symlinks
            if is_dir and entry.name in _SKIP_DIRS:
                continue
            shipped = is_dir or entry.name.endswith(".py")
            if entry.is_symlink() and shipped:
                target = path.resolve()
                if not target.is_relative_to(real_root):
                    raise SubmissionError(
                        f"{path} in package {name!r} is a symlink to {target}, outside the package ({real_root}); "
                        "nothing outside a package is shipped: copy the file into the package or remove the link"
                    )
            if is_dir:
                real = path.resolve()
                if real not in seen:  # a link to a directory of the package: its files ship once more by this name
                    seen.add(real)
                    pending.append(path)
                continue
            if entry.name.endswith(_EXTENSION_SUFFIXES):
                raise SubmissionError(
                    f"package {name!r} contains the compiled extension {path}, which cannot be imported from the code "
                    "archive: install that package on every worker and call it from a function of your own package"
                )
            if entry.name.endswith(".py") and entry.is_file():
                yield str(PurePosixPath(name, *relative.parts)), path


def _add(archive: zipfile.ZipFile, path: Path, arcname: str) -> None:
    """Add one file with its permission bits (setuid/setgid/sticky dropped)."""
    info = zipfile.ZipInfo.from_file(path, arcname)
    mode = stat.S_IMODE(path.stat().st_mode) & 0o777
    info.external_attr = (stat.S_IFREG | mode) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    archive.writestr(info, path.read_bytes())
