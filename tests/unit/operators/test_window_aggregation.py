"""Windowed aggregation: assignment, closing, late records, counts, sessions and restores,
each against hand-computed expectations."""

from __future__ import annotations

import json

import pytest

from stream_ops.operators.aggregators import Count, Max, Sum
from stream_ops.operators.window_aggregation import WindowBatch, WindowedAggregation
from stream_ops.topology.windows import Records, Session, Sliding, Tumbling, WindowDef

CHANNEL = "0/0"
"""The one upstream task of these aggregations."""


def _event(shape, **kwargs) -> WindowDef:
    return WindowDef.build(shape, time="event", timestamp_field="ts", idle_timeout=kwargs.pop("idle_timeout", None), **kwargs)


def _process(agg: WindowedAggregation, records: list[dict], now: float) -> WindowBatch:
    """One batch from the upstream task, with its progress report (the largest event time it sent)."""
    times = [r["ts"] for r in records if isinstance(r.get("ts"), (int, float))]
    return agg.process(records, now, progress=[(CHANNEL, float(max(times)))] if times else [])


def _rows(results):
    return [(r.get("user"), r["n"], r["window_start"], r["window_end"]) for r in results]


def test_event_time_tumbling_counts_close_at_the_watermark():
    agg = WindowedAggregation(_event(Tumbling(10), lag=2), ("user",), Count(), "n", now=0.0, channels=[CHANNEL])
    batch = _process(agg, [{"user": "a", "ts": 1}, {"user": "b", "ts": 4}, {"user": "a", "ts": 9}], now=0.0)
    assert batch.results == []  # watermark 7: [0, 10) is still open
    batch = _process(agg, [{"user": "a", "ts": 12}], now=1.0)  # watermark 10
    assert _rows(batch.results) == [("a", 2, 0.0, 10.0), ("b", 1, 0.0, 10.0)]
    batch = _process(agg, [{"user": "a", "ts": 25}], now=2.0)  # watermark 23
    assert _rows(batch.results) == [("a", 1, 10.0, 20.0)]


def test_late_records_go_to_the_late_list_and_count_nowhere():
    agg = WindowedAggregation(_event(Tumbling(10), lag=0), ("user",), Count(), "n", now=0.0, channels=[CHANNEL])
    _process(agg, [{"user": "a", "ts": 15}], now=0.0)  # watermark 15
    batch = _process(agg, [{"user": "a", "ts": 14}, {"user": "a", "ts": 16}, {"user": "a", "ts": 3}], now=1.0)
    assert batch.late == [{"user": "a", "ts": 14}, {"user": "a", "ts": 3}]
    batch = _process(agg, [{"user": "a", "ts": 40}], now=2.0)
    assert _rows(batch.results) == [("a", 2, 10.0, 20.0)]


def test_records_of_one_batch_are_never_late_to_each_other():
    agg = WindowedAggregation(_event(Tumbling(10)), ("user",), Count(), "n", now=0.0, channels=[CHANNEL])
    batch = _process(agg, [{"user": "a", "ts": 30}, {"user": "a", "ts": 5}], now=0.0)
    assert batch.late == []
    assert _rows(batch.results) == [("a", 1, 0.0, 10.0)]


def test_sliding_event_windows_count_each_record_in_every_covering_window():
    agg = WindowedAggregation(_event(Sliding(10, 5)), (), Count(), "n", now=0.0, channels=[CHANNEL])
    batch = _process(agg, [{"ts": 1}, {"ts": 6}, {"ts": 12}], now=0.0)  # watermark 12
    assert [(r["n"], r["window_start"]) for r in batch.results] == [(1, -5.0), (2, 0.0)]
    batch = _process(agg, [{"ts": 30}], now=1.0)
    assert [(r["n"], r["window_start"]) for r in batch.results] == [(2, 5.0), (1, 10.0)]


