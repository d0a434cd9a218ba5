"""Every kind of user code a plan names reaches a worker process that cannot import it itself.

The user package lives only in a temporary directory the test imports it from (as a client
would); the worker processes' ``PYTHONPATH`` does not have it, so they can run the topology
only from the submitted code archive: its each function, aggregator, processing element,
State factory and updater, and sink function.
"""

from __future__ import annotations

import sqlite3
import sys
import textwrap
import time
from pathlib import Path

from stream_ops import FileTopic, OpaqueMapState, Topology
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import QueryError
from stream_ops.local_stack import LocalStack
from stream_ops.nimbus import submit
from stream_ops.runtime.query_client import query_state
from stream_ops.topics.producer import produce

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration" / "security"))
from user_packages import forget, import_ops, write_package

PACKAGE = "shippedpkg"
SHIPPED = '''
import sqlite3
from collections import Counter

from stream_ops.operators import CombinerAggregator, ProcessingElement
from stream_ops.operators.trident_state import State, StateFactory, StateUpdater

DB = {db!r}


def split(sentence):
    return sentence.split()


class Longest(CombinerAggregator):
    """The length of the longest word."""

    value_type_name = "long"

    def init(self, record):
        return len(record["word"])

    def combine(self, a, b):
        return max(a, b)

    def zero(self):
        return 0


class Shout(ProcessingElement):
    def on_event(self, event):
        self.emit(word=event["word"].upper())


class Tally(State):
    def __init__(self, partition):
        self.partition = partition
        self.pending = Counter()

    def begin_commit(self, txid):
        self.pending = Counter()
        self.txid = txid

    def add(self, words):
        self.pending.update(words)

    def commit(self, txid):
        with sqlite3.connect(DB) as db:
            db.execute("create table if not exists tally (partition integer, txid integer, word text, n integer, "
                       "primary key (partition, txid, word))")
            db.executemany("insert or replace into tally values (?, ?, ?, ?)",
                           [(self.partition, txid, w, n) for w, n in self.pending.items()])


class TallyFactory(StateFactory):
    def make_state(self, partition, num_partitions):
        return Tally(partition)


class TallyUpdater(StateUpdater):
    def update_state(self, state, tuples, collector):
        state.add(t["word"] for t in tuples)


def write_shouts(txid, records):
    with sqlite3.connect(DB) as db:
        db.execute("create table if not exists shouts (txid integer, word text)")
        if db.execute("select 1 from shouts where txid = ?", (txid,)).fetchone():
            return
        db.executemany("insert into shouts values (?, ?)", [(txid, r["word"]) for r in records])
'''


def _topology(ops, input_dir: Path) -> Topology:
    t = Topology("shipped")
    words = t.source("sentences", FileTopic(input_dir, 1), schema={"sentence": "string"}).each(
        ops.split, out="word", fields=["sentence"]
    )
    t.query("longest", words.persistent_aggregate(ops.Longest(), out="longest", state=OpaqueMapState))
    words.process(ops.Shout, key="word", out={"word": "string"}, queues=1).sink(ops.write_shouts)
    words.partition_by("word", queues=1).partition_persist(ops.TallyFactory(), ["word"], ops.TallyUpdater(), name="tally")
    return t


def _longest(store: ZkStore, stack: LocalStack) -> dict | None:
    try:
        return query_state(store, "shipped", "longest", [[]], query_config=stack.query)
    except QueryError:  # the task has not started on its worker yet
        return None


def _rows(db: Path, query: str) -> list[tuple]:
    try:
        with sqlite3.connect(db) as conn:
            return sorted(conn.execute(query))
    except sqlite3.OperationalError:  # the table is not there yet
        return []


def test_a_worker_process_runs_every_kind_of_user_code_from_the_archive_only(tmp_path):
    db = tmp_path / "shipped.sqlite"
    src = tmp_path / "src"
    write_package(src, PACKAGE, "v1", extra={"shipped.py": textwrap.dedent(SHIPPED.format(db=str(db)))})
    import_ops(src, PACKAGE)
    sys.path.insert(0, str(src))
    try:
        import importlib

        ops = importlib.import_module(f"{PACKAGE}.shipped")
    finally:
        sys.path.remove(str(src))
    home = tmp_path / "home"
    try:
        with (
            LocalStack(home=home, workers=1, worker_args=["--trigger-seconds", "0.2"]) as stack,
            ZkStore.connect(stack.zk_config) as store,
        ):
            topology = _topology(ops, home / "in")
            submit(store, stack.cluster, topology, workers=1)
            produce(topology.chains[0].source.topic, [{"sentence": "a bb ccc"}, {"sentence": "bb dddd"}])
            deadline = time.monotonic() + 120
            # The three stages commit independently: wait until each has its result.
            while time.monotonic() < deadline:
                shouts = _rows(db, "select word from shouts")
                tally = _rows(db, "select word, sum(n) from tally group by word")
                longest = _longest(store, stack)
                if len(shouts) == 5 and len(tally) == 4 and longest not in (None, {"[]": None}):
                    break
                time.sleep(1.0)
            assert shouts == [("A",), ("BB",), ("BB",), ("CCC",), ("DDDD",)]
            assert tally == [("a", 1), ("bb", 2), ("ccc", 1), ("dddd", 1)]
            assert longest == {"[]": 4}
    finally:
        forget(PACKAGE)
