"""A source batch's partial aggregates per (time window, key), computed in Arrow, for an event-time window stage.

A window task judges a record late against its watermark at the start of the window batch that
reads it (:class:`~stream_ops.operators.window_aggregation.WindowedAggregation`), so a source
task may aggregate a record before the shuffle only when it can prove the record cannot be late
there. The proof (``docs/design.md``, "Windows"): the watermark is the smallest largest event
time over the window task's upstream channels, minus the lag, and never more than its earlier
values; this source task is one of the channels, and its progress row for a batch is in the
same file as the batch's records. So when the window task starts any batch that reads this
source batch's file, the watermark is at most (the largest event time this task sent in its
*earlier* batches) - lag: :func:`lateness_threshold`. A record at or above it goes as part of a
partial; one below it (or without a usable event time) goes whole, and the window task judges it
exactly as before. This holds only without ``idle_timeout`` (an idle channel stops holding the
watermark back) and for tumbling and sliding event-time windows; the plan offers partials only
then (``RecordsSpec.window_partials``).

:func:`split_window_partials` assigns windows as :meth:`~stream_ops.topology.windows.WindowDef.windows_of`
does (the same float operations, so the same bounds) and combines per (window, key) with the
aggregator's Spark function when the result is exactly what the window task's ``combine``, record
by record, would give: ``Count``; ``Sum`` of integers (when no sum can overflow 64 bits); ``Min``
and ``Max`` of integers, strings and floats (a float batch holding NaN goes whole, and zeros go
whole: ``min(0.0, -0.0)`` depends on the order). Anything else is left to the row path.

Example:
    >>> import pyarrow as pa
    >>> from stream_ops.topology.windows import Tumbling, WindowDef
    >>> window = WindowDef.build(Tumbling(10), time="event", timestamp_field="ts", lag=5)
    >>> table = pa.table({"user": ["ann", "ann", "bob"], "ts": [3.0, 12.0, 14.0]})
    >>> split = split_window_partials(table, window=window, key_fields=("user",), aggregator={"kind": "Count"}, threshold=4.0)
    >>> split.partials.rows, split.whole.column("ts").to_pylist()
    ([(10.0, 20.0, '["ann"]', 1), (10.0, 20.0, '["bob"]', 1)], [3.0])
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from stream_ops.hashing import encode_key
from stream_ops.sources import CORRUPT_COLUMN
from stream_ops.topology.windows import WindowDef

PartialRow = tuple[float, float, str, Any]
"""(window start, window end, encoded key, partial aggregate)."""

_INT64_LIMIT = 2**63


@dataclass(frozen=True)
class WindowPartials:
    """The partials of one source batch for one window stage."""

    rows: list[PartialRow]
    records: int
    """How many records they hold."""
    max_event: float | None
    """The largest event time (seconds) among those records (None: no records)."""


@dataclass(frozen=True)
class PartialsSplit:
    """A source batch cut into partials and the records that go whole."""

    partials: WindowPartials
    whole: pa.Table
    """The records that go whole (below the threshold, no usable event time, unparsed lines,
    values the partial cannot combine exactly), in their order in the batch."""


def lateness_threshold(sent_before: float | None, lag: float) -> float:
    """The smallest event time a record of a source batch may have to travel as a partial:
    ``sent_before - lag``, where ``sent_before`` is the largest event time the source task sent
    to the window stage in its earlier batches (None: it sent none, so no window task can have a
    watermark yet and every record may). Compared as the window task compares (``t < mark``).

    >>> lateness_threshold(100.0, 5.0), lateness_threshold(None, 5.0)
    (95.0, -inf)
    """
    return -math.inf if sent_before is None else sent_before - lag


def event_seconds(column: pa.Array | pa.ChunkedArray, unit: str) -> pa.Array | None:
    """Event times in seconds as :func:`~stream_ops.topology.windows.event_time_of` reads them
    (null where a record has no usable one: null or not finite), or None for a column type it
    does not read as a number here (booleans, strings, nested; the row path decides those)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    kind = column.type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)) or pa.types.is_float16(kind):
        return None
    seconds = pc.cast(column, pa.float64(), safe=False)
    if unit == "ms":
        seconds = pc.divide(seconds, 1000.0)
    return pc.if_else(pc.is_finite(seconds), seconds, pa.scalar(None, pa.float64()))


def window_starts(times: pa.Array, length: float, slide: float) -> list[pa.Array]:
    """The starts of the windows covering each time (no nulls), newest first, as
    :meth:`~stream_ops.topology.windows.WindowDef.windows_of` computes them: the ``k``-th array
    holds the ``k``-th newest window's start, null where a time has fewer windows."""
    start = pc.multiply(pc.floor(pc.divide(times, slide)), slide)
    levels: list[pa.Array] = []
    while True:
        covers = pc.greater(pc.add(start, length), times)
        if not pc.any(covers).as_py():
            return levels
        levels.append(pc.if_else(covers, start, pa.scalar(None, pa.float64())))
        start = pc.subtract(start, slide)


