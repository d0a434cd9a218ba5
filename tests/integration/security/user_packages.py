"""Helpers for tests that submit real user packages from temporary directories.

A user package is written to a directory, imported by the test process as a client would
(then forgotten again, so the in-process workers import it only from the code archive, like a
worker process of their own), and used to build a topology:

    source sentences -> each(pkg.ops:tag)       runs in Spark's Python workers
                     -> process(pkg.ops:TagPE)  runs in the worker's driver
                     -> group_by(word).persistent_aggregate(Count()) as query "words"

``tag`` appends ``-<VERSION>`` to every word and ``TagPE`` appends it once more, so a word
counted as ``hello-v2-v2`` went through v2 on both sides, and ``hello-v1-v2`` would mean the
executors and the driver ran different code.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path
from types import ModuleType

from stream_ops import Count, FileTopic, OpaqueMapState, Topology

OPS_SOURCE = """
from stream_ops.operators import ProcessingElement

VERSION = {version!r}


def tag(sentence):
    for word in sentence.split():
        yield word + "-" + VERSION


class TagPE(ProcessingElement):
    def on_event(self, event):
        self.emit(word=event["word"] + "-" + VERSION)
"""


def write_package(root: Path, name: str, version: str, *, extra: dict[str, str] | None = None) -> Path:
    """Write package ``name`` (``__init__.py``, ``ops.py`` tagging with ``version``) under ``root``."""
    package = root / name
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "ops.py").write_text(textwrap.dedent(OPS_SOURCE.format(version=version)), encoding="utf-8")
    for relative, text in (extra or {}).items():
        path = package / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return package


def forget(name: str) -> None:
    """Drop every module of package ``name`` from this process (a worker process would never have had them)."""
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module]


def import_ops(root: Path, name: str) -> ModuleType:
    """Import ``name.ops`` from ``root`` afresh, as the submitting client does."""
    forget(name)
    sys.path.insert(0, str(root))
    try:
        importlib.invalidate_caches()
        return importlib.import_module(f"{name}.ops")
    finally:
        sys.path.remove(str(root))


def tagging_topology(name: str, ops: ModuleType, input_dir: Path) -> Topology:
    """The topology of the module doc, on ``ops`` (an imported ``pkg.ops``)."""
    topology = Topology(name)
    counts = (
        topology.source("sentences", FileTopic(input_dir, 1), schema={"sentence": "string"})
        .each(ops.tag, out="word", fields=["sentence"])
        .process(ops.TagPE, key="word", out={"word": "string"}, name="tagger")
        .group_by("word")
        .persistent_aggregate(Count(), out="count", state=OpaqueMapState, name="words")
    )
    topology.query("words", counts)
    return topology


def tagged_keys(word: str, versions: list[str]) -> list[list[str]]:
    """Query keys for ``word`` tagged by every pair of versions (executor side, driver side)."""
    return [[f"{word}-{a}-{b}"] for a in versions for b in versions]
