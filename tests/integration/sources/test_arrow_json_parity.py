"""The pyarrow fast path for JSON lines against Spark's own reader: whenever ``read_json_lines``
gives a table, Spark reads the same files to the same rows without a corrupt record, over a
corpus of edge cases and a seeded random fuzz corpus; and ordinary clean data takes the fast path."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from stream_ops.helpers.spark_ddl import schema_ddl
from stream_ops.sources import CORRUPT_COLUMN
from stream_ops.sources.arrow_json import read_json_lines

FIELDS = {"s": "string", "n": "long", "i": "int", "d": "double", "b": "boolean"}

# (case, file content, whether the fast path must take it). Cases that must be taken are the
# ordinary ones; for the rest only parity is asserted (a table, if any, equals Spark's rows).
EDGE_CASES: list[tuple[str, bytes, bool]] = [
    ("all types", b'{"s":"a","n":1,"i":2,"d":1.5,"b":true}\n', True),
    ("keys in another order", b'{"b":false,"d":-2.25,"i":-7,"n":-9,"s":"z"}\n', True),
    ("missing fields", b'{"s":"only"}\n', True),
    ("empty object", b"{}\n", True),
    ("nulls", b'{"s":null,"n":null,"i":null,"d":null,"b":null}\n', True),
    ("unknown fields", b'{"x":{"y":[1,2,{"z":null}]},"s":"k","w":"v"}\n', True),
    ("blank lines", b'\n{"s":"a"}\n\n\n{"s":"b"}\n\n', True),
    ("no final newline", b'{"s":"a"}\n{"n":2}', True),
    ("empty file", b"", True),
    ("only blank lines", b"\n\n\n", True),
    ("whitespace inside", b'{ "s" : "a" ,\t"n" :\t3 }\n', True),
    ("escapes", b'{"s":"q\\"b\\\\s\\/n\\nt\\tr\\rb\\bf\\f"}\n', True),
    ("unicode escapes", b'{"s":"\\u00e9\\u4e2d\\ud83d\\ude00\\u0000"}\n', True),
    ("raw unicode", '{"s":"é中😀 ünï"}\n'.encode(), True),
    ("escaped key", b'{"\\u0073":"k"}\n', True),
    ("double from int", b'{"d":1}\n', True),
    ("minus zero", b'{"n":-0,"i":-0,"d":0}\n{"d":-0.0}\n', False),
    ("integer minus zero", b'{"n":-0,"i":-0,"d":0}\n', True),
    ("double minus zero", b'{"d":-0.0}\n', True),
    ("integer minus zero for double", b'{"d":-0}\n', False),
    ("integer minus zero elsewhere", b'{"d":-0.0,"n":-0}\n', False),
    ("minus zero with exponent", b'{"d":-0e0}\n{"d":-0E+1}\n{"d":-0.0e-5}\n', True),
    ("int bounds", b'{"i":2147483647}\n{"i":-2147483648}\n', True),
    ("long bounds", b'{"n":9223372036854775807}\n{"n":-9223372036854775808}\n', True),
    ("double extremes", b'{"d":1.7976931348623157e308}\n{"d":5e-324}\n{"d":1e-400}\n{"d":2.2250738585072011e-308}\n', True),
    ("double exponent forms", b'{"d":1E+2}\n{"d":1e-2}\n{"d":0e0}\n{"d":123.456e7}\n', True),
    ("double from big int", b'{"d":123456789012345678901234567890}\n{"d":9007199254740993}\n', True),
    ("double rounding", b'{"d":0.1}\n{"d":2.0000000000000004440892098500626}\n{"d":1.00000000000000011102230246251565}\n', True),
    ("duplicate unknown key", b'{"x":1,"x":2,"s":"a"}\n', False),
    ("case differs", b'{"S":"a","s":"b"}\n', False),
    ("null line first", b'null\n{"s":"a"}\n', False),
    ("null line later", b'{"s":"a"}\nnull\n', False),
    ("two objects on a line", b'{"s":"a"}{"s":"b"}\n', False),
    ("two objects with space", b'{"s":"a"} {"s":"b"}\n', False),
    ("trailing garbage", b'{"s":"a"} x}\n', False),
    ("duplicate key", b'{"s":"a","s":"b"}\n', False),
    ("number for string", b'{"s":5}\n', False),
    ("object for string", b'{"s":{"a":1}}\n', False),
    ("array for string", b'{"s":[1]}\n', False),
    ("bool for string", b'{"s":true}\n', False),
    ("float for long", b'{"n":1.0}\n', False),
    ("exponent for long", b'{"n":1e2}\n', False),
    ("string for long", b'{"n":"1"}\n', False),
    ("empty string for long", b'{"n":""}\n', False),
    ("empty string for int", b'{"i":""}\n', False),
    ("empty string for double", b'{"d":""}\n', False),
    ("empty string for bool", b'{"b":""}\n', False),
    ("string for double", b'{"d":"1.5"}\n', False),
    ("Infinity string for double", b'{"d":"Infinity"}\n{"d":"-Infinity"}\n{"d":"INF"}\n', False),
    ("string false for bool", b'{"b":"false"}\n', False),
    ("bool for long", b'{"n":true}\n', False),
    ("object for long", b'{"n":{}}\n', False),
    ("array for double", b'{"d":[1]}\n', False),
    ("null for every type", b'{"s":null}\n{"n":null,"i":null}\n{"d":null,"b":null}\n', True),
    ("long overflow", b'{"n":9223372036854775808}\n', False),
    ("int overflow", b'{"i":2147483648}\n', False),
    ("int underflow", b'{"i":-2147483649}\n', False),
    ("leading zero", b'{"n":01}\n', False),
    ("leading zero unknown", b'{"x":01,"s":"a"}\n', False),
    ("leading plus", b'{"d":+1}\n', False),
    ("bare dot", b'{"d":.5}\n', False),
    ("trailing dot", b'{"d":1.}\n', False),
    ("double overflow", b'{"d":1e309}\n', False),
    ("double just over max", b'{"d":1.7976931348623159e308}\n', False),
    ("string for bool", b'{"b":"true"}\n', False),
    ("number for bool", b'{"b":1}\n', False),
    ("capital True", b'{"b":True}\n', False),
    ("NaN string", b'{"d":"NaN"}\n', False),
    ("NaN token", b'{"d":NaN}\n', False),
    ("Infinity token", b'{"d":Infinity}\n{"d":-Infinity}\n', False),
    ("NaN token unknown", b'{"x":NaN,"s":"a"}\n', False),
    ("INF token unknown", b'{"x":-INF,"s":"a"}\n', False),
    ("single quotes", b"{'s':'a'}\n", False),
    ("escaped duplicate key", b'{"s":"a","\\u0073":"b"}\n', False),
    ("duplicate key null first", b'{"s":null,"s":"b"}\n', False),
    ("duplicate key null last", b'{"s":"a","s":null}\n', False),
    ("known key nested only", b'{"x":{"s":"z","n":"q"},"n":1}\n', True),
    ("plus Infinity", b'{"d":+Infinity}\n', False),
    ("Inf in unknown", b'{"x":Inf,"s":"a"}\n', False),
    ("minus Inf in array", b'{"x":[1, -Inf],"s":"a"}\n', False),
    ("minus NaN in unknown", b'{"x":-NaN,"s":"a"}\n', False),
    ("Inf words in a string", b'{"s":"Infinite Inflation: Info-Inf"}\n', False),
    ("Inf words in a string, not after a colon", b'{"s":"Infinite Inflation of Info-Inf"}\n', True),
    ("Inf", b'{"d":Inf}\n', False),
    ("NaN for long", b'{"n":NaN}\n', False),
    ("NaN for int", b'{"i":NaN}\n', False),
    ("NaN for string", b'{"s":NaN}\n', False),
    ("NaN for bool", b'{"b":NaN}\n', False),
    ("minus NaN", b'{"d":-NaN}\n', False),
    ("negative underflow", b'{"d":-1e-400}\n', False),
    ("huge exponent", b'{"d":1e0000000000000000001}\n{"d":0e99999}\n{"d":0.0e-99999}\n', False),
    ("exponent overflow to zero", b'{"d":1e-99999999999}\n', False),
    ("null string key", b'{"s":"a","n":null,"x":null}\n', True),
    ("empty string", b'{"s":""}\n', True),
    ("escaped slash and unicode key", b'{"\\u00e9":1,"s":"\\/"}\n', True),
    ("single quoted value", b"{\"s\":'a'}\n", False),
    ("unquoted name", b'{s:"a"}\n', False),
    ("comment", b'{"s":"a"/* c */}\n', False),
    ("trailing comma", b'{"s":"a",}\n', False),
    ("bad escape", b'{"s":"\\q"}\n', False),
    ("lone surrogate", b'{"s":"\\ud800"}\n', False),
    ("lone low surrogate", b'{"s":"\\udc00x"}\n', False),
    ("raw tab in string", b'{"s":"a\tb"}\n', False),
    ("raw NUL in string", b'{"s":"a\x00b"}\n', False),
    ("NUL after object", b'{"s":"a"}\x00\n', False),
    ("CRLF", b'{"s":"a"}\r\n{"s":"b"}\r\n', False),
    ("CR inside", b'{"s":"a",\r"n":1}\n', False),
    ("leading space", b' {"s":"a"}\n', False),
    ("trailing space", b'{"s":"a"} \n', False),
    ("whitespace-only line", b'{"s":"a"}\n   \n', False),
    ("BOM", b'\xef\xbb\xbf{"s":"a"}\n', False),
    ("invalid UTF-8 in value", b'{"s":"\xff"}\n', False),
    ("invalid UTF-8 in unknown", b'{"x":"\xc3\x28","s":"a"}\n', False),
    ("invalid UTF-8 in key", b'{"\xff":1}\n', False),
    ("overlong UTF-8", b'{"s":"\xc0\xaf"}\n', False),
    ("UTF-8 surrogate", b'{"s":"\xed\xa0\x80"}\n', False),
    ("NBSP as whitespace", '{"s":"a",\u00a0"n":1}\n'.encode(), False),
    ("top-level array", b'[{"s":"a"},{"s":"b"}]\n', False),
    ("top-level string", b'"a"\n', False),
    ("unterminated", b'{"s":"a"\n', False),
    ("object split over lines", b'{"s":\n"a"}\n', False),
    ("unterminated string brace", b'{"s":"}\n{"s":"a"}\n', False),
    ("nested 900", b'{"x":' + b"[" * 899 + b"]" * 899 + b',"s":"a"}\n', False),
    ("nested 1100", b'{"x":' + b"[" * 1099 + b"]" * 1099 + b',"s":"a"}\n', False),
    ("number of 999 digits", b'{"x":' + b"9" * 999 + b',"s":"a"}\n', False),
    (
        "number of 330 digits",
        b'{"x":' + b"9" * 330 + b',"s":"a","d":-' + b"1" * 330 + b"." + b"2" * 300 + b"e-" + b"3" * 330 + b"}\n",
        True,
    ),
    ("name of 49000 characters", b'{"' + b"k" * 49000 + b'":1,"s":"a"}\n', True),
    ("number of 1001 digits", b'{"x":' + b"9" * 1001 + b',"s":"a"}\n', False),
    ("double of 1001 digits", b'{"d":0.' + b"1" * 1001 + b"}\n", False),
    ("name of 60000 characters", b'{"' + b"k" * 60000 + b'":1,"s":"a"}\n', False),
    ("string of 2 MiB", b'{"s":"' + b"ab" * (1 << 20) + b'"}\n', True),
    ("string of 5 MiB among short lines", b'{"s":"a"}\n{"s":"' + b"x" * (5 << 20) + b'"}\n{"n":3}\n', True),
]


def _norm(value: Any) -> Any:
    """A value comparable with ==, telling NaN equal to NaN and -0.0 from 0.0."""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else value.hex()
    return value


def _spark_rows_by_file(spark: SparkSession, directory: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Spark's rows of each file of ``directory`` (by file name, in line order), as stream_ops reads."""
    df = (
        spark.read.option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT_COLUMN)
        .schema(schema_ddl(FIELDS) + f", `{CORRUPT_COLUMN}` string")
        .json(str(directory))
        .withColumn("_file", F.input_file_name())
    )
    rows: dict[str, list[tuple[Any, ...]]] = {}
    for row in df.collect():
        rows.setdefault(row["_file"].rsplit("/", 1)[-1], []).append(tuple(row[name] for name in [*FIELDS, CORRUPT_COLUMN]))
    return rows


