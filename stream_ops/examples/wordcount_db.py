"""Trident's state API example: word counts kept in a user database (``WordCountDB``).

Words are partitioned by word and persisted with ``partition_persist`` into one SQLite file
per partition; a second stream of questions reads them with ``state_query``. The database
implements each of Trident's three state kinds, storing what the kind needs with every count:

* ``transactional``: (count, txid); a batch whose txid equals the stored one was applied
  already and is skipped;
* ``opaque``: (count, prev, txid); an equal txid recomputes from ``prev``;
* ``non-transactional``: the count only; a replayed batch counts twice (at-least-once).
"""

from __future__ import annotations

import os
import sqlite3
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stream_ops import FileTopic, Max, OpaqueMapState, Topology
from stream_ops.errors import TxidOrderError
from stream_ops.examples.wordcount import split
from stream_ops.operators.trident_state import Collector, QueryFunction, State, StateFactory, StateUpdater

KINDS = ("transactional", "opaque", "non-transactional")


class WordCountState(State):
    """One partition of the database: a SQLite file."""

    def __init__(self, path: Path, kind: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.kind = kind
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("pragma journal_mode=wal")
        self._db.execute("create table if not exists counts (word text primary key, count integer, prev integer, txid integer)")
        self._txid: int | None = None

    def begin_commit(self, txid: int) -> None:
        self._txid = txid
        self._db.execute("begin")

    def commit(self, txid: int) -> None:
        self._db.execute("commit")
        self._txid = None

    def increment(self, counts: Mapping[str, int]) -> dict[str, int]:
        """Add ``counts`` under the current batch's txid, by the rules of this kind; returns
        the new count of each word."""
        txid = self._txid
        if txid is None:
            raise RuntimeError("increment outside begin_commit/commit")
        totals: dict[str, int] = {}
        for word, n in counts.items():
            row = self._db.execute("select count, prev, txid from counts where word = ?", (word,)).fetchone()
            count, prev, stored = row if row else (0, 0, -1)
            if self.kind != "non-transactional" and stored > txid:
                raise TxidOrderError(f"word {word!r} stored at txid {stored}, batch {txid} is older")
            if self.kind == "transactional":
                if stored == txid:
                    totals[word] = count
                    continue
                new: tuple[int, int | None, int | None] = (count + n, None, txid)
            elif self.kind == "opaque":
                new = (prev + n, prev, txid) if stored == txid else (count + n, count, txid)
            else:
                new = (count + n, None, None)
            self._db.execute("insert or replace into counts values (?, ?, ?, ?)", (word, *new))
            totals[word] = new[0]
        return totals

    def get(self, words: list[str]) -> list[int | None]:
        """Current counts of ``words`` (None for unknown words)."""
        found = (
            dict(
                self._db.execute(f"select word, count from counts where word in ({','.join('?' * len(words))})", words).fetchall()
            )
            if words
            else {}
        )
        return [found.get(w) for w in words]

    def close(self) -> None:
        self._db.close()


@dataclass(frozen=True)
class WordCountDB(StateFactory):
    """Trident ``StateFactory``: one SQLite file per partition under ``path``."""

    path: str
    kind: str = "transactional"

    def make_state(self, partition: int, num_partitions: int) -> WordCountState:
        return WordCountState(Path(self.path) / f"partition-{partition:03d}-of-{num_partitions:03d}.sqlite", self.kind)


class WordCountUpdater(StateUpdater):
    """Counts the words of a batch and adds them to the partition's database; emits each
    counted word with its new count (``out={"word": "string", "count": "long"}``)."""

    def update_state(self, state: State, tuples: list[Mapping[str, Any]], collector: Collector) -> None:
        assert isinstance(state, WordCountState)
        for word, count in state.increment(Counter(t["word"] for t in tuples)).items():
            collector.emit((word, count))


class QueryWordCount(QueryFunction):
    """Looks the words of a batch up in the database (Trident's ``batchRetrieve``)."""

    def batch_retrieve(self, state: Any, args: list[Mapping[str, Any]]) -> list[Any]:
        return state.get([a["word"] for a in args])

    def execute(self, tuple: Mapping[str, Any], result: Any, collector: Collector) -> None:  # noqa: A002
        collector.emit(result or 0)


def build_wordcount_db(
    root: str | os.PathLike[str], *, kind: str = "transactional", name: str | None = None, queues: int = 2
) -> Topology:
    """Sentences counted into WordCountDB; questions answered from it by state_query."""
    root = Path(root)
    topology = Topology(name or f"wordcount-db-{kind}")
    words = topology.source("sentences", FileTopic(root / "sentences", queues), schema={"sentence": "string"}).each(
        split, out="word", fields=["sentence"]
    )
    db = words.partition_by("word", name="words").partition_persist(
        WordCountDB(str(root / "db"), kind), ["word"], WordCountUpdater(), name="word_counts"
    )
    answers = topology.source("questions", FileTopic(root / "questions", 1), schema={"word": "string"}).state_query(
        db, ["word"], QueryWordCount(), out={"count": "long"}
    )
    kept = answers.group_by("word").persistent_aggregate(Max("count"), out="count", state=OpaqueMapState, name="answers")
    topology.query("answers", kept)
    return topology


def topology() -> Topology:
    """The example on ``$STREAM_OPS_HOME/input/wordcount-db``."""
    return build_wordcount_db(Path(os.environ.get("STREAM_OPS_HOME", "var/stream_ops")).resolve() / "input" / "wordcount-db")
