"""A process and everything below it, as the kernel shows them in ``/proc`` (Linux), for tests
that look for secrets where topology code could read them.

``/proc/<pid>/environ`` is the environment a process was started with: what ``os.environ``
removed later is still there, readable by the process itself (and so by its topology code).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcessView:
    """One process: its id, command line and environment block as ``/proc`` shows them."""

    pid: int
    cmdline: str
    environ: bytes

    @property
    def kind(self) -> str:
        """What the process is in a worker's tree, by its command line."""
        for marker, kind in (
            ("stream_ops.compute.row_process_main", "row process"),
            ("pyspark.daemon", "Spark Python worker"),
            ("pyspark.worker", "Spark Python worker"),
            ("org.apache.spark.deploy.SparkSubmit", "Spark JVM"),
            ("stream_ops.cli", "stream-ops worker"),
        ):
            if marker in self.cmdline:
                return kind
        return "other"


def _parent(pid: int) -> int | None:
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
    return int(stat.rpartition(")")[2].split()[1])


def _view(pid: int) -> ProcessView | None:
    try:
        cmdline = (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        environ = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return None  # it exited meanwhile
    return ProcessView(pid, cmdline, environ)


def process_tree(root: int) -> list[ProcessView]:
    """``root`` and every process below it (those that exit while being read are left out)."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            parent = _parent(int(entry.name))
            if parent is not None:
                children.setdefault(parent, []).append(int(entry.name))
    found: list[ProcessView] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        view = _view(pid)
        if view is not None:
            found.append(view)
        todo.extend(children.get(pid, []))
    return found


def secrets_shown(tree: list[ProcessView], secrets: Mapping[str, str]) -> list[str]:
    """Where a value of ``secrets`` (name -> value) appears in an environment block or a command
    line of ``tree``: one line per finding, empty when none does."""
    shown = []
    for view in tree:
        for name, value in secrets.items():
            if value.encode() in view.environ:
                shown.append(f"{name} in the environment of {view.kind} {view.pid} ({view.cmdline[:120]})")
            if value in view.cmdline:
                shown.append(f"{name} on the command line of {view.kind} {view.pid}")
    return shown
