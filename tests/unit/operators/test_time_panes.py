"""The pane index of time-window records: a window or a cut inside a pane reads each record's time there."""

from __future__ import annotations

from stream_ops.operators.time_panes import PaneIndex


def _index(*times: float) -> PaneIndex:
    panes = PaneIndex(slide=5.0)
    panes.add([(seq, t, "a", {"t": t}) for seq, t in enumerate(times)])
    return panes


def test_a_window_starting_or_ending_inside_a_pane_takes_only_its_records_in_arrival_order():
    panes = _index(6.0, 1.0, 9.0, 5.0, 12.0, 7.5, 14.9)
    assert [t for _, t, _, _ in panes.window(5.5, 12.5)] == [6.0, 9.0, 12.0, 7.5]
    assert [t for _, t, _, _ in panes.window(0.0, 5.0)] == [1.0]
    assert panes.window(15.0, 20.0) == []


def test_dropping_before_a_time_inside_a_pane_keeps_that_pane_s_later_records():
    panes = _index(5.0, 6.0, 7.0, 2.0, 11.0)
    panes.drop_before(6.5)
    assert len(panes) == 2 and panes.earliest() == 7.0
    assert [t for _, t, _, _ in panes.take_all()] == [7.0, 11.0]
    assert len(panes) == 0 and panes.earliest() is None


def test_a_written_chunk_is_reported_dropped_once_all_its_records_are_gone():
    panes = _index(5.0, 6.0)
    [(index, _)] = panes.fresh()
    panes.written([("k", index)])
    panes.add([(2, 7.0, "a", {})])  # a new chunk of the same pane
    panes.drop_before(6.5)
    assert panes.take_dropped() == [("k", 1)]
    assert [(index, [t for _, t, _, _ in chunk.items]) for index, chunk in panes.fresh()] == [(1, [7.0])]
