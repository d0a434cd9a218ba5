"""A fast path for source batches of JSON lines: parse them with ``pyarrow.json`` on the driver.

A FileTopic batch is normally parsed by Spark's JSON reader (PERMISSIVE mode: a line that does
not parse is kept whole in the corrupt column). For ordinary data, ``pyarrow.json`` gives the
same records many times faster, but the two parsers disagree on plenty of edge cases (Spark
coerces numbers to strings, accepts single quotes, ignores what follows the first object of a
line, ...; pyarrow segfaults on some inputs and does not validate UTF-8). So
:func:`read_json_lines` returns a table only when it can prove that Spark would give exactly
these rows, and ``None`` otherwise: ``None`` means "let Spark parse this batch", never an
error. Exactness therefore rests on the guards here saying "not sure" whenever in doubt, not on
this reader handling everything.

The guards, in order, before pyarrow sees a byte (all vectorized with numpy over the bytes,
a 25 MB batch costs ~20 ms of them):

* the bytes are valid UTF-8 and hold no control byte except ``\\n`` and ``\\t`` (no ``\\r``:
  Spark also splits lines there; no NUL, which stops pyarrow's parser early);
* every non-empty line starts with ``{`` and ends with ``}`` (pyarrow crashes on a first line
  ``null`` and turns a later one into a row; a top-level array is several rows in Spark);
* no ``Inf``, ``-Inf`` or ``-NaN`` as a value (pyarrow reads them as numbers, Spark's Jackson
  rejects them; ``NaN``, ``Infinity`` and ``-Infinity`` both read alike);
* lines long enough to hit one of Jackson's read limits (nesting depth, number length, name
  length, string length: Spark's defaults, which Jackson enforces by failing the record) are
  bounded conservatively, which also keeps nesting too deep for pyarrow's recursive parser
  (it segfaults) away from it;

and after the parse:

* pyarrow read every line (it fails on a type Spark would coerce or reject, a duplicate key,
  a syntax error ...);
* pyarrow found as many records as there are non-empty lines (so no line held two objects,
  where Spark keeps only the first);
* no double is -0.0 read from the integer ``-0`` (Spark: 0.0).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json

from stream_ops.arrow_types import ARROW_TYPES

logger = logging.getLogger(__name__)

NATIVE_TYPES: frozenset[str] = frozenset({"string", "long", "int", "double", "boolean"})
"""Field types whose Spark parse pyarrow reproduces exactly (or refuses). Not ``float``: Spark
rounds the decimal text straight to a float, pyarrow may round through a double first."""

# Jackson's StreamReadConstraints as Spark 4.3's JSONOptions sets them (maxNestingDepth,
# maxNumLen, maxStringLen) plus Jackson's own default name limit. A record exceeding one is
# corrupt in Spark but parses in pyarrow. Counts are UTF-16 units, never more than UTF-8 bytes.
_JACKSON_MAX_DEPTH = 1000
_JACKSON_MAX_NUMBER_LEN = 1000
_JACKSON_MAX_NAME_LEN = 50_000
_JACKSON_MAX_STRING_LEN = 20_000_000
# A line shorter than this cannot exceed any of the limits above (each needs that many bytes),
# so only longer lines are checked one by one.
_LONG_LINE = min(_JACKSON_MAX_DEPTH, _JACKSON_MAX_NUMBER_LEN)

# A number token is at most 3 runs of digits and 4 other characters, so one longer than Jackson
# allows has a run of more than this many digits: where no such run occurs, no number is too long.
_DIGIT_RUN = (_JACKSON_MAX_NUMBER_LEN - 4) // 3
_STRING_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NAME_END = re.compile(rb"[ \t]*:")

_MIN_BLOCK_SIZE = 4 << 20  # fastest on 25 MB batches (1 MiB blocks are ~2x slower)
_MAX_BLOCK_SIZE = (1 << 31) - 1  # pyarrow's block_size is an int32

_NEWLINE, _TAB, _OPEN, _CLOSE, _MINUS = ord("\n"), ord("\t"), ord("{"), ord("}"), ord("-")
_BLANKS = np.frombuffer(b" \t", dtype=np.uint8)
_VALUE_BEFORE = np.frombuffer(b":,[", dtype=np.uint8)  # the bytes a value can follow in an object line
_NUMBER_GOES_ON = np.frombuffer(b"0123456789.eE", dtype=np.uint8)


def native_fields(fields: Mapping[str, str]) -> bool:
    """Whether every field type is one this reader can parse exactly."""
    return all(typ in NATIVE_TYPES for typ in fields.values())


def read_json_lines(paths: Sequence[Path], fields: Mapping[str, str]) -> pa.Table | None:
    """The records of the JSON-lines files ``paths`` (in order) as Spark's JSON reader gives them.

    Args:
        paths: the files, read in this order (a file without a final newline is fine).
        fields: field -> stream_ops type name; the table has these columns in this order, typed
            as :data:`stream_ops.arrow_types.ARROW_TYPES` says.

    Returns:
        The table, or None when the files hold anything whose Spark parse this reader does not
        reproduce exactly (a line Spark would mark corrupt, a value Spark would coerce, a type
        outside :data:`NATIVE_TYPES` ...): the caller then lets Spark parse them. Never raises
        for file content.

    Raises:
        OSError: a file cannot be read.
    """
    if not native_fields(fields):
        _refuse("a field type outside %s", sorted(NATIVE_TYPES))
        return None
    # One buffer, files separated by a newline: a file without a final newline cannot run into
    # the next one, and the blank lines this adds are skipped by both parsers.
    contents = [Path(path).read_bytes() for path in paths]
    data = contents[0] if len(contents) == 1 else b"\n".join(contents)
    del contents  # the joined copy is all that is needed from here
    return read_json_bytes(data, fields)


def read_json_bytes(data: bytes, fields: Mapping[str, str]) -> pa.Table | None:
    """The records of the JSON lines ``data`` as Spark's JSON reader gives them (one per
    non-empty line), or None when Spark must parse them (as :func:`read_json_lines`)."""
    if not native_fields(fields):
        _refuse("a field type outside %s", sorted(NATIVE_TYPES))
        return None
    schema = pa.schema([(name, ARROW_TYPES[typ]) for name, typ in fields.items()])
    lines = _check_lines(data)
    if isinstance(lines, str):
        _refuse("%s", lines)
        return None
    count, longest = lines
    if count == 0:
        return schema.empty_table()
    block_size = max(_MIN_BLOCK_SIZE, 2 * (longest + 1))  # a line longer than a block fails
    if block_size > _MAX_BLOCK_SIZE:
        _refuse("a line of %d bytes", longest)
        return None
    try:
        table = pa_json.read_json(
            pa.py_buffer(data),
            read_options=pa_json.ReadOptions(block_size=block_size),
            parse_options=pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
        )
    except (pa.ArrowException, ValueError) as error:  # ArrowInvalid is both
        _refuse("pyarrow: %s", error)
        return None
    if table.num_rows != count:
        _refuse("%d records in %d lines (a line with more than one object)", table.num_rows, count)
        return None
    if table.schema != schema:  # explicit_schema gives exactly these columns; never trust it blindly
        _refuse("pyarrow gave schema %s", table.schema)
        return None
    if _minus_zero_from_integer(table, np.frombuffer(data, dtype=np.uint8)):
        _refuse("the integer -0 for a double (Spark: 0.0, pyarrow: -0.0)")
        return None
    return table


def _refuse(reason: str, *args: object) -> None:
    logger.debug("JSON lines left to Spark: " + reason, *args)


def _check_lines(data: bytes) -> tuple[int, int] | str:
    """The number of non-empty lines and the longest one's length, or why pyarrow may not see ``data``."""
    if not data:
        return 0, 0
    buffer = np.frombuffer(data, dtype=np.uint8)
    if not _valid_utf8(data):
        return "invalid UTF-8"
    # One pass finds the control bytes (newlines above all) and, where the letters occur at
    # all (memchr, fast), every I and N: the starts of Inf and NaN.
    marked = buffer < 0x20
    for letter in (b"I", b"N"):
        if data.find(letter) >= 0:
            marked |= buffer == ord(letter)
    marks = np.flatnonzero(marked)
    mark_bytes = buffer[marks]
    control = mark_bytes < 0x20
    controls, control_bytes, letters = marks[control], mark_bytes[control], marks[~control]
    newline = control_bytes == _NEWLINE
    if not np.all(newline | (control_bytes == _TAB)):
        return "a control byte other than newline and tab (\\r, NUL ...)"
    newlines = controls[newline]
    starts = np.concatenate(([0], newlines + 1))
    ends = np.concatenate((newlines, [buffer.size]))
    lengths = ends - starts
    non_empty = lengths > 0
    starts, ends, lengths = starts[non_empty], ends[non_empty], lengths[non_empty]
    if starts.size == 0:
        return 0, 0
    if not (np.all(buffer[starts] == _OPEN) and np.all(buffer[ends - 1] == _CLOSE)):
        return "a non-empty line that is not one {...} (null, an array, whitespace around it ...)"
    if _pyarrow_only_number(data, buffer, letters):
        return "Inf, -Inf or -NaN as a value (pyarrow reads them as numbers, Spark's Jackson does not)"
    long = lengths >= _LONG_LINE
    if long.any():
        if _has_digit_run(buffer, _DIGIT_RUN):
            return "a number that may be too long for Jackson"
        for start, end in zip(starts[long].tolist(), ends[long].tolist()):
            reason = _long_line_refusal(data[start:end])
            if reason is not None:
                return reason
    return int(starts.size), int(lengths.max())


