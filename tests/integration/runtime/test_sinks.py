"""Sinks on real Spark and ZooKeeper: exactly once per txid under a replay and a zombie owner.

The user code (a SQLite sink function keyed by (partition, txid)) lives in a package written
to a temporary directory and forgotten after the submit, so the runners load it from the
submitted code archive only.
"""

from __future__ import annotations

import sqlite3
import sys
import textwrap
import threading
from pathlib import Path

import duckdb
import pytest
from runners import make_runner, pause_commits

from stream_ops import Count, FileTopic, OpaqueMapState, Topology
from stream_ops.config import ClusterConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import OwnershipLostError
from stream_ops.hashing import encode_key
from stream_ops.nimbus.submission import submit

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "security"))
from user_packages import forget, import_ops, write_package

SOURCE_SCHEMA = "sentence string, _corrupt_record string"

SINK_SOURCE = """
import os
import sqlite3

DB = {db!r}
FAIL_ONCE = {fail_once!r}


def write_words(txid, records):
    if os.path.exists(FAIL_ONCE):
        os.remove(FAIL_ONCE)
        raise RuntimeError("the database is away")
    # One transaction per batch: the rows and the txid marker land together, so a second call
    # for the same txid (after a crash) changes nothing.
    with sqlite3.connect(DB) as db:
        db.execute("create table if not exists batches (txid integer primary key)")
        db.execute("create table if not exists words (txid integer, word text)")
        if db.execute("select 1 from batches where txid = ?", (txid,)).fetchone():
            return
        db.execute("insert into batches values (?)", (txid,))
        db.executemany("insert into words values (?, ?)", [(txid, r["word"]) for r in records])


def split(sentence):
    return sentence.split()


def append_counts(txid, records):
    with sqlite3.connect(DB) as db:
        db.execute("create table if not exists emitted (txid integer, word text, n integer)")
        db.executemany("insert into emitted values (?, ?, ?)", [(txid, r["word"], r["count"]) for r in records])


def write_counts(txid, records):
    with sqlite3.connect(DB) as db:
        db.execute("create table if not exists counts (txid integer, word text, n integer, primary key (txid, word))")
        db.executemany("insert or replace into counts values (?, ?, ?)", [(txid, r["word"], r["count"]) for r in records])
"""


@pytest.fixture
def cluster(tmp_path) -> ClusterConfig:
    return ClusterConfig(root=tmp_path / "cluster")


@pytest.fixture
def sink_package(tmp_path):
    """(ops module, sqlite path, fail-once flag path)."""
    name = "sinkpkg"
    db, flag = tmp_path / "sink.sqlite", tmp_path / "fail-once"
    src = tmp_path / "src"
    write_package(src, name, "v1", extra={"sinks.py": textwrap.dedent(SINK_SOURCE.format(db=str(db), fail_once=str(flag)))})
    import_ops(src, name)
    sys.path.insert(0, str(src))
    try:
        import importlib

        module = importlib.import_module(f"{name}.sinks")
    finally:
        sys.path.remove(str(src))
    yield module, db, flag
    forget(name)


def _topology(ops, tmp_path: Path) -> tuple[Topology, FileTopic]:
    out = FileTopic(tmp_path / "words-out", queues=2)
    t = Topology("sinks")
    words = t.source("sentences", FileTopic(tmp_path / "in", 1), schema={"sentence": "string"}).each(
        ops.split, out="word", fields=["sentence"]
    )
    words.sink(ops.write_words, name="sqlite")
    words.to_topic(out, name="words")
    words.print(name="log")
    words.to_parquet(tmp_path / "parquet", name="parquet")
    return t, out


def _parquet_words(spark, tmp_path: Path) -> tuple[list[str], list[str]]:
    """The Parquet sink's words as DuckDB and as Spark read them."""
    root = tmp_path / "parquet"
    seen_by_duckdb = sorted(r[0] for r in duckdb.sql(f"select word from read_parquet('{root}/**/*.parquet')").fetchall())
    seen_by_spark = sorted(r["word"] for r in spark.read.parquet(str(root)).collect())
    return seen_by_duckdb, seen_by_spark


def _sentences(spark, *sentences):
    return spark.createDataFrame([(s, None) for s in sentences], SOURCE_SCHEMA)