def _check_parity(spark: SparkSession, directory: Path, cases: Sequence[tuple[str, bytes]]) -> set[str]:
    """Write each case to its own file, compare every table the fast path gives with Spark's rows.

    Returns the cases the fast path took (gave a table for).
    """
    directory.mkdir()
    files = {}
    for number, (case, content) in enumerate(cases):
        files[case] = directory / f"case-{number:04d}.jsonl"
        files[case].write_bytes(content)
    spark_rows = _spark_rows_by_file(spark, directory)
    taken = set()
    mismatches = []
    for case, path in files.items():
        table = read_json_lines([path], FIELDS)
        if table is None:
            continue
        taken.add(case)
        expected = [tuple(_norm(v) for v in row) for row in spark_rows.get(path.name, [])]
        got = [tuple(_norm(row[name]) for name in FIELDS) + (None,) for row in table.to_pylist()]
        if got != expected:
            mismatches.append(f"{case!r} ({path.read_bytes()[:200]!r}): fast path {got[:5]} != Spark {expected[:5]}")
    assert not mismatches, "\n".join(mismatches)
    return taken


def test_edge_cases_parse_as_spark_does(spark: SparkSession, tmp_path: Path) -> None:
    taken = _check_parity(spark, tmp_path / "edge", [(case, content) for case, content, _ in EDGE_CASES])
    must = {case for case, _, native in EDGE_CASES if native}
    assert must - taken == set(), "ordinary data must take the fast path"


