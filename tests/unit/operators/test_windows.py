"""The window model: lengths, definitions, assignment and the watermark, against hand-computed values."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from stream_ops.errors import TopologyDefinitionError
from stream_ops.topology.windows import Duration, Records, Session, Sliding, Tumbling, Watermark, WindowDef


def test_lengths_accept_storm_forms_numbers_and_timedeltas():
    assert Duration.of(1500) == Duration.seconds(1.5) == Tumbling(1.5).length == Tumbling(timedelta(milliseconds=1500)).length
    assert Duration.minutes(2) == Duration.seconds(120)
    assert Tumbling(Records.of(10)).length == Records(10)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Tumbling(0), "positive"),
        (lambda: Tumbling("10s"), "not a window length"),
        (lambda: Records.of(0), "positive integer"),
        (lambda: Sliding(10, Records.of(2)), "both be durations"),
        (lambda: Sliding(5, 10), "slide is longer than the window"),
        (lambda: Session(Records.of(3)), "gap is a duration"),
    ],
)
def test_bad_lengths_fail_at_definition(make, message):
    with pytest.raises(TopologyDefinitionError, match=message):
        make()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"time": "wall"}, "time must be"),
        ({"time": "event"}, "timestamp_field"),
        ({"timestamp_field": "ts"}, "needs time='event'"),
        ({"lag": 5}, "lag applies to event time only"),
        ({"late_stream": "late"}, "late_stream needs time='event'"),
        ({"time": "event", "timestamp_field": "ts", "lag": -1}, "lag must be >= 0"),
        ({"time": "event", "timestamp_field": "ts", "timestamp_unit": "us"}, "timestamp_unit"),
    ],
)
def test_bad_window_arguments_name_the_problem(kwargs, message):
    with pytest.raises(TopologyDefinitionError, match=message):
        WindowDef.build(Tumbling(10), **kwargs)


def test_event_time_count_windows_are_refused():
    with pytest.raises(TopologyDefinitionError, match="arrival order"):
        WindowDef.build(Tumbling(Records.of(5)), time="event", timestamp_field="ts")


def test_tumbling_windows_are_epoch_aligned():
    window = WindowDef.build(Tumbling(10))
    assert window.windows_of(0.0) == [(0.0, 10.0)]
    assert window.windows_of(9.999) == [(0.0, 10.0)]
    assert window.windows_of(10.0) == [(10.0, 20.0)]
    assert window.windows_of(-0.5) == [(-10.0, 0.0)]


def test_sliding_windows_cover_a_time_length_over_slide_times():
    window = WindowDef.build(Sliding(10, 5))
    assert window.windows_of(12.0) == [(5.0, 15.0), (10.0, 20.0)]
    assert window.windows_of(10.0) == [(5.0, 15.0), (10.0, 20.0)]
    assert window.windows_of(9.0) == [(0.0, 10.0), (5.0, 15.0)]
    thirds = WindowDef.build(Sliding(3, 1))
    assert thirds.windows_of(4.5) == [(2.0, 5.0), (3.0, 6.0), (4.0, 7.0)]


def test_event_time_reads_seconds_or_milliseconds_and_rejects_junk():
    seconds = WindowDef.build(Tumbling(10), time="event", timestamp_field="ts")
    millis = WindowDef.build(Tumbling(10), time="event", timestamp_field="meta.ts", timestamp_unit="ms")
    assert seconds.event_time({"ts": 12}) == 12.0
    assert millis.event_time({"meta": {"ts": 12_500}}) == 12.5
    assert seconds.event_time({"ts": "12"}) is None
    assert seconds.event_time({"ts": True}) is None
    assert seconds.event_time({}) is None


def test_definition_round_trips_through_json():
    window = WindowDef.build(Sliding(60, 10), time="event", timestamp_field="ts", lag=5, late_stream="late")
    assert WindowDef.from_spec(json.loads(json.dumps(window.to_spec()))) == window
    assert window.idle_timeout is None  # waits for data unless asked
    assert WindowDef.build(Tumbling(1), time="event", timestamp_field="ts", idle_timeout=3).idle_timeout == 3.0
    with pytest.raises(TopologyDefinitionError, match="idle_timeout applies to event time only"):
        WindowDef.build(Tumbling(1), idle_timeout=3)


def test_watermark_needs_the_channels_it_waits_for():
    with pytest.raises(ValueError, match="needs the upstream channels"):
        Watermark(lag=5, idle_timeout=None, now=0.0, channels=[])


def test_watermark_is_the_reported_maximum_minus_lag_and_never_goes_back():
    mark = Watermark(lag=5, idle_timeout=None, now=0.0, channels=["a/0"])
    assert mark.value(0.0) is None
    mark.report("a/0", 100.0, now=0.0)
    mark.report("a/0", 90.0, now=1.0)  # out of order: the maximum stays
    assert mark.value(1.0) == 95.0
    assert mark.value(1000.0) == 95.0  # no idle advance without an idle timeout


def test_idle_watermark_moves_with_processing_time_and_keeps_its_gain():
    mark = Watermark(lag=2, idle_timeout=3, now=0.0, channels=["a/0"])
    mark.report("a/0", 50.0, now=0.0)
    assert mark.value(3.0) == 48.0
    assert mark.value(7.0) == 52.0  # idle 7 s > 3 s: +4
    mark.report("a/0", 49.0, now=7.0)  # an older report does not pull it back
    assert mark.value(7.5) == 52.0


def test_watermark_restore_keeps_progress_and_restarts_the_idle_clock():
    mark = Watermark(lag=2, idle_timeout=3, now=0.0, channels=["a/0"])
    mark.report("a/0", 50.0, now=0.0)
    state = json.loads(json.dumps(mark.state(now=1.0)))
    moved = Watermark(lag=2, idle_timeout=3, now=500.0, channels=["a/0"])
    moved.restore(state, now=500.0)
    assert moved.value(500.0) == 48.0  # the move's downtime does not count as idle time
    assert moved.value(505.0) == 50.0


def test_channel_watermark_waits_for_the_slowest_upstream_task():
    mark = Watermark(lag=1, idle_timeout=None, now=0.0, channels=["words/0", "words/1"])
    mark.report("words/0", 100.0, now=0.0)  # alone it would say 99
    assert mark.value(0.0) is None  # words/1 not heard from yet
    mark.report("words/1", 20.0, now=0.0)
    assert mark.value(0.0) == 19.0  # channel reports decide, the slowest one wins
    mark.report("words/1", 60.0, now=1.0)
    assert mark.value(1.0) == 59.0
    mark.report("words/1", 30.0, now=2.0)  # a report never lowers its channel
    assert mark.channels["words/1"] == 60.0
    assert mark.value(1000.0) == 59.0  # no idle timeout: it waits for data


def test_channel_watermark_never_goes_back_when_a_new_channel_reports():
    mark = Watermark(lag=0, idle_timeout=None, now=0.0, channels=["a/0"])
    mark.report("a/0", 50.0, now=0.0)
    assert mark.value(0.0) == 50.0
    mark.report("a/1", 10.0, now=1.0)  # a channel the plan did not list
    assert mark.value(1.0) == 50.0


def test_an_idle_channel_stops_holding_the_watermark_back():
    mark = Watermark(lag=0, idle_timeout=5, now=0.0, channels=["a/0", "a/1"])
    mark.report("a/0", 10.0, now=0.0)
    mark.report("a/1", 100.0, now=0.0)
    assert mark.value(4.0) == 10.0
    mark.report("a/1", 110.0, now=6.0)  # a/0 silent for 6 s > 5 s
    assert mark.value(6.0) == 110.0
    assert mark.value(20.0) == 110.0 + 20.0 - 6.0 - 5.0  # all idle: moves with processing time


def test_channel_progress_survives_a_restore():
    mark = Watermark(lag=0, idle_timeout=None, now=0.0, channels=["a/0", "a/1"])
    mark.report("a/0", 10.0, now=0.0)
    mark.report("a/1", 30.0, now=0.0)
    moved = Watermark(lag=0, idle_timeout=None, now=50.0, channels=["a/0", "a/1"])
    moved.restore(json.loads(json.dumps(mark.state(now=1.0))), now=50.0)
    moved.report("a/0", 40.0, now=51.0)
    assert moved.value(51.0) == 30.0