def test_unusable_timestamps_and_failing_aggregators_are_dead_letters():
    agg = WindowedAggregation(_event(Tumbling(10)), ("user",), Sum("v"), "n", now=0.0, channels=[CHANNEL])
    batch = _process(
        agg, [{"user": "a", "ts": "x", "v": 1}, {"user": "a", "ts": 1, "v": "two"}, {"user": "a", "ts": 2, "v": 3}], now=0.0
    )
    assert [d["error"] for d in batch.dead][0] == "no usable event time in field 'ts'"
    assert len(batch.dead) == 2
    assert _rows(_process(agg, [{"user": "a", "ts": 20, "v": 0}], now=1.0).results) == [("a", 3, 0.0, 10.0)]


def test_processing_time_windows_close_on_the_clock():
    agg = WindowedAggregation(WindowDef.build(Tumbling(10)), ("user",), Count(), "n", now=0.0)
    assert agg.process([{"user": "a"}, {"user": "a"}], now=3.0).results == []
    assert agg.close(now=9.9) == []
    assert _rows(agg.close(now=10.0)) == [("a", 2, 0.0, 10.0)]
    assert agg.close(now=50.0) == []


def test_idle_timeout_closes_the_last_window_without_new_data():
    agg = WindowedAggregation(_event(Tumbling(10), lag=1, idle_timeout=2), ("user",), Count(), "n", now=0.0, channels=[CHANNEL])
    _process(agg, [{"user": "a", "ts": 8}], now=0.0)
    assert agg.close(now=2.0) == []  # watermark 7
    assert agg.close(now=4.0) == []  # idle 4 s > 2 s: 9
    assert _rows(agg.close(now=5.0)) == [("a", 1, 0.0, 10.0)]  # 10


def test_tumbling_count_windows_count_per_key():
    agg = WindowedAggregation(WindowDef.build(Tumbling(Records.of(3))), ("user",), Sum("v"), "n", now=0.0)
    batch = agg.process([{"user": "a", "v": 1}, {"user": "b", "v": 10}, {"user": "a", "v": 2}, {"user": "a", "v": 4}], now=5.0)
    assert _rows(batch.results) == [("a", 7, 5.0, 5.0)]
    batch = agg.process([{"user": "b", "v": 20}, {"user": "b", "v": 30}], now=6.0)
    assert _rows(batch.results) == [("b", 60, 5.0, 6.0)]  # its first record came at 5.0
    assert agg.open_windows == 0


def test_sliding_count_windows_emit_every_slide_over_the_last_length():
    agg = WindowedAggregation(WindowDef.build(Sliding(Records.of(4), Records.of(2))), (), Max("v"), "n", now=0.0)
    batch = agg.process([{"v": v} for v in (5, 1, 2, 3, 0, 1)], now=0.0)
    assert [r["n"] for r in batch.results] == [5, 5, 3]  # [5,1] [5,1,2,3] [2,3,0,1]


def test_sessions_merge_records_closer_than_the_gap():
    agg = WindowedAggregation(_event(Session(5)), ("user",), Count(), "n", now=0.0, channels=[CHANNEL])
    _process(agg, [{"user": "a", "ts": 1}, {"user": "a", "ts": 4}, {"user": "a", "ts": 20}, {"user": "b", "ts": 2}], now=0.0)
    # [1, 9) and [2, 7) closed at watermark 20; a's [20, 25) still open
    batch = _process(agg, [{"user": "a", "ts": 23}], now=1.0)
    assert batch.results == []
    batch = _process(agg, [{"user": "a", "ts": 8.5}], now=2.0)
    assert batch.late == [{"user": "a", "ts": 8.5}]
    batch = _process(agg, [{"user": "c", "ts": 100}], now=3.0)
    assert _rows(batch.results) == [("a", 2, 20.0, 28.0)]


def test_a_record_between_two_sessions_bridges_them():
    agg = WindowedAggregation(_event(Session(5)), ("user",), Count(), "n", now=0.0, channels=[CHANNEL])
    _process(agg, [{"user": "a", "ts": 10}, {"user": "a", "ts": 18}, {"user": "a", "ts": 14}], now=0.0)
    batch = _process(agg, [{"user": "z", "ts": 100}], now=1.0)
    assert _rows(batch.results) == [("a", 3, 10.0, 23.0)]


