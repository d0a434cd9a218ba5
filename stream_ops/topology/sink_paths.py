"""Which directory each file sink writes, and whether two sinks would write the same files.

A ``to_parquet`` sink owns its directory (its batch files, ``_staging/`` and ``_committed/``)
and a ``to_topic`` sink its topic's queue directories: every sink whose kind
``writes_directory`` (:class:`stream_ops.topology.sink_kinds.SinkKind`). Two sinks on one directory, or on
directories one inside the other, would read or overwrite each other's files (a reader of a
Parquet sink reads every ``*.parquet`` below its root). So a topology refuses a second sink on
a directory another of its sinks uses (when the sink is defined) and a submit refuses one a
running topology's sink uses, naming both.

Example:
    >>> clashes(Path("/data/out"), Path("/data/out/part"))
    True
    >>> clashes(Path("/data/a"), Path("/data/ab"))
    False
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stream_ops.topology.plan import Plan

__all__ = ["clashes", "sink_directories", "sink_directory", "sink_owner"]


def sink_directory(path: str | os.PathLike[str]) -> Path:
    """The directory a file sink at ``path`` writes, absolute, symlinks resolved as far as they exist."""
    return Path(path).expanduser().resolve(strict=False)


def sink_owner(topology_id: str, sink_name: str) -> str:
    """The prefix of a file sink's file names for one submission: ``<topology id>.<sink name>``.

    A resubmitted topology's txids start again at 0: without the prefix its first batch would
    have the name of the previous submission's, already published (and a file of the same size
    would be taken for it).

    Example:
        >>> sink_owner("wordcount-4-1700000000", "out")
        'wordcount-4-1700000000.out'
    """
    return f"{topology_id}.{sink_name}"


def clashes(a: Path, b: Path) -> bool:
    """Whether sinks writing directories ``a`` and ``b`` would see each other's files (same, or nested)."""
    return a == b or a in b.parents or b in a.parents


def sink_directories(plan: Plan) -> Iterator[tuple[str, Path]]:
    """``(sink name, directory)`` of every file sink of ``plan``, each sink once (a sink tapped
    by several stages after a merge is one sink)."""
    seen: set[str] = set()
    for stage in plan.stages:
        for output in stage.outputs:
            if output.kind != "sink" or not output.sink_kind.writes_directory or output.path is None:
                continue
            if output.name in seen:
                continue
            seen.add(output.name)
            yield output.name, sink_directory(output.path)