def _rows(db: Path) -> list[tuple[int, str]]:
    with sqlite3.connect(db) as conn:
        return sorted(conn.execute("select txid, word from words"))


def _topic_words(topic: FileTopic) -> list[str]:
    return sorted(record["word"] for q in range(topic.queues) for _, _, record in topic.read_queue(q))


def test_a_sink_function_that_fails_is_called_again_with_the_same_txid_by_the_next_owner(
    spark, zk_config, cluster, tmp_path, sink_package, caplog
):
    ops, db, flag = sink_package
    topology, out = _topology(ops, tmp_path)
    with ZkStore.connect(zk_config) as admin:
        topology_id = submit(admin, cluster, topology, workers=1)
        forget("sinkpkg")  # the runners import the package from the code archive only
        a = make_runner(admin, spark, cluster, topology_id, "host-a:1", stage=0)
        a.prepare()
        with caplog.at_level("INFO", "stream_ops.print"):
            a.process_batch(_sentences(spark, "how are you"), 0)
        assert any('"word": "how"' in m for m in caplog.messages), "print logs the committed records"
        flag.touch()
        with pytest.raises(RuntimeError, match="the database is away"):
            a.process_batch(_sentences(spark, "fine thanks"), 1)
        a.stop()
        # txid 1 is committed but its sink call failed: the next owner calls it again.
        record = admin.get_json(ZkPaths.transactional_task(topology_id, a.task.task_id))[0]
        assert record["committed_txid"] == 1
        b = make_runner(admin, spark, cluster, topology_id, "host-b:2", stage=0)
        b.prepare()
        # Spark re-delivers the committed batch: step 1 publishes again and delivers nothing new.
        b.process_batch(_sentences(spark, "fine thanks"), 1)
        b.process_batch(_sentences(spark, "bye"), 2)
        b.stop()
    assert _rows(db) == [(0, "are"), (0, "how"), (0, "you"), (1, "fine"), (1, "thanks"), (2, "bye")]
    everything = sorted(["how", "are", "you", "fine", "thanks", "bye"])
    assert _topic_words(out) == everything
    assert _parquet_words(spark, tmp_path) == (everything, everything)
    delivery = b.layout.sink_delivery_topic(b.stage, "sqlite")
    assert delivery.files(0) == [], "delivered batches are removed"


def test_a_zombies_sink_output_is_never_visible(spark, zk_config, cluster, tmp_path, sink_package, monkeypatch, caplog):
    ops, db, _ = sink_package
    topology, out = _topology(ops, tmp_path)
    caplog.set_level("INFO", "stream_ops.print")
    with ZkStore.connect(zk_config) as admin, ZkStore.connect(zk_config) as store_a:
        topology_id = submit(admin, cluster, topology, workers=1)
        forget("sinkpkg")
        a = make_runner(store_a, spark, cluster, topology_id, "host-a:1", stage=0)
        a.prepare()
        paused, resume = pause_commits(monkeypatch, "host-a:1")
        errors: list[BaseException] = []

        def run_a():
            try:
                a.process_batch(_sentences(spark, "zombie words here"), 0)
            except BaseException as e:  # noqa: BLE001 - the test inspects it
                errors.append(e)

        thread = threading.Thread(target=run_a)
        thread.start()
        assert paused.wait(60)
        admin.delete(ZkPaths.owner(topology_id, a.task.task_id))  # A's session "expires"
        b = make_runner(admin, spark, cluster, topology_id, "host-b:2", stage=0)
        b.prepare()
        b.process_batch(_sentences(spark, "live words"), 0)  # a replay of txid 0 by the new owner
        resume.set()
        thread.join(30)
        assert len(errors) == 1 and isinstance(errors[0], OwnershipLostError)
        b.stop()
        a._close_state()
    assert _rows(db) == [(0, "live"), (0, "words")]
    assert _topic_words(out) == ["live", "words"]
    assert _parquet_words(spark, tmp_path) == (["live", "words"], ["live", "words"])
    printed = [m for m in caplog.messages if m.startswith("log task")]
    assert len(printed) == 2 and not any("zombie" in m for m in printed), printed
    staged = [p for p in (tmp_path / "words-out" / ".pending").rglob("*") if p.is_file()]
    assert all("-e000001" not in p.name for p in staged) or staged == [], staged