def _valid_utf8(data: bytes) -> bool:
    # Arrow's SIMD validation over the whole buffer, without a copy (decoding to str copies).
    offsets = pa.py_buffer(np.array([0, len(data)], dtype=np.int64))
    array = pa.Array.from_buffers(pa.large_string(), 1, [None, offsets, pa.py_buffer(data)])
    try:
        array.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def _pyarrow_only_number(data: bytes, buffer: np.ndarray, letters: np.ndarray) -> bool:
    """Whether ``data`` may hold ``Inf``, ``-Inf`` or ``-NaN`` as a value.

    pyarrow's parser (RapidJSON with NaN and Inf allowed) reads them as numbers, Jackson rejects
    them; both read ``NaN``, ``Infinity`` and ``-Infinity`` alike. ``letters`` are the positions
    of every I and N. ``-NaN`` is refused anywhere; an ``Inf`` unless clearly inside a string,
    i.e. unless the byte before it (past a minus and blanks) cannot precede a value, so that
    words such as "Information" stay on the fast path. ``data`` has passed the line checks: it
    starts with ``{`` or a newline and ends with ``}`` or a newline, so no look back or ahead
    leaves it.
    """
    letters = letters[letters + 2 < buffer.size]
    after = buffer[letters + 1], buffer[letters + 2]
    if np.any((buffer[letters] == ord("N")) & (buffer[letters - 1] == _MINUS) & (after[0] == ord("a")) & (after[1] == ord("N"))):
        return True
    starts = letters[(buffer[letters] == ord("I")) & (after[0] == ord("n")) & (after[1] == ord("f"))]
    before = starts - 1
    before -= buffer[before] == _MINUS
    blank = np.isin(buffer[before], _BLANKS)
    while blank.any():
        before -= blank
        blank = np.isin(buffer[before], _BLANKS)
    as_value = starts[np.isin(buffer[before], _VALUE_BEFORE)]
    return any(data[start + 3 : start + 8] != b"inity" for start in as_value.tolist())


