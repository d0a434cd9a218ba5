"""Source batches computed on the driver: small ones parsed by Spark and collected
(``compute/collect_on_driver.py``), FileTopic batches read in Arrow (``compute/arrow_read.py``).

The same batches, bad records included, through Spark's Python workers, through the driver and
(clean ones) read in Arrow give the same outputs, partials, dead letters and input counts for
every kind of operation; what the Arrow path cannot reproduce stays in Spark; a real streaming
query computes its small batches on either path and its counts stay exact through a zombie owner
and a replayed batch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import time
from collections import Counter

import pytest
from pyspark.sql import DataFrame
from runners import crash_after_publish, make_runner, pause_commits

from stream_ops import Count, FileTopic, OpaqueMapState, Sum, Topology, TransactionalMapState
from stream_ops.compute import arrow_read, batch_inputs, collect_on_driver, decision
from stream_ops.compute import row_processes as row_processes_module
from stream_ops.compute.arrow_read import ArrowRefusal
from stream_ops.compute.decision import BatchFacts, ComputePath, batch_path, choose_path, source_batch
from stream_ops.compute.settings import (
    ARROW_BATCH_BYTES_CONF,
    ROW_PROCESSES_CONF,
    SessionSettings,
    driver_batch_bytes,
    row_processes_setting,
)
from stream_ops.config import ClusterConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.dsl.build_plan import build_plan
from stream_ops.errors import ConfigError, OwnershipLostError
from stream_ops.examples.wordcount import build_wordcount, split, split_batch
from stream_ops.hashing import encode_key
from stream_ops.helpers.spark_ddl import schema_ddl
from stream_ops.nimbus.submission import submit
from stream_ops.sources import CORRUPT_COLUMN
from stream_ops.spark.callback_sink import BatchFrame
from stream_ops.spark.settings import DRIVER_BATCH_BYTES_CONF
from stream_ops.topics.shuffle_files import read_partials
from stream_ops.topology.plan import OperationSpec

SCHEMA = "sentence string, n long, _corrupt_record string"
ROWS = [
    ("how are you how", 1, None),
    ("héllo  wörld", 2, None),  # two spaces: an empty word
    ("you you", None, None),  # a Sum refuses the null
    (None, 4, None),  # each(split) fails on it
    ("", 5, None),
    (None, None, '{"sentence": broken'),
    (None, None, '{"sentence": broken'),
]


def _rows_two_outputs(t: Topology, lines):
    words = lines.each(split, out="word", fields=["sentence"]).filter(bool, fields=["word"])
    words.map(len, out="size", fields=["word"]).to_parquet("/nonexistent/sizes", name="sizes")
    words.group_by("word").persistent_aggregate(Sum("n"), out="total", state=OpaqueMapState)


def split_batch_failing_on_you_you(batch):
    """:func:`split_batch`, raising for a batch that holds the sentence "you you"."""
    if "you you" in batch.column("sentence").to_pylist():
        raise ValueError("no you you")
    return split_batch(batch)


STAGES = {
    "each+count": lambda t, s: (
        s.each(split, out="word", fields=["sentence"])
        .group_by("word")
        .persistent_aggregate(Count(), out="c", state=OpaqueMapState)
    ),
    "map_batches+count": lambda t, s: (
        s.map_batches(split_batch, schema={"word": "string"})
        .group_by("word")
        .persistent_aggregate(Count(), out="c", state=OpaqueMapState)
    ),
    "sql+count": lambda t, s: (
        s.select_expr("explode(split(sentence, ' ')) AS word", "n")
        .where("length(word) > 1")
        .group_by("word")
        .persistent_aggregate(Count(), out="c", state=OpaqueMapState)
    ),
    "sql+each+sum": lambda t, s: (
        s.select_expr("sentence", "n")
        .where("n IS NULL OR n < 5")
        .each(split, out="word", fields=["sentence"])
        .group_by("word")
        .persistent_aggregate(Sum("n"), out="total", state=OpaqueMapState)
    ),
    "each/filter/map, two outputs": _rows_two_outputs,
}


def _canonical(result) -> tuple:
    outputs = {i: sorted(json.dumps(item, sort_keys=True, default=str) for item in items) for i, items in result.outputs.items()}
    letters = sorted(json.dumps(letter, sort_keys=True, default=str) for letter in result.dead_letters)
    return outputs, letters, result.input_rows, result.inputs


@pytest.mark.parametrize("name", list(STAGES))
def test_the_driver_path_gives_what_the_spark_path_gives(spark, tmp_path, monkeypatch, name):
    monkeypatch.setenv("STREAM_OPS_CACHE", str(tmp_path / "cache"))
    topology = Topology("paths")
    STAGES[name](topology, topology.source("lines", FileTopic(tmp_path / "in", 1), schema={"sentence": "string", "n": "long"}))
    stage = build_plan(topology).stage(0)
    batch = spark.createDataFrame(ROWS, SCHEMA)
    in_spark = _canonical(source_batch(batch, stage, on_driver=False))

    def no_shuffle(*args, **kwargs):
        raise AssertionError("partials known to fit the driver were grouped by Spark")

    with monkeypatch.context() as patched:  # Spark's workers compute, the driver groups their partials
        real_choice = decision.choose_path
        patched.setattr(
            decision, "choose_path", lambda facts: dataclasses.replace(real_choice(facts), group_partials_on_driver=True)
        )
        patched.setattr(DataFrame, "groupBy", no_shuffle)
        assert _canonical(source_batch(batch, stage, on_driver=False)) == in_spark

    def no_python_worker(*args, **kwargs):
        raise AssertionError("the driver path ran mapInArrow")

    monkeypatch.setattr(DataFrame, "mapInArrow", no_python_worker)
    on_driver = _canonical(source_batch(batch, stage, on_driver=True))
    assert on_driver == in_spark
    assert in_spark[1], "the batch has dead letters"


def _arrow_input(df, stage):
    """The batch's path when it is read in Arrow (its table, its choice), None when Spark parses it."""
    path = batch_path(df, stage)
    return path if path.table is not None else None


