"""The pyarrow fast path for JSON lines (no Spark): the tables it gives, and the guards that make
it answer None ("let Spark parse") instead of a table that could differ from Spark's, or a crash."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from stream_ops.arrow_types import ARROW_TYPES
from stream_ops.sources.arrow_json import NATIVE_TYPES, native_fields, read_json_lines

FIELDS = {"s": "string", "n": "long", "i": "int", "d": "double", "b": "boolean"}


def _read(tmp_path: Path, *contents: bytes, fields: dict[str, str] = FIELDS) -> pa.Table | None:
    paths = []
    for number, content in enumerate(contents):
        path = tmp_path / f"part-{number}.jsonl"
        path.write_bytes(content)
        paths.append(path)
    return read_json_lines(paths, fields)


def test_native_types() -> None:
    assert {"string", "long", "int", "double", "boolean"} == NATIVE_TYPES
    assert native_fields({"s": "string", "n": "long"})
    assert not native_fields({"s": "string", "f": "float"})
    assert not native_fields({"a": "array<string>"})


def test_a_type_outside_the_native_ones_is_left_to_spark(tmp_path: Path) -> None:
    assert _read(tmp_path, b'{"f":1.5}\n', fields={"f": "float"}) is None


def test_columns_in_field_order_with_the_arrow_types(tmp_path: Path) -> None:
    fields = {"d": "double", "b": "boolean", "s": "string", "i": "int", "n": "long"}
    table = _read(tmp_path, b'{"s":"a","n":1,"i":2,"d":3,"b":true,"x":[1,{"y":null}]}\n{}\n{"s":null,"d":-0.5}\n', fields=fields)
    assert table is not None
    assert table.schema == pa.schema([(name, ARROW_TYPES[typ]) for name, typ in fields.items()])
    assert table.to_pylist() == [
        {"d": 3.0, "b": True, "s": "a", "i": 2, "n": 1},
        {"d": None, "b": None, "s": None, "i": None, "n": None},
        {"d": -0.5, "b": None, "s": None, "i": None, "n": None},
    ]


def test_several_files_in_order(tmp_path: Path) -> None:
    # The first has no final newline: its last line must not run into the next file's first.
    table = _read(tmp_path, b'{"n":1}\n{"n":2}', b"", b'{"n":3}\n\n', b"\n\n", b'{"n":4}')
    assert table is not None
    assert table.column("n").to_pylist() == [1, 2, 3, 4]


@pytest.mark.parametrize("contents", [[b""], [b"\n\n\n"], [b"", b"\n"], []])
def test_no_records_is_an_empty_table(tmp_path: Path, contents: list[bytes]) -> None:
    table = _read(tmp_path, *contents)
    assert table is not None
    assert table.num_rows == 0
    assert table.schema == pa.schema([(name, ARROW_TYPES[typ]) for name, typ in FIELDS.items()])


def test_escapes_and_unicode(tmp_path: Path) -> None:
    table = _read(tmp_path, b'{"s":"\\u00e9\\ud83d\\ude00\\u0000\\"\\n"}\n' + '{"s":"é中😀"}\n'.encode())
    assert table is not None
    assert table.column("s").to_pylist() == ['é😀\x00"\n', "é中😀"]


@pytest.mark.parametrize("size", [(1 << 20) + 3, (6 << 20) + 5])
def test_lines_longer_than_a_block(tmp_path: Path, size: int) -> None:
    long = "x" * size
    table = _read(tmp_path, ('{"s":"a"}\n{"s":"' + long + '","n":7}\n{"s":"b"}\n').encode())
    assert table is not None
    assert table.column("s").to_pylist() == ["a", long, "b"]
    assert table.column("n").to_pylist() == [None, 7, None]


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b'{"s":"a"}{"s":"b"}\n', id="two objects on a line"),
        pytest.param(b'{"s":"a"} {"s":"b"}\n{"s":"c"}\n', id="two objects with a space"),
        pytest.param(b'{"s":"a"}\n{"s":"\xff"}\n', id="invalid UTF-8 in a field"),
        pytest.param(b'{"x":"\xc3\x28","s":"a"}\n', id="invalid UTF-8 in an unknown field"),
        pytest.param(b'{"s":"\xc0\xaf"}\n', id="overlong UTF-8 (Spark decodes it as /)"),
        pytest.param(b'{"s":"a"}\r\n', id="CRLF"),
        pytest.param(b'{"s":"a"}\n\x00\n', id="NUL"),
        pytest.param(b' {"s":"a"}\n', id="leading space"),
        pytest.param(b'{"s":"a"}\t\n', id="trailing tab"),
        pytest.param(b"\xef\xbb\xbf{}\n", id="BOM"),
        pytest.param(b'[{"s":"a"}]\n', id="top-level array"),
        pytest.param(b'{"s":"a","s":"b"}\n', id="duplicate key"),
        pytest.param(b'{"s":5}\n', id="number for a string"),
        pytest.param(b'{"s":{"a":1}}\n', id="object for a string"),
        pytest.param(b'{"n":1.0}\n', id="float for a long"),
        pytest.param(b'{"n":"1"}\n', id="string for a long"),
        pytest.param(b'{"n":9223372036854775808}\n', id="long overflow"),
        pytest.param(b'{"i":2147483648}\n', id="int overflow"),
        pytest.param(b'{"d":1e309}\n', id="double overflow (Spark: Infinity)"),
        pytest.param(b'{"d":"NaN"}\n', id="NaN as a string"),
        pytest.param(b'{"d":-0}\n', id="integer -0 for a double (Spark: 0.0)"),
        pytest.param(b'{"d":Inf}\n', id="Inf (Spark: corrupt)"),
        pytest.param(b'{"x":-Inf,"s":"a"}\n', id="-Inf in an unknown field (Spark: corrupt)"),
        pytest.param(b'{"x":[-NaN],"s":"a"}\n', id="-NaN (Spark: corrupt)"),
        pytest.param(b'{"b":"true"}\n', id="string for a boolean"),
        pytest.param(b"{'s':'a'}\n", id="single quotes"),
        pytest.param(b'{"s":"\\ud800"}\n', id="lone surrogate (Spark: ?)"),
        pytest.param(b'{"x":' + b"1" * 1000 + b',"s":"a"}\n', id="number longer than Jackson allows"),
        pytest.param(b'{"' + b"k" * 50_000 + b'":1}\n', id="name longer than Jackson allows"),
        pytest.param(b'{"x":' + b"[" * 1000 + b"]" * 1000 + b"}\n", id="nesting deeper than Jackson allows"),
    ],
)
def test_what_spark_parses_differently_is_left_to_spark(tmp_path: Path, content: bytes) -> None:
    assert _read(tmp_path, content) is None


def test_inf_and_nan_words_in_text_stay_on_the_fast_path(tmp_path: Path) -> None:
    text = ["Information of NaNa", "Infinity Inf-Inf", "NaNa? no: Nan-", "N", "I", "In"]
    table = _read(
        tmp_path,
        "".join(json.dumps({"s": s, "d": d}) + "\n" for s, d in zip(text, [float("nan"), -1e300, 0.5, 1, 2, 3])).encode(),
    )
    assert table is not None
    assert table.column("s").to_pylist() == text


def test_a_bad_file_among_good_ones_refuses_the_batch(tmp_path: Path) -> None:
    assert _read(tmp_path, b'{"s":"a"}\n', b'{"s":"b"}\n') is not None
    assert _read(tmp_path, b'{"s":"a"}\n', b'{"s":5}\n') is None


def test_long_lines_within_jacksons_limits_parse(tmp_path: Path) -> None:
    # Nesting just below Jackson's 1000, a long number, a long name: all fine for Spark too.
    content = b'{"x":' + b"1" * 300 + b',"y":' + b"[" * 990 + b"]" * 990 + b',"' + b"k" * 40_000 + b'":1,"s":"a"}\n'
    table = _read(tmp_path, content)
    assert table is not None
    assert table.column("s").to_pylist() == ["a"]


# Inputs that crash pyarrow's reader (segfault) when it sees them unguarded; run in a child
# process so that a crash fails the test instead of killing pytest.
_CRASHERS = {
    "null first": b'null\n{"s":"a"}\n',
    "null later": b'{"s":"a"}\nnull\n',
    "deep nesting": b'{"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}\n",
}


@pytest.mark.parametrize("name", list(_CRASHERS))
def test_inputs_that_crash_pyarrow_are_refused_without_a_crash(tmp_path: Path, name: str) -> None:
    path = tmp_path / "batch.jsonl"
    path.write_bytes(_CRASHERS[name])
    code = (
        "import sys; from pathlib import Path\n"
        "from stream_ops.sources.arrow_json import read_json_lines\n"
        f"print(read_json_lines([Path({str(path)!r})], {{'s': 'string'}}) is None)\n"
    )
    root = str(Path(__file__).resolve().parents[3])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=root)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"


def test_a_clean_batch_is_read_fast(tmp_path: Path) -> None:
    words = ["storm", "spout", "bolt", "stream", "tuple", "trident", "é"]
    path = tmp_path / "batch.jsonl"
    with path.open("w", encoding="utf-8") as out:
        for k in range(100_000):
            out.write(json.dumps({"sentence": " ".join(words[(k + j) % len(words)] for j in range(6))}) + "\n")
    read_json_lines([path], {"sentence": "string"})  # warm up
    started = time.perf_counter()
    table = read_json_lines([path], {"sentence": "string"})
    elapsed = time.perf_counter() - started
    assert table is not None
    assert table.num_rows == 100_000
    # ~5 MB: tens of milliseconds; a bound loose enough for a busy CI machine.
    assert elapsed < 2.0