def _minus_zero_from_integer(table: pa.Table, buffer: np.ndarray) -> bool:
    """Whether a double column's -0.0 may come from the integer token ``-0``.

    Spark converts the integer to a double (0.0), pyarrow parses the text (-0.0); ``-0.0`` and
    ``-0e0`` are -0.0 in both. Only looked for when a -0.0 was read at all.
    """
    negative_zero = False
    for column in table.itercolumns():
        if column.type == pa.float64():
            values = column.to_numpy(zero_copy_only=False)  # nulls become NaN
            negative_zero = negative_zero or bool(np.any((values == 0.0) & np.signbit(values)))
    if not negative_zero:
        return False
    # "-0" at the very end of the buffer cannot be a value (a line ends with "}").
    minus_zeros = np.flatnonzero((buffer[:-2] == _MINUS) & (buffer[1:-1] == ord("0")))
    return not np.all(np.isin(buffer[minus_zeros + 2], _NUMBER_GOES_ON))


def _has_digit_run(buffer: np.ndarray, length: int) -> bool:
    """Whether ``buffer`` holds ``length`` digits in a row (vectorized: a regex is ~10x slower)."""
    run = (buffer - ord("0")) < 10  # uint8 arithmetic wraps: only digits stay below 10
    width = 1  # run[p]: the `width` bytes from p are all digits
    while width < length and run.any():
        shift = min(width, length - width)
        run = run[:-shift] & run[shift:]
        width += shift
    return bool(run.any())


def _long_line_refusal(line: bytes) -> str | None:
    """Why a long line may exceed Jackson's string, nesting or name limit, or None when it cannot.

    Conservative byte-level bounds (no recursive parse: the line may nest deep enough to crash
    one); a bound that also counts bytes inside strings only ever refuses more.
    """
    if len(line) >= _JACKSON_MAX_STRING_LEN:
        return f"a line of {len(line)} bytes (Jackson's string limit)"
    # Nesting depth is at most the number of brackets.
    if line.count(b"{") + line.count(b"[") >= _JACKSON_MAX_DEPTH:
        return "a line that may nest too deep"
    if len(line) >= _JACKSON_MAX_NAME_LEN:
        # String tokens left to right (between them valid JSON has no quote); a name is one
        # followed by a colon. Its UTF-16 length is at most its byte length.
        for token in _STRING_TOKEN.finditer(line):
            if token.end() - token.start() - 2 >= _JACKSON_MAX_NAME_LEN and _NAME_END.match(line, token.end()):
                return "a field name that may be too long"
    return None
