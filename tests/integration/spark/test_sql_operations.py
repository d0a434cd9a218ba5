"""Spark SQL operations (``select_expr``, ``where``): analysed by Spark at definition time, run
in the JVM on the source stage, exactly once through a zombie owner and a replayed batch, and
a record that makes an expression fail goes to the dead letters while the others go on."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import duckdb
import pytest

from stream_ops import FileTopic, Topology
from stream_ops.config import ClusterConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import OwnershipLostError, TopologyDefinitionError
from stream_ops.nimbus.submission import submit

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from runners import make_runner, pause_commits

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "security"))

SOURCE = "sentence string, n string, _corrupt_record string"


def _shout(text: str) -> str:
    return text.upper()


def _source(tmp_path: Path, name: str = "sql") -> tuple[Topology, object]:
    t = Topology(name)
    return t, t.source("lines", FileTopic(tmp_path / "in", 1), schema={"sentence": "string", "n": "string"})


def test_fields_and_types_come_from_sparks_analysis(spark, tmp_path, monkeypatch):
    monkeypatch.setenv("STREAM_OPS_CACHE", str(tmp_path / "cache"))
    _, lines = _source(tmp_path)
    words = lines.select_expr("explode(split(sentence, ' ')) AS word", "length(sentence) AS size", "cast(n AS long) AS n")
    assert words._fields == {"word": "string", "size": "int", "n": "long"}
    kept = words.where("size > 3 AND word <> ''")
    assert kept._fields == words._fields
    _, other = _source(tmp_path, "nested")
    nested = other.select_expr("named_struct('text', sentence) AS doc", "split(sentence, ' ') AS parts")
    assert nested._fields == {"doc": "struct<text:string>", "parts": "array<string>"}
    assert (tmp_path / "cache" / "sql-analysis.json").exists(), "analyses are cached for the next load"


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda s: s.select_expr("upper(sentense) AS loud"), r"cannot analyse 'upper\(sentense\) AS loud'"),
        (lambda s: s.select_expr("explode(split(sentence, ' ') AS word"), "cannot analyse"),
        (lambda s: s.where("length(sentence)"), "cannot analyse 'length"),
        (lambda s: s.select_expr("current_timestamp() AS at"), "'at' is timestamp"),
        (lambda s: s.select_expr("sentence", "n AS sentence"), "two expressions give the field 'sentence'"),
        (lambda s: s.select_expr(""), "non-empty strings"),
        (lambda s: s.map(_shout, out="x", fields=["sentence"]).select_expr("x"), "must come first"),
        (lambda s: s.partition_by("n").select_expr("n"), "reads a shuffle"),
        (lambda s: (s.select_expr("sentence"), s.select_expr("n"))[1], "one chain"),
    ],
)
def test_bad_expressions_fail_at_definition_time_naming_them(spark, tmp_path, monkeypatch, build, message):
    monkeypatch.setenv("STREAM_OPS_CACHE", str(tmp_path / "cache"))
    _, lines = _source(tmp_path)
    with pytest.raises(TopologyDefinitionError, match=message):
        build(lines)


def _words(tmp_path: Path) -> Topology:
    t, lines = _source(tmp_path, "sql-words")
    words = lines.select_expr("explode(split(sentence, ' ')) AS word", "cast(n AS int) AS n").where("length(word) > 1")
    words.to_parquet(tmp_path / "words", name="words")
    return t


def _batch(spark, *rows):
    return spark.createDataFrame([(*row, None) for row in rows], SOURCE)


def _written(tmp_path: Path) -> list[tuple]:
    root = tmp_path / "words"
    if not list(root.rglob("*.parquet")):
        return []
    return sorted(duckdb.sql(f"select word, n from read_parquet('{root}/**/*.parquet')").fetchall())


def test_sql_operations_write_each_record_once_through_a_zombie_and_a_replay(spark, zk_config, tmp_path, monkeypatch):
    monkeypatch.setenv("STREAM_OPS_CACHE", str(tmp_path / "cache"))
    cluster = ClusterConfig(root=tmp_path / "cluster")
    with ZkStore.connect(zk_config) as admin, ZkStore.connect(zk_config) as store_a:
        topology_id = submit(admin, cluster, _words(tmp_path), workers=1)
        a = make_runner(store_a, spark, cluster, topology_id, "host-a:1", stage="lines")
        a.prepare()
        a.process_batch(_batch(spark, ("how are you", "1"), ("a b", "2")), 0)
        paused, resume = pause_commits(monkeypatch, "host-a:1")
        errors: list[BaseException] = []

        def run_a():
            try:
                a.process_batch(_batch(spark, ("zombie words", "9")), 1)
            except BaseException as e:  # noqa: BLE001 - the test inspects it
                errors.append(e)

        thread = threading.Thread(target=run_a)
        thread.start()
        assert paused.wait(60)
        admin.delete(ZkPaths.owner(topology_id, a.task.task_id))
        b = make_runner(admin, spark, cluster, topology_id, "host-b:2", stage="lines")
        b.prepare()
        b.process_batch(_batch(spark, ("fine thanks", "3")), 1)
        b.process_batch(_batch(spark, ("fine thanks", "3")), 1)  # Spark re-delivers the committed batch
        resume.set()
        thread.join(30)
        assert len(errors) == 1 and isinstance(errors[0], OwnershipLostError)
        b.stop()
        a._close_state()
    assert _written(tmp_path) == [("are", 1), ("fine", 3), ("how", 1), ("thanks", 3), ("you", 1)]


def test_a_record_that_makes_an_expression_fail_is_a_dead_letter_and_the_rest_go_on(spark, zk_config, tmp_path, monkeypatch):
    monkeypatch.setenv("STREAM_OPS_CACHE", str(tmp_path / "cache"))
    cluster = ClusterConfig(root=tmp_path / "cluster")
    ansi = spark.conf.get("spark.sql.ansi.enabled")
    spark.conf.set("spark.sql.ansi.enabled", "true")  # casts of bad numbers fail instead of giving null
    try:
        _run_with_a_failing_record(spark, zk_config, tmp_path, cluster)
    finally:
        spark.conf.set("spark.sql.ansi.enabled", ansi)


def _run_with_a_failing_record(spark, zk_config, tmp_path, cluster):
    with ZkStore.connect(zk_config) as admin:
        topology_id = submit(admin, cluster, _words(tmp_path), workers=1)
        runner = make_runner(admin, spark, cluster, topology_id, "host-a:1", stage="lines")
        runner.prepare()
        rows = [("good words", "1"), ("bad number", "one"), ("more words", "2")]
        batch = spark.createDataFrame([*[(*r, None) for r in rows], (None, None, '{"sentence": broken')], SOURCE)
        runner.process_batch(batch, 0)
        runner.stop()
        letters = [record for q in range(1) for _, _, record in runner.layout.dead_letter_topic().read_queue(q)]
    assert _written(tmp_path) == [("good", 1), ("more", 2), ("words", 1), ("words", 2)]
    errors = sorted(letter["error"].split(":")[0] for letter in letters)
    assert errors == ["SQL operation", "does not parse against the source schema"], letters
    failed = next(letter for letter in letters if letter["error"].startswith("SQL operation"))
    assert failed["record"]["n"] == "one"


def _partials(spark, topology: Topology, rows: list[tuple]):
    from stream_ops.compute.decision import source_batch
    from stream_ops.dsl.build_plan import build_plan

    result = source_batch(spark.createDataFrame(rows, SOURCE), build_plan(topology).stage(0))
    return sorted(result.outputs[0]), sorted(d["record"] for d in result.dead_letters), result.input_rows


def _counted(tmp_path: Path, name: str, words) -> Topology:
    from stream_ops import Count, OpaqueMapState

    t = Topology(name)
    source = t.source("lines", FileTopic(tmp_path / name, 1), schema={"sentence": "string", "n": "string"})
    key = words(source)
    key[0].group_by(key[1]).persistent_aggregate(Count(), out="count", state=OpaqueMapState)
    return t


def test_counts_computed_in_the_jvm_and_in_arrow_equal_the_python_paths_keys(spark, tmp_path, monkeypatch):
    from stream_ops.examples.wordcount import split, split_batch

    monkeypatch.setenv("STREAM_OPS_CACHE", str(tmp_path / "cache"))
    rows = [
        ("héllo wörld héllo", "1"),
        ('quote" back\\slash tab\tend esc\x1bape', "1.0"),
        ("", "-0.0"),
        ("x", "0"),
        ("y", "2.5"),
        ("z", None),
    ]
    rows = [(*r, None) for r in rows] + [(None, None, '{"sentence": broken')]
    in_jvm = _counted(tmp_path, "jvm", lambda s: (s.select_expr("explode(split(sentence, ' ')) AS word"), "word"))
    in_python = _counted(tmp_path, "py", lambda s: (s.each(split, out="word", fields=["sentence"]), "word"))
    in_arrow = _counted(tmp_path, "arrow", lambda s: (s.map_batches(split_batch, schema={"word": "string"}), "word"))
    jvm, python, arrow = (_partials(spark, t, rows) for t in (in_jvm, in_python, in_arrow))
    assert jvm[:2] == python[:2] == arrow[:2]
    assert arrow[2] == 7, "Arrow counted the words of the 7 lines read"
    assert (jvm[2], python[2]) == (12, 7), "Spark counted 11 words and a bad line alone; Python read 7 lines"
    assert ('["héllo"]', 2) in jvm[0] and ('["esc\\u001bape"]', 1) in jvm[0] and jvm[1] == ['{"sentence": broken']
    doubles = _counted(tmp_path, "doubles", lambda s: (s.select_expr("cast(n AS double) AS x"), "x"))
    # 1 and 1.0 are the key 1, 0 and -0.0 the key 0, as encode_key has them
    assert _partials(spark, doubles, rows[:-1]) == ([("[0]", 2), ("[1]", 2), ("[2.5]", 1), ("[null]", 1)], [], 6)


BATCH_OPS = """
import pyarrow as pa
import pyarrow.compute as pc