def test_clean_batch_of_every_type_takes_the_fast_path(spark: SparkSession, tmp_path: Path) -> None:
    rng = random.Random(7)
    lines = [_fix_raw(json.dumps(_clean_record(rng), ensure_ascii=rng.random() < 0.5).encode()).decode() for _ in range(10_000)]
    directory = tmp_path / "clean"
    directory.mkdir()
    # Three files read in one call, in order: the table is their lines in that order.
    paths = [directory / f"part-{k}.jsonl" for k in range(3)]
    for k, path in enumerate(paths):
        path.write_text("".join(line + "\n" for line in lines[k::3]), encoding="utf-8")
    table = read_json_lines(paths, FIELDS)
    assert table is not None
    assert table.num_rows == len(lines)
    spark_rows = _spark_rows_by_file(spark, directory)
    expected = [tuple(_norm(v) for v in row) for path in paths for row in spark_rows[path.name]]
    got = [tuple(_norm(row[name]) for name in FIELDS) + (None,) for row in table.to_pylist()]
    assert got == expected


def test_random_mutations_never_disagree_with_spark(spark: SparkSession, tmp_path: Path) -> None:
    rng = random.Random(20261127)
    cases = []
    for number in range(600):
        line = _mutate(rng, json.dumps(_clean_record(rng), ensure_ascii=rng.random() < 0.5).encode())
        cases.append((f"fuzz {number}", line + b"\n"))
    for number in range(20):  # multi-line files: a table only when every line is fine
        lines = [_mutate(rng, json.dumps(_clean_record(rng)).encode(), rate=0.05) for _ in range(20)]
        cases.append((f"fuzz file {number}", b"\n".join(lines) + b"\n"))
    taken = _check_parity(spark, tmp_path / "fuzz", cases)
    # The corpus must exercise both sides: many lines parsed by the fast path, many refused.
    assert 100 < len(taken) < len(cases) - 100, len(taken)