@pytest.mark.parametrize(
    "window",
    [
        _event(Tumbling(10), lag=3),
        _event(Sliding(10, 5), lag=3),
        _event(Session(4), lag=3),
        WindowDef.build(Tumbling(Records.of(3))),
        WindowDef.build(Sliding(Records.of(3), Records.of(2))),
    ],
    ids=["tumbling", "sliding", "session", "count", "sliding-count"],
)
def test_restoring_from_the_changes_continues_exactly(window):
    batches = [
        [{"user": u, "ts": t, "v": t} for u, t in chunk]
        for chunk in (
            [("a", 1), ("b", 2), ("a", 3)],
            [("a", 9), ("b", 11), ("a", 12)],
            [("b", 14), ("a", 30), ("a", 31)],
            [("a", 60), ("b", 61)],
        )
    ]

    def run(split: int | None) -> list:
        agg = WindowedAggregation(window, ("user",), Sum("v"), "n", now=0.0, channels=[CHANNEL])
        store: dict = {}
        results = []
        for i, batch in enumerate(batches):
            if i == split:  # a move: a new instance rebuilt from the stored entries only
                agg = WindowedAggregation(window, ("user",), Sum("v"), "n", now=float(i), channels=[CHANNEL])
                stored = json.loads(json.dumps([[list(k), v] for k, v in store.items()]))
                agg.restore([(tuple(k), v) for k, v in stored], now=float(i))
            out = _process(agg, batch, now=float(i))
            results.append((out.results, out.late))
            puts, deletes = agg.changes()
            store.update(puts)
            for key in deletes:
                store.pop(key, None)
        return results

    assert run(split=2) == run(split=None)
    assert run(split=3) == run(split=None)


def test_a_task_running_ahead_does_not_make_the_slower_ones_records_late():
    """Two upstream tasks (channels 0/0 and 0/1); task 0 is several batches ahead."""
    agg = WindowedAggregation(_event(Tumbling(10)), ("user",), Count(), "n", now=0.0, channels=["0/0", "0/1"])
    batch = agg.process([{"user": "a", "ts": 35}], now=0.0, progress=[("0/0", 35.0)])
    assert batch.results == []  # 0/1 not heard from: no watermark yet
    batch = agg.process([{"user": "a", "ts": 3}, {"user": "a", "ts": 8}], now=1.0, progress=[("0/1", 8.0)])
    assert batch.late == []  # 0/0's report alone would have put the watermark at 35
    assert batch.results == []  # watermark min(35, 8) = 8: [0, 10) stays open
    batch = agg.process([{"user": "a", "ts": 21}, {"user": "a", "ts": 2}], now=2.0, progress=[("0/1", 21.0)])
    assert batch.late == [{"user": "a", "ts": 2}]  # before the watermark 8
    assert _rows(batch.results) == [("a", 2, 0.0, 10.0)]  # watermark min(35, 21) = 21
    batch = agg.process([], now=3.0, progress=[("0/0", 50.0), ("0/1", 40.0)])
    assert _rows(batch.results) == [("a", 1, 20.0, 30.0), ("a", 1, 30.0, 40.0)]


def test_an_upstream_task_without_data_holds_windows_until_its_idle_timeout():
    agg = WindowedAggregation(_event(Tumbling(10), idle_timeout=5), ("user",), Count(), "n", now=0.0, channels=["0/0", "0/1"])
    batch = agg.process([{"user": "a", "ts": 3}], now=1.0, progress=[("0/0", 30.0)])
    assert batch.results == []  # 0/1 silent for 1 s
    assert _rows(agg.close(now=6.0)) == [("a", 1, 0.0, 10.0)]  # 0/1 idle past 5 s: 0/0 alone decides
