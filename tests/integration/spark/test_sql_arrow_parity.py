"""Differential tests of stream_ops.compute.sql_arrow: every translated SQL operation gives in
Arrow exactly the rows, values and types Spark gives on the same records, and what has no
exact translation is refused (at compile time, or per batch with None)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession

from stream_ops.arrow_types import ARROW_TYPES
from stream_ops.compute.sql_arrow import compile_arrow_sql
from stream_ops.helpers.spark_ddl import schema_ddl
from stream_ops.spark.sql_analysis import SqlKind, analyse
from stream_ops.topology.plan import OperationSpec

Op = tuple[SqlKind, Sequence[str]]

LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1
INT_MIN, INT_MAX = -(2**31), 2**31 - 1

TEXTS = [
    None,
    "",
    " ",
    "  ",
    "a",
    "hello world",
    " lead",
    "trail ",
    "double  space",
    "  both  ",
    "a,b,,c,",
    ",",
    "x--y----z-",
    "a.b..c.",
    "ünïcödé wörds",
    "İstanbul ß Σίσυφος",
    "日本語 テキスト",
    "emoji 😀 here",
    "tab\tsep\nline",
    "\ttabbed\t ",
    " \t x \t ",
    "éaé",
    "ABC xyz",
]
ALL_FIELDS = {"s": "string", "n": "long", "i": "int", "b": "boolean", "d": "double"}


def _specs(fields: dict[str, str], ops: Sequence[Op]) -> list[OperationSpec]:
    specs = []
    for kind, exprs in ops:
        out = analyse(fields, kind, exprs, "test")
        specs.append(OperationSpec(kind=kind, function="", exprs=tuple(exprs), fields=None, out=out))
        fields = out
    return specs


def _spark_df(spark: SparkSession, fields: dict[str, str], table: pa.Table, ops: Sequence[Op]) -> DataFrame:
    df = spark.createDataFrame(table.to_pylist(), schema_ddl(fields))
    for kind, exprs in ops:
        df = df.selectExpr(*exprs) if kind == "select_expr" else df.where(exprs[0])
    return df


def _norm(value: Any) -> Any:
    """Floats by repr, so that NaN equals NaN and -0.0 differs from 0.0."""
    return ("float", repr(value)) if isinstance(value, float) else value


def _rows(rows: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
    return [tuple(_norm(v) for v in row) for row in rows]


def _arrow(spark: SparkSession, fields: dict[str, str], table: pa.Table, ops: Sequence[Op]) -> pa.Table | None:
    compiled = compile_arrow_sql(spark, fields, _specs(fields, ops))
    assert compiled is not None, f"{ops} was refused"
    return compiled.apply(table)


def assert_parity(
    spark: SparkSession, fields: dict[str, str], table: pa.Table, ops: Sequence[Op], *, ordered: bool = True
) -> pa.Table:
    """Arrow's result equals Spark's: same columns, types and rows (in order)."""
    got = _arrow(spark, fields, table, ops)
    assert got is not None, f"{ops} needed Spark"
    out = _specs(fields, ops)[-1].out
    assert got.schema == pa.schema([(name, ARROW_TYPES[typ]) for name, typ in out.items()])
    expected = _spark_df(spark, fields, table, ops).collect()
    mine, theirs = _rows([tuple(r.values()) for r in got.to_pylist()]), _rows([tuple(r) for r in expected])
    if not ordered:
        mine, theirs = sorted(mine, key=repr), sorted(theirs, key=repr)
    assert mine == theirs
    return got


def _table(fields: dict[str, str], columns: dict[str, list[Any]]) -> pa.Table:
    return pa.table({name: pa.array(columns[name], ARROW_TYPES[typ]) for name, typ in fields.items()})


@pytest.fixture(scope="module")
def mixed() -> pa.Table:
    """Rows of every field type with their edge values, nulls in each column."""
    n = len(TEXTS)
    longs = [LONG_MIN, LONG_MAX, 0, -1, 1, None, 5, 3000000000, -3000000000]
    ints = [INT_MIN, INT_MAX, 0, None, -1, 1, 5, 7]
    bools = [True, False, None]
    doubles = [math.nan, -0.0, 0.0, None, 1.5, -1.5, math.inf, -math.inf, 1e300, 5.0, -math.nan]
    return _table(
        ALL_FIELDS,
        {
            "s": TEXTS,
            "n": [longs[k % len(longs)] for k in range(n)],
            "i": [ints[k % len(ints)] for k in range(n)],
            "b": [bools[k % len(bools)] for k in range(n)],
            "d": [doubles[k % len(doubles)] for k in range(n)],
        },
    )


def test_projection_of_attributes_aliases_and_literals(spark: SparkSession, mixed: pa.Table) -> None:
    exprs = [
        "*",
        "s AS s2",
        "n AS m",
        "1 AS one",
        "3000000000 AS big",
        "'x ü' AS lit",
        "true AS t",
        "false AS f",
        "2.5D AS dd",
        "-0.0D AS negzero",
        "cast(null AS string) AS ns",
        "cast(null AS bigint) AS nl",
        "cast(null AS boolean) AS nb",
        "cast(i AS bigint) AS il",
        "cast(i AS double) AS id",
    ]
    assert_parity(spark, ALL_FIELDS, mixed, [("select_expr", exprs)])


def test_star_alone_and_empty_batch(spark: SparkSession, mixed: pa.Table) -> None:
    assert_parity(spark, ALL_FIELDS, mixed, [("select_expr", ["*"])])
    assert_parity(spark, ALL_FIELDS, mixed.slice(0, 0), [("select_expr", ["explode(split(s, ' ')) AS w", "n"])])


SPLITS = [
    "explode(split(s, ' ')) AS word",
    "explode(split(s, ',')) AS word",
    "explode(split(s, '--')) AS word",
    "explode(split(s, 'é')) AS word",
    "explode(split(s, '\\\\.')) AS word",
    "explode(split(s, ' ', 1)) AS word",
    "explode(split(s, ' ', 2)) AS word",
    "explode(split(s, ',', 0)) AS word",
    "explode(split(s, ',', -3)) AS word",
    "explode_outer(split(s, ' ')) AS word",
    "explode_outer(split(s, ' ', 2)) AS word",
    "explode(split(s, ' '))",
]


@pytest.mark.parametrize("expr", SPLITS)
def test_explode_split(spark: SparkSession, mixed: pa.Table, expr: str) -> None:
    assert_parity(spark, ALL_FIELDS, mixed, [("select_expr", [expr, "n", "s", "d"])])


def test_explode_split_alone_and_first_or_last(spark: SparkSession, mixed: pa.Table) -> None:
    assert_parity(spark, ALL_FIELDS, mixed, [("select_expr", ["explode(split(s, ' ')) AS word"])])
    assert_parity(spark, ALL_FIELDS, mixed, [("select_expr", ["b", "explode(split(s, ' ')) AS word", "upper('k') AS k"])])


def test_split_of_an_empty_string_and_nulls(spark: SparkSession) -> None:
    fields = {"s": "string"}
    table = _table(fields, {"s": ["", None, " ", "", "a"]})
    got = assert_parity(spark, fields, table, [("select_expr", ["explode(split(s, ' ')) AS w"])])
    assert got.column("w").to_pylist() == ["", "", "", "", "a"]


BOOLEAN_EXPRS = [
    "s = 'a'",
    "s <> 'a'",
    "s < 'hello'",
    "s <= 'hello world'",
    "s > 'éaé'",
    "s >= ''",
    "s > 'Z'",
    "s < '😀'",
    "s <=> 'a'",
    "s <=> null",
    "n = 0",
    "n <> 5",
    "n < 3000000000",
    "n <= -1",
    "n > i",
    "n >= i",
    "n <=> i",
    "i = 5",
    "i < 0",
    "i >= 1",
    "i <=> null",
    "b = true",
    "b < true",
    "b >= false",
    "b <=> false",
    "b",
    "not b",
    "b and n > 0",
    "b or n > 0",
    "not (b or n > 0)",
    "b and (s is null or i is not null)",
    "s is null",
    "s is not null",
    "n is null",
    "d is null",
    "d is not null",
    "d = 0.0",
    "d = -0.0D",
    "d <> 5",
    "d < 0",
    "d <= 1.5",
    "d > 0.1",
    "d < 123456789.000001",
    "d > -1e308D",
    "d >= cast('NaN' AS double)",
    "d = cast('NaN' AS double)",
    "d <=> 1.5D",
    "d = d",
    "d <> d",
    "d < d",
    "d >= d",
    "d <=> d",
    "d > 1.0E300D",
    "d < 'Infinity'",
    "true",
    "null and false",
    "cast(null AS boolean) or true",
]
"""Conditions Arrow translates; a few (casts of string literals) are expected to be refused."""

REFUSED_CONDITIONS = {"d >= cast('NaN' AS double)", "d = cast('NaN' AS double)", "d < 'Infinity'"}


def test_conditions_as_values(spark: SparkSession, mixed: pa.Table) -> None:
    """Three-valued logic, null-safe equality and the orderings, as projected booleans (one
    Spark job for all)."""
    supported = [e for e in BOOLEAN_EXPRS if e not in REFUSED_CONDITIONS]
    exprs = [f"{e} AS c{k}" for k, e in enumerate(supported)]
    assert_parity(spark, ALL_FIELDS, mixed, [("select_expr", ["s", "n", "i", "b", "d", *exprs])])
    for condition in REFUSED_CONDITIONS:  # a cast from a string
        assert compile_arrow_sql(spark, ALL_FIELDS, _specs(ALL_FIELDS, [("where", [condition])])) is None


@pytest.mark.parametrize(
    "condition",
    [
        "b",
        "not b",
        "b or s < 'm'",
        "s is not null and n > 0",
        "d > 0 or d = -0.0D",
        "d < 1.5D and not b",
        "n <=> null or i <=> 5",
        "true",
        "false",
        "null and true",
    ],
)
def test_where(spark: SparkSession, mixed: pa.Table, condition: str) -> None:
    assert_parity(spark, ALL_FIELDS, mixed, [("where", [condition])])


def test_string_functions(spark: SparkSession, mixed: pa.Table) -> None:
    exprs = [
        "s",
        "length(s) AS len",
        "char_length(s) AS clen",
        "trim(s) AS t",
        "ltrim(s) AS lt",
        "rtrim(s) AS rt",
        "trim(BOTH 'x-' FROM s) AS tx",
        "concat(s, '|', s) AS c",
        "concat(s) AS c1",
        "s || '!' AS c2",
        "length('😀é') AS lit_len",
    ]
    assert_parity(spark, ALL_FIELDS, mixed, [("select_expr", exprs)])


def test_lower_upper_on_ascii_batches(spark: SparkSession) -> None:
    fields = {"s": "string"}
    ascii_ = _table(fields, {"s": ["Hello World", None, "", "MiXeD 123 !?", "already lower", "tab\tX"]})
    assert_parity(spark, fields, ascii_, [("select_expr", ["lower(s) AS l", "upper(s) AS u", "s"])])
    assert_parity(spark, fields, ascii_, [("where", ["lower(s) = 'hello world' or upper(s) > 'B'"])])


@pytest.mark.parametrize("text", ["İstanbul", "straße", "ΣΊΣΥΦΟΣ", "ünï"])
def test_lower_upper_need_spark_for_non_ascii(spark: SparkSession, text: str) -> None:
    fields = {"s": "string"}
    for expr in ("lower(s) AS x", "upper(s) AS x"):
        compiled = compile_arrow_sql(spark, fields, _specs(fields, [("select_expr", [expr])]))
        assert compiled is not None
        assert compiled.apply(_table(fields, {"s": ["plain", text, None]})) is None
        assert compiled.apply(_table(fields, {"s": ["plain", None]})) is not None


ARITHMETIC: list[tuple[str, Callable[[int, int], int], int]] = [
    ("n + 1 AS a", lambda n, i: n + 1, 64),
    ("n - 7 AS b", lambda n, i: n - 7, 64),
    ("n * 3 AS c", lambda n, i: n * 3, 64),
    ("-n AS d", lambda n, i: -n, 64),
    ("n + n AS e", lambda n, i: n + n, 64),
    ("i + 1 AS f", lambda n, i: i + 1, 32),
    ("i * i AS g", lambda n, i: i * i, 32),
    ("n - i AS h", lambda n, i: n - i, 64),
    ("-i AS k", lambda n, i: -i, 32),
]
"""Expressions with their exact value over Python integers and the width of their type."""


def test_ansi_arithmetic(spark: SparkSession) -> None:
    """Checked arithmetic: exact values, and None for a batch on which Spark raises."""
    assert spark.conf.get("spark.sql.ansi.enabled") == "true"
    fields = {"n": "long", "i": "int"}
    safe = _table(fields, {"n": [0, -5, None, 10**15, -(10**15), 3], "i": [7, None, -46340, 46340, 0, -1]})
    assert_parity(spark, fields, safe, [("select_expr", [expr for expr, _, _ in ARITHMETIC])])
    edges = [(LONG_MAX, 0), (LONG_MIN, 0), (0, INT_MAX), (0, INT_MIN), (LONG_MAX // 2, 0), (LONG_MIN // 3, 1), (LONG_MIN, 1)]
    edge_table = _table(fields, {"n": [n for n, _ in edges], "i": [i for _, i in edges]})
    for expr, exact, bits in ARITHMETIC:
        compiled = compile_arrow_sql(spark, fields, _specs(fields, [("select_expr", [expr])]))
        assert compiled is not None
        fits = [-(2 ** (bits - 1)) <= exact(n, i) < 2 ** (bits - 1) for n, i in edges]
        assert not all(fits), f"no edge overflows {expr}"
        with pytest.raises(PySparkException):
            _spark_df(spark, fields, edge_table, [("select_expr", [expr])]).collect()
        assert compiled.apply(edge_table) is None
        for (n, i), fit in zip(edges, fits, strict=True):
            got = compiled.apply(_table(fields, {"n": [n], "i": [i]}))
            if fit:
                assert got is not None and got.column(0).to_pylist() == [exact(n, i)], (expr, n, i)
            else:
                assert got is None, (expr, n, i)


@contextmanager
def _ansi_off(spark: SparkSession) -> Iterator[None]:
    spark.conf.set("spark.sql.ansi.enabled", "false")
    try:
        yield
    finally:
        spark.conf.set("spark.sql.ansi.enabled", "true")


def test_wrapping_arithmetic_without_ansi(spark: SparkSession) -> None:
    fields = {"n": "long", "i": "int"}
    table = _table(fields, {"n": [LONG_MAX, LONG_MIN, None, 3, LONG_MAX // 2], "i": [INT_MAX, INT_MIN, 5, None, 46341]})
    with _ansi_off(spark):
        got = assert_parity(spark, fields, table, [("select_expr", [expr for expr, _, _ in ARITHMETIC])])
    assert got.column("a")[0].as_py() == LONG_MIN  # it did wrap


def test_refused_at_compile_time(spark: SparkSession) -> None:
    refused: list[tuple[dict[str, str], Op]] = [
        ({"s": "string"}, ("select_expr", ["explode(split(s, '[ ,]')) AS w"])),
        ({"s": "string"}, ("select_expr", ["explode(split(s, 'a|b')) AS w"])),
        ({"s": "string"}, ("select_expr", ["explode(split(s, '')) AS w"])),
        ({"s": "string"}, ("select_expr", ["explode(split(s, '\\\\s')) AS w"])),
        ({"s": "string"}, ("select_expr", ["rand() AS r"])),
        ({"s": "string"}, ("select_expr", ["sha2(s, 256) AS h"])),
        ({"s": "string"}, ("select_expr", ["initcap(s) AS h"])),
        ({"s": "string"}, ("where", ["s = 1"])),  # an ANSI cast of the string to bigint
        ({"s": "string"}, ("where", ["s like 'a%'"])),
        ({"s": "string"}, ("where", ["s = 'A' COLLATE UTF8_LCASE"])),
        ({"s": "string"}, ("where", ["lower(s COLLATE UNICODE_CI) = 'a'"])),
        ({"n": "long"}, ("select_expr", ["n / 2 AS h"])),
        ({"n": "long"}, ("select_expr", ["n % 2 AS h"])),
        ({"n": "long"}, ("select_expr", ["concat('x', n) AS h"])),
        ({"n": "long"}, ("where", ["n in (1, 2)"])),
        ({"d": "double"}, ("select_expr", ["d + 1 AS h"])),
        ({"d": "double"}, ("where", ["d < 0.12345678901234567890"])),  # more digits than a double holds exactly
        ({"d": "double"}, ("select_expr", ["cast(d AS bigint) AS h"])),
        ({"s": "string"}, ("select_expr", ["explode(array(s, s)) AS w"])),
        ({"s": "string"}, ("select_expr", ["posexplode(split(s, ' '))"])),
    ]
    for fields, op in refused:
        assert compile_arrow_sql(spark, fields, _specs(fields, [op])) is None, op
    fields = {"s": "string"}
    assert compile_arrow_sql(spark, fields, _specs(fields, [("select_expr", ["s"]), ("where", ["rand() > 0.5"])])) is None


def test_chain_of_operations(spark: SparkSession, mixed: pa.Table) -> None:
    ops: list[Op] = [
        ("select_expr", ["explode(split(s, ' ')) AS word", "n", "i AS k"]),
        ("where", ["word <> '' and (n > 0 or k is null)"]),
        ("select_expr", ["trim(word) AS w", "length(word) AS len", "n + 1 AS n1"]),
        ("where", ["len >= 2"]),
    ]
    assert_parity(spark, ALL_FIELDS, mixed.filter(pa.compute.not_equal(mixed["n"], LONG_MAX)), ops)


def test_batch_needing_spark_mid_chain_and_wrong_input_types(spark: SparkSession) -> None:
    fields = {"s": "string", "n": "long"}
    specs = _specs(fields, [("where", ["n > 0"]), ("select_expr", ["n * 2 AS m", "s"])])
    compiled = compile_arrow_sql(spark, fields, specs)
    assert compiled is not None
    assert compiled.apply(_table(fields, {"s": ["a", "b"], "n": [-1, LONG_MAX]})) is None
    assert compiled.apply(_table(fields, {"s": ["a", "b"], "n": [LONG_MAX, 1]})) is None
    assert compiled.apply(_table(fields, {"s": ["a", "b"], "n": [-LONG_MAX, 1]})) == pa.table({"m": [2], "s": ["b"]})
    assert compiled.apply(pa.table({"s": ["a"], "n": pa.array([1], pa.int32())})) is None
    assert compiled.apply(pa.table({"s": ["a"]})) is None
    chunked = pa.concat_tables([_table(fields, {"s": ["a"], "n": [1]}), _table(fields, {"s": ["b"], "n": [2]})])
    assert compiled.apply(chunked) == pa.table({"m": [2, 4], "s": ["a", "b"]})


WORDS = ["the", "a", "", "ünï", "ßtraße", "İ", "日本", "😀", "x,y", "end.", "Σ"]


def test_fuzz_word_count(spark: SparkSession) -> None:
    rng = random.Random(20261127)
    sentences: list[str | None] = []
    for _ in range(400):
        if rng.random() < 0.05:
            sentences.append(None)
            continue
        words = [rng.choice(WORDS) for _ in range(rng.randint(0, 8))]
        seps = [rng.choice([" ", " ", " ", "  ", "\t"]) for _ in words]
        text = "".join(w + s for w, s in zip(words, seps, strict=True))
        sentences.append(text[: rng.randint(0, len(text))] if rng.random() < 0.3 else text)
    fields = {"sentence": "string", "n": "long"}
    table = _table(fields, {"sentence": sentences, "n": list(range(len(sentences)))})
    assert_parity(spark, fields, table, [("select_expr", ["explode(split(sentence, ' ')) AS word"])])
    assert_parity(
        spark, fields, table, [("select_expr", ["explode(split(sentence, ' ')) AS word", "n"]), ("where", ["word <> ''"])]
    )


def test_fuzz_compound_where(spark: SparkSession) -> None:
    rng = random.Random(7)
    rows = 300

    def maybe(value: Any) -> Any:
        return None if rng.random() < 0.15 else value

    columns = {
        "s": [maybe(rng.choice(WORDS + ["m", "M", "zz"])) for _ in range(rows)],
        "n": [maybe(rng.choice([LONG_MIN, LONG_MAX, 0, rng.randint(-10, 10)])) for _ in range(rows)],
        "i": [maybe(rng.choice([INT_MIN, INT_MAX, rng.randint(-10, 10)])) for _ in range(rows)],
        "b": [maybe(rng.random() < 0.5) for _ in range(rows)],
        "d": [maybe(rng.choice([math.nan, -0.0, 0.0, math.inf, -math.inf, rng.uniform(-5, 5)])) for _ in range(rows)],
    }
    table = _table(ALL_FIELDS, columns)
    condition = "(n > i or s < 'm') and not (b <=> false) or (d >= 0.0 and s is not null) or (i = 3 and not (d < 1.5D or b))"
    assert_parity(spark, ALL_FIELDS, table, [("where", [condition])])
    condition = "not (s >= 'a' and n <> 0) or (d <=> -0.0D and i <= 0) or (b and d > 'NaN') or n <=> null"
    specs_refused = compile_arrow_sql(spark, ALL_FIELDS, _specs(ALL_FIELDS, [("where", [condition])]))
    assert specs_refused is None  # the string 'NaN' is cast to double
    condition = "not (s >= 'a' and n <> 0) or (d <=> -0.0D and i <= 0) or (b and d > 1e308D) or n <=> null"
    assert_parity(spark, ALL_FIELDS, table, [("where", [condition])])