def split_window_partials(
    table: pa.Table,
    *,
    window: WindowDef,
    key_fields: Sequence[str],
    aggregator: Mapping[str, Any],
    threshold: float,
) -> PartialsSplit | None:
    """Cut ``table`` (a source batch after its SQL operations) into partials per (window, key)
    of its records at or above ``threshold`` and the records that go whole, or None when this
    batch cannot be cut exactly (a key or value type not handled here: the whole batch goes as
    records). ``aggregator`` is the window stage's aggregator spec."""
    assert window.time == "event" and not window.counted and window.kind in ("tumbling", "sliding")
    assert window.timestamp_field is not None
    names = table.schema.names
    if window.timestamp_field not in names or any(
        k not in names or not _key_type(table.schema.field(k).type) for k in key_fields
    ):
        return None
    value_of = _value_rule(table, aggregator)
    if value_of is None:
        return None
    function, value_column, value_ok = value_of
    times = event_seconds(table.column(window.timestamp_field), window.timestamp_unit)
    if times is None:
        return None
    eligible = pc.fill_null(pc.greater_equal(times, threshold), False)
    if CORRUPT_COLUMN in names:
        eligible = pc.and_(eligible, pc.is_null(table.column(CORRUPT_COLUMN)))
    if value_ok is not None:
        eligible = pc.and_(eligible, value_ok)
    eligible = pc.fill_null(eligible, False)
    chosen = table.filter(eligible)
    whole = table.filter(pc.invert(eligible))
    records = chosen.num_rows
    if not records:
        return PartialsSplit(WindowPartials([], 0, None), whole)
    chosen_times = times.filter(eligible)
    if function == "sum" and not _sum_fits(chosen.column(value_column)):
        return None
    columns = {k: chosen.column(k) for k in key_fields}
    if value_column is not None:
        columns["__value"] = chosen.column(value_column)
    parts = []
    for starts in window_starts(chosen_times, window.length, window.slide):
        placed = pc.is_valid(starts)
        part = pa.table({**{name: col.filter(placed) for name, col in columns.items()}, "__start": starts.filter(placed)})
        parts.append(part)
    rows = _grouped(parts, key_fields, function, window.length)
    return PartialsSplit(WindowPartials(rows, records, float(pc.max(chosen_times).as_py())), whole)


def _key_type(kind: pa.DataType) -> bool:
    """Key types whose values the row path sees unchanged after the JSON shuffle."""
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_integer(kind) or pa.types.is_boolean(kind)


def _value_rule(table: pa.Table, aggregator: Mapping[str, Any]) -> tuple[str, str | None, pa.Array | None] | None:
    """(Arrow aggregate, value column, which rows may be combined there (None: all)) for the
    aggregator, or None when Arrow does not combine it exactly as the window task would."""
    kind = aggregator.get("kind")
    if kind == "Count":
        return "count", None, None
    field = aggregator.get("field")
    if kind not in ("Sum", "Min", "Max") or not isinstance(field, str) or field not in table.schema.names:
        return None
    column = table.column(field)
    valid = pc.is_valid(column)  # a null value is the aggregator's dead letter: the row path writes it
    typ = column.type
    if kind == "Sum":
        return ("sum", field, valid) if pa.types.is_integer(typ) else None
    function = kind.lower()
    if pa.types.is_integer(typ) or pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return function, field, valid
    if pa.types.is_floating(typ) and not pa.types.is_float16(typ):
        if pc.any(pc.is_nan(column)).as_py():
            return None  # min/max with NaN depend on the order the window task combines in
        return function, field, pc.and_(valid, pc.not_equal(column, 0))
    return None


def _sum_fits(column: pa.ChunkedArray) -> bool:
    """Whether no sum of ``column``'s values can leave 64 bits (Python's ints never overflow)."""
    if not len(column):
        return True
    bounds = pc.min_max(column)
    largest = max(abs(bounds["min"].as_py() or 0), abs(bounds["max"].as_py() or 0))
    return largest * len(column) < _INT64_LIMIT


def _grouped(parts: list[pa.Table], key_fields: Sequence[str], function: str, length: float) -> list[PartialRow]:
    """Partials per (window, encoded key), in the order Arrow first meets them (the same for the
    same batch), from the per-level tables."""
    if not parts:
        return []
    table = pa.concat_tables(parts)
    keys = [*key_fields, "__start"]
    aggregation = ([], "count_all") if function == "count" else ("__value", function)
    grouped = table.group_by(keys, use_threads=False).aggregate([aggregation])
    values = grouped.column("count_all" if function == "count" else f"__value_{function}").to_pylist()
    starts = grouped.column("__start").to_pylist()
    combined: dict[tuple[float, str], Any] = {}
    for start, key, value in zip(starts, _encoded_keys(grouped, key_fields), values, strict=True):
        slot = (start, key)
        if slot in combined:  # keys that encode alike (only ints, strings and booleans here: none so far)
            previous = combined[slot]
            value = previous + value if function in ("count", "sum") else (min if function == "min" else max)(previous, value)
        combined[slot] = value
    return [(start, start + length, key, value) for (start, key), value in combined.items()]


def _encoded_keys(table: pa.Table, key_fields: Sequence[str]) -> list[str]:
    """``encode_key`` of each row's key fields; one string field is encoded once per distinct
    value over the process's batches (users recur batch after batch)."""
    if len(key_fields) == 1 and pa.types.is_string(table.schema.field(key_fields[0]).type):
        return [_string_key(value) if value is not None else _NULL_KEY for value in table.column(key_fields[0]).to_pylist()]
    columns = [table.column(k).to_pylist() for k in key_fields]
    return [encode_key(list(values)) for values in zip(*columns, strict=True)]


@functools.lru_cache(maxsize=1 << 18)
def _string_key(value: str) -> str:
    return encode_key([value])


_NULL_KEY = encode_key([None])