# --- random records and mutations ---------------------------------------------------------

_WORDS = ["storm", "spout", "bolt", "é", "中文", "😀", 'a"b', "back\\slash", "tab\tin", "nl\nin", "\u0000", "\u2028", "/", "'"]
_KEYS = ["s", "n", "i", "d", "b", "S", "N", "x", "extra", "", "s ", "ß"]


def _random_double(rng: random.Random) -> float | int | str:
    kind = rng.randrange(7)
    if kind == 0:
        return rng.uniform(-1e6, 1e6)
    if kind == 1:
        return rng.choice([0.0, -0.0, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 0.1, 1 / 3])
    if kind == 2:
        return rng.randint(-(10**30), 10**30)  # an integer token, beyond int64 too
    if kind == 3:  # many digits: rounding must agree
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(15, 40)))
        return f"RAW:{rng.choice(['', '-'])}{digits[0]}.{digits[1:]}e{rng.randint(-330, 310)}"
    if kind == 4:
        return rng.randint(-(2**53) - 10, 2**53 + 10)
    if kind == 5:
        return float.fromhex(f"0x1.{rng.getrandbits(52):013x}p{rng.randint(-1074, 1023)}")
    return rng.random() * 10 ** rng.randint(-20, 20)


def _clean_record(rng: random.Random) -> dict[str, Any]:
    record: dict[str, Any] = {}
    if rng.random() < 0.9:
        record["s"] = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(0, 6)))
    if rng.random() < 0.9:
        record["n"] = rng.choice([rng.randint(-(2**63), 2**63 - 1), rng.randint(-1000, 1000)])
    if rng.random() < 0.9:
        record["i"] = rng.choice([rng.randint(-(2**31), 2**31 - 1), rng.randint(-10, 10)])
    if rng.random() < 0.9:
        value = _random_double(rng)
        record["d"] = value
    if rng.random() < 0.9:
        record["b"] = rng.random() < 0.5
    if rng.random() < 0.2:
        record["x"] = rng.choice([None, 1, "y", [1, {"z": 2}], {"q": []}])
    for key in rng.sample(list(record), len(record)):  # shuffle key order
        record[key] = record.pop(key)
    return record


