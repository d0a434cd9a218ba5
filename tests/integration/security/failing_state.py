"""User State that fails, shipped to workers in the code archive (test helper, issue 17 item 7).

* :class:`UnopenableDB`: its factory opens a SQLite file in a directory that does not exist, so
  ``make_state`` raises ``sqlite3.OperationalError`` ("unable to open database file") and the
  task can never start.
* :class:`LockedDB`: opens fine, but every batch's update raises ``sqlite3.OperationalError``
  ("database is locked"), so the task's streaming query fails at its first batch.

Both append a line to ``<path>/attempts`` on each try, so a test counts the worker's tries.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stream_ops import FileTopic, Topology
from stream_ops.examples.wordcount import split
from stream_ops.operators.trident_state import Collector, State, StateFactory, StateUpdater


def _count_attempt(path: str, what: str) -> None:
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    with (root / "attempts").open("a") as out:
        out.write(f"{what}\n")


class _NoopState(State):
    def begin_commit(self, txid: int) -> None:
        pass

    def commit(self, txid: int) -> None:
        pass


@dataclass(frozen=True)
class UnopenableDB(StateFactory):
    """A database under ``<path>/missing/``, a directory nobody creates."""

    path: str

    def make_state(self, partition: int, num_partitions: int) -> State:
        _count_attempt(self.path, f"make_state {partition}")
        sqlite3.connect(Path(self.path) / "missing" / f"partition-{partition}.sqlite")
        return _NoopState()


@dataclass(frozen=True)
class LockedDB(StateFactory):
    """A state whose every update fails as if another process held the database's lock."""

    path: str

    def make_state(self, partition: int, num_partitions: int) -> State:
        return _NoopState()


@dataclass(frozen=True)
class CountingLockedUpdater(StateUpdater):
    """Fails every batch as SQLite does for a database another writer holds locked; records each try."""

    path: str

    def update_state(self, state: State, tuples: list[Mapping[str, Any]], collector: Collector) -> None:
        _count_attempt(self.path, "update_state")
        raise sqlite3.OperationalError("database is locked")


def build_failing(root: Path, *, name: str, factory: StateFactory, updater: StateUpdater) -> Topology:
    """Sentences -> words -> ``partition_persist`` into ``factory`` (one queue each)."""
    topology = Topology(name)
    topology.source("sentences", FileTopic(root / "sentences", 1), schema={"sentence": "string"}).each(
        split, out="word", fields=["sentence"]
    ).partition_by("word", name="words").partition_persist(factory, ["word"], updater, name="word_db")
    return topology