def _partials(spark, counts: dict[str, int]):
    return spark.createDataFrame([(encode_key([w]), n) for w, n in counts.items()], "key string, value long")


def test_new_values_of_a_count_reach_a_sink_once_per_txid_through_a_zombie_and_a_replay(
    spark, zk_config, cluster, tmp_path, sink_package, monkeypatch
):
    ops, db, _ = sink_package
    t = Topology("counts")
    counts = (
        t.source("sentences", FileTopic(tmp_path / "in", 1), schema={"sentence": "string"})
        .each(ops.split, out="word", fields=["sentence"])
        .group_by("word")
        .persistent_aggregate(Count(), out="count", state=OpaqueMapState)
    )
    counts.new_values().sink(ops.write_counts, name="counts")
    with ZkStore.connect(zk_config) as admin, ZkStore.connect(zk_config) as store_a:
        topology_id = submit(admin, cluster, t, workers=1)
        forget("sinkpkg")
        a = make_runner(store_a, spark, cluster, topology_id, "host-a:1", stage="count")
        a.prepare()
        a.process_batch(_partials(spark, {"how": 2}), 0)
        paused, resume = pause_commits(monkeypatch, "host-a:1")
        errors: list[BaseException] = []

        def run_a():
            try:
                a.process_batch(_partials(spark, {"how": 1, "are": 1}), 1)
            except BaseException as e:  # noqa: BLE001 - the test inspects it
                errors.append(e)

        thread = threading.Thread(target=run_a)
        thread.start()
        assert paused.wait(60)
        admin.delete(ZkPaths.owner(topology_id, a.task.task_id))
        b = make_runner(admin, spark, cluster, topology_id, "host-b:2", stage="count")
        b.prepare()  # rebuilds the state at txid 0 from the state topic
        b.process_batch(_partials(spark, {"how": 1, "are": 1}), 1)
        b.process_batch(_partials(spark, {"how": 1, "are": 1}), 1)  # Spark re-delivers the committed batch
        resume.set()
        thread.join(30)
        assert len(errors) == 1 and isinstance(errors[0], OwnershipLostError)
        b.stop()
        a._close_state()
    with sqlite3.connect(db) as conn:
        assert sorted(conn.execute("select txid, word, n from counts")) == [(0, "how", 2), (1, "are", 1), (1, "how", 3)]


def _records(spark, stream: str, records: list[dict]):
    import json

    rows = [(stream, encode_key([r["word"]]), json.dumps(r)) for r in records]
    return spark.createDataFrame(rows, "stream string, key string, record string")


def test_what_a_partition_persist_updater_emits_flows_through_new_values_once(spark, zk_config, cluster, tmp_path, sink_package):
    from stream_ops.examples.wordcount_db import WordCountDB, WordCountUpdater

    ops, db, _ = sink_package
    t = Topology("persisted")
    words = (
        t.source("sentences", FileTopic(tmp_path / "in", 1), schema={"sentence": "string"})
        .each(ops.split, out="word", fields=["sentence"])
        .partition_by("word", queues=1, name="words")
    )
    state = words.partition_persist(
        WordCountDB(str(tmp_path / "db")), ["word"], WordCountUpdater(), name="counts", out={"word": "string", "count": "long"}
    )
    state.new_values().sink(ops.append_counts, name="counts-out")
    with ZkStore.connect(zk_config) as admin:
        topology_id = submit(admin, cluster, t, workers=1)
        forget("sinkpkg")
        persisting = make_runner(admin, spark, cluster, topology_id, "host-a:1", stage="words")
        persisting.prepare()
        persisting.process_batch(_records(spark, "sentences", [{"word": "how"}, {"word": "how"}]), 0)
        persisting.process_batch(_records(spark, "sentences", [{"word": "how"}, {"word": "are"}]), 1)
        persisting.stop()
        values = make_runner(admin, spark, cluster, topology_id, "host-a:1", stage="counts-values")
        values.prepare()
        queue_dir = values.input_dir
        shuffled = spark.read.schema("stream string, key string, record string").json(str(queue_dir))
        values.process_batch(shuffled, 0)
        values.stop()
    with sqlite3.connect(db) as conn:
        rows = sorted(conn.execute("select txid, word, n from emitted"))
    # both batches' emissions arrive in one batch of the values stage
    assert rows == [(0, "are", 1), (0, "how", 2), (0, "how", 3)]