def _fix_raw(line: bytes) -> bytes:
    """Unquote the raw number text of a double (json.dumps would quote it as a string)."""
    while b'"RAW:' in line:
        start = line.index(b'"RAW:')
        end = line.index(b'"', start + 1)
        line = line[:start] + line[start + 5 : end] + line[end + 1 :]
    return line


_STRAY = [
    b"\x00",
    b"\r",
    b"\t",
    b" ",
    b"\xff",
    b"\xc3",
    b"'",
    b",",
    b"}",
    b"{",
    b"]",
    b"[",
    b":",
    b'"',
    b"\\",
    b"0",
    b"-",
    b".",
    b"e",
    b"null",
    b"NaN",
]
_VALUES = [
    b"Inf",
    b"-Inf",
    b"-NaN",
    b"Infinity",
    b"-Infinity",
    b"+Infinity",
    b"-INF",
    b"nan",
    b"1",
    b"-1",
    b"1.0",
    b"1e2",
    b'"1"',
    b'"true"',
    b"true",
    b"false",
    b"null",
    b"{}",
    b"[]",
    b'"NaN"',
    b"NaN",
    b"01",
    b"2147483648",
    b"-0",
    b"-0e0",
    b"1e400",
    b"'x'",
]


def _mutate(rng: random.Random, line: bytes, rate: float = 0.6) -> bytes:
    line = _fix_raw(line)
    if rng.random() >= rate:
        return line
    kind = rng.randrange(9)
    if kind == 0:  # truncate
        return line[: rng.randrange(len(line) + 1)]
    if kind == 1:  # stray bytes
        position = rng.randrange(len(line) + 1)
        return line[:position] + rng.choice(_STRAY) + line[position:]
    if kind == 2:  # a field with a value of any type
        key = rng.choice(_KEYS).encode()
        return b'{"' + key + b'":' + rng.choice(_VALUES) + (b"," + line[1:] if len(line) > 2 else b"}")
    if kind == 3:  # a duplicate key
        key = rng.choice(["s", "n", "x"]).encode()
        return line[:-1] + (b"," if len(line) > 2 else b"") + b'"' + key + b'":' + rng.choice(_VALUES) + b"}"
    if kind == 4:  # two objects on one line
        return line + rng.choice([b"", b" "]) + line
    if kind == 5:  # single quotes
        return line.replace(b'"', b"'")
    if kind == 6:  # whitespace around
        return rng.choice([b" ", b"\t", b"\r"]) + line + rng.choice([b"", b" "])
    if kind == 7:  # delete one byte
        position = rng.randrange(len(line))
        return line[:position] + line[position + 1 :]
    return line.replace(b'"', b"", 1)  # an unquoted name
