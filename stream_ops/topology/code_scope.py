"""Which submitted code a plan's references resolve in: one verified code archive.

A worker binds every reference of a verified plan to a :class:`CodeScope` (see
:mod:`stream_ops.topology.plan_code`). A bound reference resolves only to a module of that
archive or to ``stream_ops`` itself, and is imported from the archive, never from whatever
``sys.path`` or ``sys.modules`` holds (see :mod:`stream_ops.topology.isolation`).
"""

from __future__ import annotations

import sys

from pydantic import BaseModel, ConfigDict

STREAM_OPS_PACKAGE = "stream_ops"
"""References into stream_ops itself resolve against the installed package."""
CODE_KEY = "code"
"""Key of the :class:`CodeScope` in an object reference bound by a worker
(``{"class": "module:qualname", "args": ..., "code": ...}``); never in plan.json."""


class CodeScope(BaseModel):
    """A verified code archive as the processes that import from it see it.

    Attributes:
        digest: The submission's integrity root (sha256 over plan, conf and code); one scope,
            one set of imported modules, per submission.
        code_sha256: sha256 of the archive's bytes; every process checks its copy against it
            before importing from it.
        archive: Absolute path of the worker's private copy of the archive (0700 directory).
        file_name: Name of the copy shipped to Spark executors (``SparkContext.addPyFile``);
            Python workers find it with ``SparkFiles.get(file_name)``.
        modules: Top-level modules and packages of the archive: the only modules (besides
            stream_ops) a bound reference may name.

    Example:
        >>> scope = CodeScope(digest="ab" * 32, code_sha256="cd" * 32, archive="/tmp/c/code.zip",
        ...                   file_name="code.zip", modules=("userpkg",))
        >>> scope.allows("userpkg.ops"), scope.allows("stream_ops.examples.wordcount"), scope.allows("subprocess")
        (True, True, False)
    """

    model_config = ConfigDict(frozen=True)

    digest: str
    code_sha256: str
    archive: str
    file_name: str
    modules: tuple[str, ...]

    def allows(self, module_name: str) -> bool:
        """Whether a bound reference may name ``module_name``."""
        top = module_name.partition(".")[0]
        return top == STREAM_OPS_PACKAGE or top in self.modules


def forbidden_top_level(name: str) -> str | None:
    """Why ``name`` may not be a top-level module of a code archive, or None if it may.

    Shipping a module named like one of the standard library or stream_ops would replace it
    in every process that imports the archive.

    Example:
        >>> forbidden_top_level("os") is not None, forbidden_top_level("userpkg")
        (True, None)
    """
    if not name.isidentifier():
        return f"{name!r} is not a Python identifier"
    if name == STREAM_OPS_PACKAGE:
        return "stream_ops is installed on every worker and is never shipped"
    if name in sys.stdlib_module_names or name in sys.builtin_module_names:
        return f"{name!r} is a module of the Python standard library"
    return None