def shout(batch):
    if "boom" in batch.column("sentence").to_pylist():
        raise ValueError("cannot shout boom")
    words = pc.list_flatten(pc.split_pattern(batch.column("sentence"), " "))
    return pa.table({"word": pc.utf8_upper(words), "extra": words})
"""


def test_map_batches_isolates_failing_rows_and_counts_the_rest_once(spark, zk_config, tmp_path, monkeypatch):
    from user_packages import forget, import_ops, write_package

    monkeypatch.setenv("STREAM_OPS_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "src"
    write_package(src, "batchpkg", "v1", extra={"batches.py": BATCH_OPS})
    import_ops(src, "batchpkg")
    sys.path.insert(0, str(src))
    try:
        import importlib

        ops = importlib.import_module("batchpkg.batches")
    finally:
        sys.path.remove(str(src))
    cluster = ClusterConfig(root=tmp_path / "cluster")
    t, lines = _source(tmp_path, "batches")
    lines.where("sentence <> 'skip me'").map_batches(ops.shout, schema={"word": "string"}).to_parquet(
        tmp_path / "words", name="words"
    )
    try:
        with ZkStore.connect(zk_config) as admin:
            topology_id = submit(admin, cluster, t, workers=1)
            forget("batchpkg")  # the runner loads it from the code archive only
            runner = make_runner(admin, spark, cluster, topology_id, "host-a:1", stage="lines")
            runner.prepare()
            rows = [("how are", "1"), ("boom", "2"), ("skip me", "3"), ("you", "4")]
            batch = spark.createDataFrame([*[(*r, None) for r in rows], (None, None, "{broken")], SOURCE).coalesce(1)
            runner.process_batch(batch, 0)
            runner.process_batch(batch, 0)  # a replay of the committed batch writes nothing twice
            runner.stop()
            letters = [record for _, _, record in runner.layout.dead_letter_topic().read_queue(0)]
    finally:
        forget("batchpkg")
    root = tmp_path / "words"
    assert sorted(duckdb.sql(f"select word from read_parquet('{root}/**/*.parquet')").fetchall()) == [
        ("ARE",),
        ("HOW",),
        ("YOU",),
    ]
    errors = sorted(letter["error"] for letter in letters)
    assert errors == [
        "does not parse against the source schema",
        "map_batches batchpkg.batches:shout: ValueError: cannot shout boom",
    ], letters