def _source_df(spark, files, fields):
    """The batch DataFrame of ``files`` as a FileTopic source stage reads it (PERMISSIVE JSON)."""
    ddl = schema_ddl({**fields, CORRUPT_COLUMN: "string"})
    reader = spark.read.option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", CORRUPT_COLUMN)
    return reader.schema(ddl).json([str(f) for f in files])


def _log_batch(checkpoint, batch_id, files):
    """A file source log entry planning ``files`` for ``batch_id``, as Spark writes it."""
    log = checkpoint / "sources" / "0"
    log.mkdir(parents=True, exist_ok=True)
    entries = [{"path": path.as_uri(), "timestamp": 0, "batchId": batch_id} for path in files]
    (log / str(batch_id)).write_text("\n".join(["v1", *map(json.dumps, entries)]), encoding="utf-8")


def _no_spark_job(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the Arrow path ran a Spark job")

    for name in ("mapInArrow", "toArrow", "collect", "groupBy"):
        monkeypatch.setattr(DataFrame, name, refuse)


@pytest.mark.parametrize("processes", [0, 2], ids=["driver thread", "local processes"])
@pytest.mark.parametrize("name", list(STAGES))
def test_the_arrow_path_gives_what_the_spark_path_gives(spark, tmp_path, monkeypatch, name, processes):
    monkeypatch.setenv("STREAM_OPS_CACHE", str(tmp_path / "cache"))
    fields = {"sentence": "string", "n": "long"}
    topology = Topology("paths")
    STAGES[name](topology, topology.source("lines", FileTopic(tmp_path / "in", 1), schema=fields))
    stage = build_plan(topology).stage(0)
    records = [{"sentence": sentence, "n": n} for sentence, n, corrupt in ROWS if corrupt is None]
    files = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    for path, part in zip(files, (records[:3], records[3:]), strict=True):
        path.write_text("".join(json.dumps(r) + "\n" for r in part), encoding="utf-8")
    _log_batch(tmp_path / "checkpoint", 4, files)
    df = _source_df(spark, files, fields)
    in_spark = _canonical(source_batch(df, stage, on_driver=False))
    results = []
    pools: list[int] = []
    real_pool = row_processes_module.row_processes
    monkeypatch.setattr(row_processes_module, "row_processes", lambda n: pools.append(n) or real_pool(n))
    _no_spark_job(monkeypatch)
    # a batch above the driver-batch limit: its per-record operations run in local processes
    conf = {DRIVER_BATCH_BYTES_CONF: "0", ROW_PROCESSES_CONF: str(processes)} if processes else {}
    with _spark_conf(spark, conf):
        batch_inputs.noting_input_bytes(lambda batch, _: results.append(source_batch(batch, stage)), tmp_path / "checkpoint")(
            df, 4
        )
    assert _canonical(results[0]) == in_spark
    assert any(in_spark[0].values()) and in_spark[2] >= 4, "the batch has outputs and input rows"
    runs_per_record = any(op.kind in ("each", "map", "filter") for op in stage.operations)
    assert pools == ([processes] if processes and runs_per_record else [])


@contextlib.contextmanager
def _spark_conf(spark, conf: dict[str, str]):
    for key, value in conf.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key in conf:
            spark.conf.unset(key)


def test_the_arrow_path_isolates_the_rows_a_batch_function_fails_on(spark, tmp_path, monkeypatch):
    """As the driver path does (Spark's Python workers cannot import this test module)."""
    fields = {"sentence": "string", "n": "long"}
    topology = Topology("failing")
    lines = topology.source("lines", FileTopic(tmp_path / "in", 1), schema=fields)
    words = lines.map_batches(split_batch_failing_on_you_you, schema={"word": "string"}).group_by("word")
    words.persistent_aggregate(Count(), out="c", state=OpaqueMapState)
    stage = build_plan(topology).stage(0)
    records = [{"sentence": sentence, "n": n} for sentence, n, corrupt in ROWS if corrupt is None]
    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    _log_batch(tmp_path / "checkpoint", 4, [path])
    df = _source_df(spark, [path], fields)
    on_driver = _canonical(source_batch(df, stage, on_driver=True))
    results = []
    _no_spark_job(monkeypatch)
    batch_inputs.noting_input_bytes(lambda batch, _: results.append(source_batch(batch, stage)), tmp_path / "checkpoint")(df, 4)
    assert _canonical(results[0]) == on_driver
    assert [json.loads(letter)["record"]["sentence"] for letter in on_driver[1]] == ["you you"]


def test_the_arrow_path_leaves_to_spark_what_it_cannot_reproduce(spark, tmp_path, monkeypatch):
    monkeypatch.setenv("STREAM_OPS_CACHE", str(tmp_path / "cache"))
    fields = {"sentence": "string", "n": "long"}
    clean, broken = tmp_path / "clean.jsonl", tmp_path / "broken.jsonl"
    clean.write_text('{"sentence": "a b", "n": 1}\n', encoding="utf-8")
    broken.write_text('{"sentence": "a b", "n": 1}\n{"sentence": 5}\n', encoding="utf-8")  # Spark reads 5 as "5"
    topology = Topology("fallback")
    lines = topology.source("lines", FileTopic(tmp_path / "in", 1), schema=fields)
    regex = lines.select_expr("explode(split(sentence, '[ ,]')) AS word").group_by("word")
    regex.persistent_aggregate(Count(), out="c", state=OpaqueMapState)
    plain = Topology("plain")
    words = plain.source("lines", FileTopic(tmp_path / "in", 1), schema=fields).select_expr("explode(split(sentence, ' ')) AS w")
    words.group_by("w").persistent_aggregate(Count(), out="c", state=OpaqueMapState)
    seen: dict[str, object] = {}

    def check(label, stage, files, conf=None):
        _log_batch(tmp_path / label, 0, files)
        for key, value in (conf or {}).items():
            spark.conf.set(key, str(value))
        try:
            noting = batch_inputs.noting_input_bytes(
                lambda df, _: seen.update({label: _arrow_input(df, stage)}), tmp_path / label
            )
            noting(_source_df(spark, files, fields), 0)
        finally:
            for key in conf or {}:
                spark.conf.unset(key)

    size = clean.stat().st_size
    row = build_plan(build_wordcount(tmp_path / "in", queues=1, split_with="row")).stage(0)
    check("regex split", build_plan(topology).stage(0), [clean])
    check("line Spark coerces", build_plan(plain).stage(0), [broken])
    check("above the limit", build_plan(plain).stage(0), [clean], {ARROW_BATCH_BYTES_CONF: size - 1})
    check("at the limit", build_plan(plain).stage(0), [clean], {ARROW_BATCH_BYTES_CONF: size})
    check("per record, large", row, [clean], {DRIVER_BATCH_BYTES_CONF: size - 1, ROW_PROCESSES_CONF: 0})
    check("per record, large, local processes", row, [clean], {DRIVER_BATCH_BYTES_CONF: size - 1, ROW_PROCESSES_CONF: 2})
    check("per record, small", row, [clean], {DRIVER_BATCH_BYTES_CONF: size, ROW_PROCESSES_CONF: 0})
    refused = ("regex split", "line Spark coerces", "above the limit", "per record, large")
    assert [label for label in refused if seen[label] is not None] == [], "left to Spark"
    assert seen["at the limit"] is not None and seen["at the limit"].table.to_pylist() == [{"w": "a"}, {"w": "b"}]
    for label, processes in (("per record, small", 0), ("per record, large, local processes", 2)):
        assert seen[label] is not None and seen[label].table.num_rows == 1, label
        assert seen[label].choice.processes == processes, label


def test_a_per_record_source_stage_starts_its_local_processes_with_its_query(spark, tmp_path, monkeypatch):
    started: list[int] = []
    monkeypatch.setattr(decision, "row_processes", started.append)
    for split_with, conf, expected in [
        ("row", {ROW_PROCESSES_CONF: "2"}, [2]),
        ("row", {ROW_PROCESSES_CONF: "0"}, []),
        ("row", {ARROW_BATCH_BYTES_CONF: "0"}, []),
        ("sql", {ROW_PROCESSES_CONF: "2"}, []),
    ]:
        started.clear()
        stage = build_plan(build_wordcount(tmp_path / "in", queues=1, split_with=split_with)).stage(0)
        with _spark_conf(spark, conf):
            decision.start_row_processes(spark, stage)
        assert started == expected, (split_with, conf)


def test_local_processes_default_to_a_local_masters_cores_and_refuse_a_bad_setting(spark):
    assert spark.conf.get("spark.master").startswith("local")
    assert row_processes_setting(spark) == spark.sparkContext.defaultParallelism
    for bad in ("two", "-1"):
        with _spark_conf(spark, {ROW_PROCESSES_CONF: bad}), pytest.raises(ConfigError, match=ROW_PROCESSES_CONF):
            row_processes_setting(spark)


def test_a_byte_limit_is_a_whole_number_of_at_least_zero(spark):
    with _spark_conf(spark, {DRIVER_BATCH_BYTES_CONF: "0"}):
        assert driver_batch_bytes(spark) == 0
    for bad in ("big", "-1"):
        with _spark_conf(spark, {DRIVER_BATCH_BYTES_CONF: bad}), pytest.raises(ConfigError, match="a number of bytes"):
            driver_batch_bytes(spark)


def _committed(store: ZkStore, topology_id: str, task_id: int) -> int:
    return store.get_json(ZkPaths.transactional_task(topology_id, task_id))[0]["committed_txid"]


def _wait(condition, what: str) -> None:
    deadline = time.monotonic() + 90
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.fixture(params=["driver", "arrow", "processes"])
def small_batch_path(request, spark):
    """Which path clean batches take: Spark's parse collected to the driver (the Arrow path
    turned off), read in Arrow (the default; a batch with a broken line still goes to the
    driver), or read in Arrow as large batches whose per-record operations run in local
    processes (a batch with a broken line then goes to Spark's Python workers)."""
    conf = {
        "driver": {ARROW_BATCH_BYTES_CONF: "0"},
        "arrow": {},
        "processes": {DRIVER_BATCH_BYTES_CONF: "0", ROW_PROCESSES_CONF: "2"},
    }[request.param]
    with _spark_conf(spark, conf):
        yield request.param


def test_small_batches_of_a_query_run_on_the_driver_and_count_exactly(spark, zk_config, tmp_path, monkeypatch, small_batch_path):
    cluster = ClusterConfig(root=tmp_path / "cluster")
    on_driver: list[int] = []
    in_arrow: list[int] = []
    in_processes: list[int] = []
    real_driver_rows, real_pool = collect_on_driver.driver_rows, row_processes_module.row_processes
    real_arrow_batch, real_processes_batch = decision.arrow_batch, decision.row_processes_batch
    monkeypatch.setattr(
        collect_on_driver, "driver_rows", lambda df, fn, agg: on_driver.append(1) or real_driver_rows(df, fn, agg)
    )
    monkeypatch.setattr(decision, "arrow_batch", lambda *a, **k: in_arrow.append(1) or real_arrow_batch(*a, **k))
    monkeypatch.setattr(decision, "row_processes_batch", lambda *a, **k: in_arrow.append(1) or real_processes_batch(*a, **k))
    monkeypatch.setattr(row_processes_module, "row_processes", lambda n: in_processes.append(n) or real_pool(n))
    planned = _count_planned_batches(monkeypatch)
    topic = FileTopic(tmp_path / "in", queues=1)
    topic.create()
    lines = [["how are you", "how"], ["you you", "nice"], ["how day", "{broken"]]

    def land(i: int) -> None:
        text = [json.dumps({"sentence": s}) if not s.startswith("{") else s for s in lines[i]]
        topic.write_lines(0, f"in-{i}.jsonl", text)

    with ZkStore.connect(zk_config) as admin, ZkStore.connect(zk_config) as store_a:
        # On the Arrow path the split is SQL, run as Arrow compute (the broken line's batch in the JVM).
        split_with = "sql" if small_batch_path == "arrow" else "row"
        wordcount = build_wordcount(tmp_path / "in", queues=1, state=TransactionalMapState, split_with=split_with)
        topology_id = submit(admin, cluster, wordcount, workers=1)
        a = make_runner(store_a, spark, cluster, topology_id, "host-a:1", stage=0, trigger_seconds=0.1)
        task = a.task.task_id
        a.start()
        land(0)
        _wait(lambda: _committed(admin, topology_id, task) == 0, "txid 0 committed")

        # A pauses before its ZooKeeper commit of txid 1 and loses the task to B.
        paused, resume = pause_commits(monkeypatch, "host-a:1", txid=1)
        land(1)
        assert paused.wait(60)
        admin.delete(ZkPaths.owner(topology_id, task))
        b = make_runner(admin, spark, cluster, topology_id, "host-b:2", stage=0, trigger_seconds=0.1)
        b.prepare()
        resume.set()
        _wait(lambda: not a.is_running(), "the zombie's query stops")
        assert "OwnershipLostError" in (a.failure() or "")
        a.stop()

        # B commits txid 1, then "crashes" before Spark logs the batch done: C replays it.
        crash_after_publish(monkeypatch, 1, OwnershipLostError("simulated crash after the ZooKeeper commit"))
        b.start_query()
        _wait(lambda: not b.is_running(), "B's query dies after committing txid 1")
        b.stop()
        c = make_runner(admin, spark, cluster, topology_id, "host-c:3", stage=0, trigger_seconds=0.1)
        c.start()
        land(2)
        _wait(lambda: _committed(admin, topology_id, task) == 2, "txid 2 committed")
        c.stop()
        stats = (a.stats.rows_in, b.stats.rows_in, c.stats.rows_in)
        shuffle = c.layout.shuffle_topic(c.plan.stage(1))
        letters = [r for _, _, r in c.layout.dead_letter_topic().read_queue(0)]

    counted: Counter[str] = Counter()
    for row in read_partials(shuffle.files(0), "long").to_pylist():
        counted[row["key"]] += row["value"]
    words = Counter(encode_key([w]) for s in ["how are you", "how", "you you", "nice", "how day"] for w in s.split(" "))
    assert counted == words
    assert [(r["record"], r["txid"]) for r in letters] == [("{broken", 2)]
    # Rows of completed batches: A txid 0, C txid 2 (B's txid 1 crashed, its replay skipped); a
    # SQL split counts the words it produces (and the broken line).
    assert stats == ((2, 0, 2) if split_with == "row" else (4, 0, 3))
    if small_batch_path == "driver":
        assert (len(on_driver), len(in_arrow)) == (4, 0), "A: txids 0 and 1 (refused), B: txid 1, C: txid 2"
        assert planned == [0, 1, 1, 2], "Spark parses every batch"
    elif small_batch_path == "arrow":
        assert (len(on_driver), len(in_arrow)) == (1, 3), "in Arrow: A's txids 0 and 1, B's txid 1; C's txid 2 has a broken line"
        assert planned == [2], "Spark plans only the batch it parses"
    else:  # C's txid 2 has a broken line: Spark's Python workers
        assert (len(on_driver), len(in_arrow), in_processes) == (0, 3, [2, 2, 2]), "A's txids 0 and 1, B's txid 1"
        assert planned == [2], "Spark plans only the batch it parses"


def _count_planned_batches(monkeypatch) -> list[int]:
    """The ids of the batches Spark plans (their ``BatchFrame``'s JVM Dataset made), in order."""
    planned: list[int] = []
    real = BatchFrame._jdf

    def jdf(frame: BatchFrame):
        if not frame.planned:
            planned.append(frame._batch_id)
        return real.fget(frame)

    monkeypatch.setattr(BatchFrame, "_jdf", property(jdf, real.fset))
    return planned


def test_a_batch_is_small_by_its_files_in_the_file_source_log(spark, tmp_path):
    files = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    for path, size in zip(files, (300, 700), strict=True):
        path.write_bytes(b"x" * size)
    log = tmp_path / "checkpoint" / "sources" / "0"
    log.mkdir(parents=True)
    entries = [{"path": path.as_uri(), "timestamp": 0, "batchId": 4} for path in files]
    (log / "4").write_text("\n".join(["v1", *map(json.dumps, entries)]), encoding="utf-8")
    batch = spark.createDataFrame(ROWS, SCHEMA)
    seen: dict[int, bool] = {}

    def decide(df, batch_id):
        seen[batch_id] = _computes_on_driver(df)

    noting = batch_inputs.noting_input_bytes(decide, tmp_path / "checkpoint")
    for limit in ("1000", "999"):
        spark.conf.set(DRIVER_BATCH_BYTES_CONF, limit)
        try:
            noting(batch, 4)
            noting(batch, 5)  # no log entry: the size is unknown
        finally:
            spark.conf.unset(DRIVER_BATCH_BYTES_CONF)
        assert seen == {4: limit == "1000", 5: False}
    assert not _computes_on_driver(batch), "noted only while its callback runs"


def _computes_on_driver(df: DataFrame) -> bool:
    """Whether the batch ``df`` is collected to the driver once an Arrow read gave it back."""
    noted = batch_inputs.noted_input(df)
    stage = build_plan(build_wordcount("/nonexistent/in", queues=1)).stage(0)
    facts = BatchFacts(
        stage, noted.bytes if noted else None, SessionSettings(df.sparkSession), arrow_refusal=ArrowRefusal.LINES_NEED_SPARK
    )
    return choose_path(facts).path is ComputePath.COLLECT_ON_DRIVER


def test_sql_that_fails_to_compile_to_arrow_runs_in_spark(spark, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("analysis went wrong")

    monkeypatch.setattr(arrow_read, "compile_arrow_sql", broken)
    monkeypatch.setattr(arrow_read, "_COMPILED", {})
    op = OperationSpec(kind="select_expr", function="", exprs=("upper(s) AS s",), fields=None, out={"s": "string"})
    assert arrow_read._compiled(SessionSettings(spark), {"s": "string"}, [op]) is None
    assert "compiling them to Arrow failed: analysis went wrong" in caplog.text


def test_sql_is_compiled_to_arrow_once_for_every_batch_of_a_query(spark, monkeypatch):
    """Each foreachBatch callback gets a new SparkSession object; the compiled SQL outlives it."""
    from pyspark.sql import SparkSession

    calls = []
    real = arrow_read.compile_arrow_sql
    monkeypatch.setattr(arrow_read, "compile_arrow_sql", lambda *a: calls.append(a) or real(*a))
    monkeypatch.setattr(arrow_read, "_COMPILED", {})
    op = OperationSpec(kind="select_expr", function="", exprs=("upper(s) AS s",), fields=None, out={"s": "string"})
    batch_sessions = [
        SparkSession(spark.sparkContext, spark._jsparkSession) for _ in range(3)
    ]  # as ForeachBatchFunction makes them
    compiled = {id(arrow_read._compiled(SessionSettings(session), {"s": "string"}, [op])) for session in batch_sessions}
    assert len(calls) == 1 and len(compiled) == 1
    ansi = spark.conf.get("spark.sql.ansi.enabled")
    spark.conf.set("spark.sql.ansi.enabled", "false" if ansi == "true" else "true")
    try:
        arrow_read._compiled(SessionSettings(spark), {"s": "string"}, [op])
    finally:
        spark.conf.set("spark.sql.ansi.enabled", ansi)
    assert len(calls) == 2, "a setting that changes what the SQL means compiles it anew"


def test_a_row_process_killed_in_a_batch_fails_it_and_the_replay_counts_once(spark, zk_config, tmp_path, monkeypatch):
    """SIGKILL of the local process a slice is sent to: the batch fails (RowProcessError),
    nothing is committed, and the task's next owner replays the batch with a new process."""
    cluster = ClusterConfig(root=tmp_path / "cluster")
    topic = FileTopic(tmp_path / "in", queues=1)
    topic.create()
    killed: list[int] = []
    real_write = row_processes_module._write_frame

    def kill_then_write(stream, data):
        if not killed:  # the first slice sent: its process is killed first, so it can never answer
            process = next(p for p in row_processes_module.row_processes(2)._all if p._popen.stdin is stream)
            os.kill(process.pid, signal.SIGKILL)
            killed.append(process.pid)
        real_write(stream, data)

    monkeypatch.setattr(row_processes_module, "_write_frame", kill_then_write)
    sentences = ["how are you", "how", "you you"]
    with _spark_conf(spark, {DRIVER_BATCH_BYTES_CONF: "0", ROW_PROCESSES_CONF: "2"}), ZkStore.connect(zk_config) as admin:
        wordcount = build_wordcount(tmp_path / "in", queues=1, state=TransactionalMapState, split_with="row")
        topology_id = submit(admin, cluster, wordcount, workers=1)
        a = make_runner(admin, spark, cluster, topology_id, "host-a:1", stage=0, trigger_seconds=0.1)
        task = a.task.task_id
        a.start()
        topic.write_lines(0, "in-0.jsonl", [json.dumps({"sentence": s}) for s in sentences])
        _wait(lambda: not a.is_running(), "the batch fails with its process")
        assert "RowProcessError" in (a.failure() or ""), a.failure()
        a.stop()
        assert killed and _committed(admin, topology_id, task) < 0, "nothing committed"
        b = make_runner(admin, spark, cluster, topology_id, "host-b:2", stage=0, trigger_seconds=0.1)
        b.start()
        _wait(lambda: _committed(admin, topology_id, task) == 0, "the replay commits txid 0")
        b.stop()
        shuffle = b.layout.shuffle_topic(b.plan.stage(1))
    counted: Counter[str] = Counter()
    for row in read_partials(shuffle.files(0), "long").to_pylist():
        counted[row["key"]] += row["value"]
    assert counted == Counter(encode_key([w]) for s in sentences for w in s.split(" "))
    assert killed[0] not in row_processes_module.row_processes(2).pids, "a new process took the dead one's place"
