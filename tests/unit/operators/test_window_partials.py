"""Window partials computed in Arrow on a source batch: the same windows as the row path's
assignment, the same results, late records and dead letters as sending every record whole, and
the lateness bound checked against the watermark's own code."""

from __future__ import annotations

import math
import random

import pyarrow as pa
import pytest

from stream_ops.operators.aggregators import Count, Max, Min, Sum, aggregator_from_spec
from stream_ops.operators.window_aggregation import WindowedAggregation
from stream_ops.operators.window_partials import event_seconds, lateness_threshold, split_window_partials, window_starts
from stream_ops.sources import CORRUPT_COLUMN
from stream_ops.topology.windows import Sliding, Tumbling, Watermark, WindowDef, event_time_of

CHANNEL = "0/0"
SHAPES = [Tumbling(10), Tumbling(0.7), Sliding(10, 5), Sliding(10, 3), Sliding(7.5, 2.5), Sliding(1, 0.3), Sliding(0.05, 0.01)]


def _window(shape, *, lag: float = 2.0, unit: str = "s") -> WindowDef:
    return WindowDef.build(shape, time="event", timestamp_field="ts", timestamp_unit=unit, lag=lag)


def _random_times(rng: random.Random, n: int) -> list[float]:
    """Negative, odd, huge, integral and tiny times, and times on window edges."""
    choices = [
        lambda: rng.uniform(-1000, 1000),
        lambda: float(rng.randint(-50, 50)),
        lambda: rng.uniform(-1, 1) * 1e-6,
        lambda: rng.uniform(1.6e9, 1.8e9),
        lambda: rng.randint(-20, 20) * 0.1,
        lambda: rng.randint(-100, 100) * 2.5,
    ]
    return [rng.choice(choices)() for _ in range(n)]


@pytest.mark.parametrize("shape", SHAPES, ids=repr)
def test_arrow_assigns_every_time_the_windows_the_row_path_assigns(shape):
    rng = random.Random(7)
    window = _window(shape)
    times = _random_times(rng, 3000)
    levels = window_starts(pa.array(times, pa.float64()), window.length, window.slide)
    for i, t in enumerate(times):
        starts = [level[i].as_py() for level in levels if level[i].is_valid]
        assert [(s, s + window.length) for s in reversed(starts)] == window.windows_of(t), t


@pytest.mark.parametrize(
    ("values", "typ", "unit"),
    [
        ([1_699_999_200_123, -7, None, 0], pa.int64(), "ms"),
        ([1.5, float("nan"), float("inf"), None, -0.0], pa.float64(), "s"),
        ([3, None, -9], pa.int32(), "s"),
        ([2.25, None], pa.float32(), "ms"),
    ],
)
def test_event_times_are_read_as_the_row_path_reads_them(values, typ, unit):
    seconds = event_seconds(pa.array(values, typ), unit).to_pylist()
    as_python = pa.array(values, typ).to_pylist()
    assert seconds == [event_time_of({"ts": v}, "ts", unit) for v in as_python]


def test_a_timestamp_column_the_row_path_reads_otherwise_is_not_split():
    window = _window(Tumbling(10))
    for column in (pa.array(["1.0"]), pa.array([True])):
        table = pa.table({"user": ["a"], "ts": column})
        assert (
            split_window_partials(table, window=window, key_fields=("user",), aggregator={"kind": "Count"}, threshold=0.0) is None
        )


def _batch(rng: random.Random, n: int, *, value_kind: str, unit: str) -> pa.Table:
    users = [rng.choice(["ann", "bob", "cy", "dé"]) for _ in range(n)]
    times: list[float | int | None] = []
    for _ in range(n):
        roll = rng.random()
        t = rng.uniform(-60, 0) if rng.random() < 0.15 else rng.uniform(-5, 15)  # stragglers far behind
        if unit == "ms":
            times.append(None if roll < 0.05 else round(t * 1000))
        else:
            times.append(None if roll < 0.03 else float("nan") if roll < 0.05 else t)
    ts_type = pa.int64() if unit == "ms" else pa.float64()
    values: list = []
    for _ in range(n):
        roll = rng.random()
        if value_kind == "int":
            values.append(None if roll < 0.05 else rng.randint(-1000, 1000))
        elif value_kind == "float":
            values.append(None if roll < 0.05 else rng.choice([0.0, -0.0]) if roll < 0.15 else rng.uniform(-5, 5))
        else:
            values.append(None if roll < 0.05 else rng.choice(["x", "é", "Z", "ab", ""]))
    value_type = {"int": pa.int64(), "float": pa.float64(), "str": pa.string()}[value_kind]
    return pa.table({"user": users, "ts": pa.array(times, ts_type), "v": pa.array(values, value_type)})


