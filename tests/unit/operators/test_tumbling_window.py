"""Tumbling windows for the JoinBolt: count and time windows, checkpoint round trips."""

from __future__ import annotations

import json

import pytest

from stream_ops.errors import StateError, TopologyDefinitionError
from stream_ops.operators import JoinBolt, TumblingWindow, WindowSpec


def test_count_window_closes_after_n_records_of_all_streams():
    window = TumblingWindow(count=3)
    assert window.add("a", {"n": 1}, now=0.0) == []
    assert window.add("b", {"n": 2}, now=100.0) == []  # time plays no part
    assert window.add("a", {"n": 3}, now=200.0) == [[("a", {"n": 1}), ("b", {"n": 2}), ("a", {"n": 3})]]
    assert window.pending == 0
    assert window.add("a", {"n": 4}, now=300.0) == []
    assert window.flush(now=10_000.0) == []
    assert window.flush(now=10_000.0, force=True) == [[("a", {"n": 4})]]
    assert window.flush(now=10_000.0, force=True) == []


def test_time_window_is_aligned_and_closes_when_now_reaches_its_end():
    window = TumblingWindow(seconds=10)
    assert window.add("a", {"n": 1}, now=13.0) == []  # window [10, 20)
    assert window.add("b", {"n": 2}, now=19.999) == []
    assert window.flush(now=19.999) == []
    assert window.add("a", {"n": 3}, now=20.0) == [[("a", {"n": 1}), ("b", {"n": 2})]]  # opens [20, 30)
    assert window.flush(now=29.0) == []
    assert window.flush(now=30.0) == [[("a", {"n": 3})]]
    assert window.flush(now=40.0) == []  # empty windows are never returned


def test_time_window_after_a_gap_starts_at_the_new_time():
    window = TumblingWindow(seconds=10)
    window.add("a", {"n": 1}, now=5.0)
    assert window.add("a", {"n": 2}, now=35.0) == [[("a", {"n": 1})]]
    assert window.state()["start"] == 30.0
    assert window.flush(now=39.0) == []
    assert window.flush(now=40.0) == [[("a", {"n": 2})]]


def test_force_flush_returns_an_open_time_window():
    window = TumblingWindow(seconds=60)
    window.add("a", {"n": 1}, now=1.0)
    assert window.flush(now=2.0, force=True) == [[("a", {"n": 1})]]


def _feed(window: TumblingWindow, items, out):
    for stream, record, now in items:
        out.extend(window.add(stream, record, now))


@pytest.mark.parametrize("size", [{"count": 3}, {"seconds": 10}])
def test_state_restore_round_trip_continues_exactly(size):
    items = [("a", {"n": i, "nested": {"x": [i]}}, float(i * 3)) for i in range(12)]
    uninterrupted: list = []
    reference = TumblingWindow(**size)
    _feed(reference, items, uninterrupted)

    first = TumblingWindow(**size)
    resumed: list = []
    _feed(first, items[:5], resumed)
    snapshot = json.loads(json.dumps(first.state()))
    second = TumblingWindow(**size)
    second.restore(snapshot)
    _feed(second, items[5:], resumed)
    assert resumed == uninterrupted
    assert second.state() == reference.state()
    assert TumblingWindow.from_state(snapshot).state() == snapshot


def test_restore_refuses_another_size_or_garbage():
    window = TumblingWindow(count=2)
    window.add("a", {"n": 1}, now=0.0)
    with pytest.raises(StateError, match="taken with {'count': 2}"):
        TumblingWindow(count=3).restore(window.state())
    with pytest.raises(StateError, match="not a tumbling window snapshot"):
        TumblingWindow(count=2).restore({"count": 2})


def test_state_refuses_records_that_are_not_json():
    window = TumblingWindow(count=5)
    window.add("a", {"when": {1, 2}}, now=0.0)
    with pytest.raises(StateError, match="not JSON-able"):
        window.state()


def test_window_spec_validation():
    assert WindowSpec.from_spec(WindowSpec(count=4).to_spec()) == WindowSpec(count=4)
    with pytest.raises(TopologyDefinitionError, match="exactly one of"):
        TumblingWindow()


def test_join_bolt_over_count_windows():
    bolt = JoinBolt("users", "id").join("orders", "user_id", "users").select("id, name, amount").with_tumbling_window(count=2)
    window = bolt.tumbling_window()
    assert window.spec == WindowSpec(count=2)
    results = []
    stream = [
        ("users", {"id": 1, "name": "ann"}),
        ("orders", {"user_id": 1, "amount": 10}),
        ("orders", {"user_id": 1, "amount": 11}),  # next window: no user 1 there
        ("users", {"id": 1, "name": "ann"}),
    ]
    for t, (name, record) in enumerate(stream):
        for complete in window.add(name, record, now=float(t)):
            results.append(bolt.execute(complete))
    assert results == [[[1, "ann", 10]], [[1, "ann", 11]]]