def _run(window: WindowDef, aggregator, batches: list[pa.Table], *, split: bool) -> tuple:
    """Every batch through one window task, each record whole (``split`` False) or split into
    partials at the bound the source task would use; the progress rows as the source sends them."""
    agg = WindowedAggregation(window, ("user",), aggregator, "out", now=0.0, channels=[CHANNEL])
    sent: float | None = None
    out = []
    partial_records = 0
    for table in batches:
        records, partials, partial_max = table.to_pylist(), [], None
        if split:
            cut = split_window_partials(
                table,
                window=window,
                key_fields=("user",),
                aggregator=aggregator.to_spec(),
                threshold=lateness_threshold(sent, window.lag),
            )
            if cut is not None:
                records, partials, partial_max = cut.whole.to_pylist(), cut.partials.rows, cut.partials.max_event
                partial_records += cut.partials.records
        times = [t for t in (window.event_time(r) for r in records) if t is not None]
        times += [partial_max] if partial_max is not None else []
        progress = [(CHANNEL, max(times))] if times else []
        batch = agg.process(records, 0.0, progress=progress, partials=partials)
        out.append((batch.results, batch.late, batch.dead))
        if times:
            sent = max(times) if sent is None else max(sent, max(times))
    return out, agg.changes(), partial_records


@pytest.mark.parametrize(
    ("aggregator", "value_kind"),
    [
        (Count(), "int"),
        (Sum("v"), "int"),
        (Min("v"), "int"),
        (Max("v"), "int"),
        (Min("v"), "float"),
        (Max("v"), "float"),
        (Min("v"), "str"),
        (Max("v"), "str"),
    ],
    ids=lambda x: x if isinstance(x, str) else type(x).__name__,
)
@pytest.mark.parametrize("shape", [Tumbling(10), Sliding(10, 3)], ids=repr)
@pytest.mark.parametrize("unit", ["s", "ms"])
def test_partials_give_the_results_late_records_and_dead_letters_of_whole_records(aggregator, value_kind, shape, unit):
    rng = random.Random(f"{type(aggregator).__name__}{value_kind}{shape}{unit}")
    window = _window(shape, lag=3.0, unit=unit)
    batches = []
    for i in range(12):  # event time moves on batch by batch, with stragglers far behind
        table = _batch(rng, 60, value_kind=value_kind, unit=unit)
        shift = i * 15 * (1000 if unit == "ms" else 1)
        ts = [None if t is None else t + shift for t in table.column("ts").to_pylist()]
        batches.append(table.set_column(1, "ts", pa.array(ts, table.schema.field("ts").type)))
    whole, whole_state, _ = _run(window, aggregator, batches, split=False)
    split, split_state, partial_records = _run(window, aggregator, batches, split=True)
    assert partial_records > 360, "most records went as partials"
    assert repr(split) == repr(whole)  # repr: NaN timestamps of dead letters compare unequal
    assert sorted(map(repr, split_state[0])) == sorted(map(repr, whole_state[0]))
    assert sum(len(late) for _, late, _ in whole) > 0, "some records are late"
    assert any(dead for _, _, dead in whole), "some records are dead letters"


def test_records_below_the_bound_and_unparsed_lines_go_whole():
    window = _window(Tumbling(10), lag=5)
    table = pa.table(
        {
            "user": ["a", "a", "b", "b", "c"],
            "ts": [94.999, 95.0, 120.0, None, 130.0],
            CORRUPT_COLUMN: [None, None, None, None, "{broken"],
        }
    )
    cut = split_window_partials(table, window=window, key_fields=("user",), aggregator={"kind": "Count"}, threshold=95.0)
    assert cut is not None
    assert cut.partials.rows == [(90.0, 100.0, '["a"]', 1), (120.0, 130.0, '["b"]', 1)]
    assert (cut.partials.records, cut.partials.max_event) == (2, 120.0)
    assert cut.whole.column("ts").to_pylist() == [94.999, None, 130.0]


def test_a_float_batch_holding_nan_and_a_sum_that_may_overflow_go_whole():
    window = _window(Tumbling(10))
    nan = pa.table({"user": ["a", "a"], "ts": [1.0, 2.0], "v": [1.0, float("nan")]})
    assert split_window_partials(nan, window=window, key_fields=("user",), aggregator=Min("v").to_spec(), threshold=0.0) is None
    big = pa.table({"user": ["a", "a"], "ts": [1.0, 2.0], "v": [2**62, 2**62]})
    assert split_window_partials(big, window=window, key_fields=("user",), aggregator=Sum("v").to_spec(), threshold=0.0) is None
    floats = pa.table({"user": ["a"], "ts": [1.0], "v": [1.5]})
    assert (
        split_window_partials(floats, window=window, key_fields=("user",), aggregator=Sum("v").to_spec(), threshold=0.0) is None
    )


def test_keys_that_the_json_shuffle_would_change_are_not_split():
    window = _window(Tumbling(10))
    table = pa.table({"user": [1.5], "ts": [1.0]})
    assert split_window_partials(table, window=window, key_fields=("user",), aggregator={"kind": "Count"}, threshold=0.0) is None
    ints = pa.table({"user": [1, 1, 2], "ts": [1.0, 2.0, 3.0]})
    cut = split_window_partials(ints, window=window, key_fields=("user",), aggregator={"kind": "Count"}, threshold=0.0)
    assert cut is not None and cut.partials.rows == [(0.0, 10.0, "[1]", 2), (0.0, 10.0, "[2]", 1)]
    assert aggregator_from_spec({"kind": "Count"}).apply(None, cut.partials.rows[0][3]) == 2


@pytest.mark.parametrize("seed", range(40))
def test_no_window_task_watermark_passes_the_bound_of_a_batch_it_has_not_read(seed):
    """The rule of :func:`lateness_threshold`, against :class:`Watermark` itself: three source
    tasks publish batches (each file: records and the task's progress report) in their own
    order, interleaved at random; a window task reads them in publish order, a few files per
    window batch. At the start of every window batch its watermark is at most the bound each
    file it reads was cut with."""
    rng = random.Random(seed)
    lag = rng.choice([0.0, 1.0, 5.0])
    files = {c: [rng.uniform(-50, 50) + i * rng.uniform(0, 20) for i in range(rng.randint(1, 8))] for c in ("0/0", "0/1", "1/0")}
    mark = Watermark(lag, None, 0.0, channels=list(files))
    pending = _publish_order(files, lag, rng)
    while pending:
        size = rng.randint(1, 4)
        window_batch, pending = pending[:size], pending[size:]
        start = mark.value(0.0)
        assert start is None or all(start <= bound for _, bound, _ in window_batch)
        for channel, _, batch_max in window_batch:
            mark.report(channel, batch_max, 0.0)


def _publish_order(files: dict[str, list[float]], lag: float, rng: random.Random) -> list[tuple[str, float, float]]:
    """The files of every source task in one publish order that keeps each task's own order:
    (channel, the bound its batch was cut with, the largest event time it reports)."""
    order = [c for c in files for _ in files[c]]
    rng.shuffle(order)
    sent: dict[str, float | None] = dict.fromkeys(files)
    taken = dict.fromkeys(files, 0)
    published = []
    for channel in order:
        batch_max = files[channel][taken[channel]]
        taken[channel] += 1
        published.append((channel, lateness_threshold(sent[channel], lag), batch_max))
        previous = sent[channel]
        sent[channel] = batch_max if previous is None else max(previous, batch_max)
    return published


def test_the_bound_is_sharp_a_record_just_below_it_can_be_late():
    """Below the bound a record may be late: the window task may have read every earlier batch
    of a task that is the slowest channel."""
    mark = Watermark(5.0, None, 0.0, channels=[CHANNEL])
    mark.report(CHANNEL, 100.0, 0.0)
    bound = lateness_threshold(100.0, 5.0)
    assert mark.value(0.0) == bound
    below = math.nextafter(bound, -math.inf)
    assert below < mark.value(0.0) <= bound
