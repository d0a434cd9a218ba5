"""HeartbeatTracker: pure liveness rules, driven by an explicit ``now``."""

from __future__ import annotations

import pytest

from stream_ops.nimbus.monitor import (
    REASON_HEARTBEAT_MISSING,
    REASON_WORKER_GONE,
    HeartbeatTracker,
    MonitorAction,
)

TOPO = "wc-1-1700000000"
W1 = "h1:6700"
W2 = "h2:6700"
TIMEOUT = 10.0
GRACE = 60.0


def dead(
    tracker: HeartbeatTracker,
    assigned: dict[int, str],
    now: float,
    *,
    start_times: dict[int, float] | None = None,
    live: set[str] | None = None,
    timeout: float = TIMEOUT,
    grace: float = GRACE,
    topology: str = TOPO,
) -> dict[int, str]:
    return tracker.dead_tasks(
        topology,
        assigned,
        start_times if start_times is not None else {t: 1000.0 for t in assigned},
        live if live is not None else {W1, W2},
        now,
        timeout,
        grace,
    )


def beat_series(tracker: HeartbeatTracker, task: int, times: list[float], *, topology: str = TOPO) -> None:
    """Observe a new fingerprint at each time (a worker beating)."""
    for i, t in enumerate(times):
        tracker.observe(topology, task, (W1, 1, 100 + i), t)


# --- fresh, stale, missing ---------------------------------------------------------------------


def test_fresh_heartbeats_keep_a_task_alive_long_after_grace() -> None:
    tracker = HeartbeatTracker()
    for step in range(0, 200):
        now = step * 2.0
        tracker.observe(TOPO, 0, (W1, 1, step), now)
        assert dead(tracker, {0: W1}, now) == {}


def test_stale_heartbeat_after_grace_is_dead_with_its_age() -> None:
    tracker = HeartbeatTracker()
    tracker.observe(TOPO, 0, (W1, 1, 1), 0.0)
    assert dead(tracker, {0: W1}, 0.0) == {}
    tracker.observe(TOPO, 0, (W1, 1, 2), 55.0)  # last change at 55 by the monitor's clock
    for now in (56.0, 60.0, 64.9, 65.0):
        tracker.observe(TOPO, 0, (W1, 1, 2), now)
        assert dead(tracker, {0: W1}, now) == {}, now
    tracker.observe(TOPO, 0, (W1, 1, 2), 67.3)
    assert dead(tracker, {0: W1}, 67.3) == {0: "heartbeat stale 12.3 s"}


def test_timeout_is_strict() -> None:
    tracker = HeartbeatTracker()
    tracker.observe(TOPO, 0, "fp", 0.0)
    assert dead(tracker, {0: W1}, 0.0, grace=0.0) == {}
    assert dead(tracker, {0: W1}, 10.0, grace=0.0) == {}
    assert dead(tracker, {0: W1}, 10.01, grace=0.0) == {0: "heartbeat stale 10.0 s"}


def test_missing_heartbeat_after_grace_is_dead() -> None:
    tracker = HeartbeatTracker()
    for now in (0.0, 30.0, 60.0):
        tracker.observe(TOPO, 0, None, now)
        assert dead(tracker, {0: W1}, now) == {}
    tracker.observe(TOPO, 0, None, 60.5)
    assert dead(tracker, {0: W1}, 60.5) == {0: REASON_HEARTBEAT_MISSING}


def test_heartbeat_vanishing_after_grace_counts_from_when_it_vanished() -> None:
    tracker = HeartbeatTracker()
    dead(tracker, {0: W1}, 0.0)  # the pairing is first seen at 0: grace until 60
    beat_series(tracker, 0, [float(t) for t in range(0, 100, 2)])
    assert dead(tracker, {0: W1}, 98.0) == {}
    tracker.observe(TOPO, 0, None, 100.0)
    assert dead(tracker, {0: W1}, 100.0) == {}
    tracker.observe(TOPO, 0, None, 110.0)
    assert dead(tracker, {0: W1}, 110.0) == {}
    tracker.observe(TOPO, 0, None, 110.5)
    assert dead(tracker, {0: W1}, 110.5) == {0: REASON_HEARTBEAT_MISSING}


def test_task_recovers_when_its_heartbeat_changes_again() -> None:
    tracker = HeartbeatTracker()
    tracker.observe(TOPO, 0, "a", 0.0)
    dead(tracker, {0: W1}, 0.0, grace=1.0)
    assert dead(tracker, {0: W1}, 20.0, grace=1.0) == {0: "heartbeat stale 20.0 s"}
    tracker.observe(TOPO, 0, "b", 21.0)
    assert dead(tracker, {0: W1}, 21.0, grace=1.0) == {}


def test_grace_runs_from_the_first_dead_tasks_call_that_sees_the_pairing() -> None:
    """observe() alone does not know the worker: the pairing starts when dead_tasks sees it."""
    tracker = HeartbeatTracker()
    tracker.observe(TOPO, 0, "x", 0.0)
    assert dead(tracker, {0: W1}, 50.0) == {}
    assert dead(tracker, {0: W1}, 110.0) == {}
    assert dead(tracker, {0: W1}, 110.5) == {0: "heartbeat stale 110.5 s"}


def test_unobserved_task_counts_as_missing_from_first_sight() -> None:
    tracker = HeartbeatTracker()
    assert dead(tracker, {0: W1}, 0.0, grace=5.0, timeout=1.0) == {}
    assert dead(tracker, {0: W1}, 5.0, grace=5.0, timeout=1.0) == {}
    assert dead(tracker, {0: W1}, 5.5, grace=5.0, timeout=1.0) == {0: REASON_HEARTBEAT_MISSING}


def test_same_fingerprint_observed_repeatedly_does_not_refresh() -> None:
    tracker = HeartbeatTracker()
    for now in range(0, 80):
        tracker.observe(TOPO, 0, ("w", 5, 5), float(now))
        dead(tracker, {0: W1}, float(now))
    assert tracker.heartbeat_age(TOPO, 0, 79.0) == 79.0
    assert dead(tracker, {0: W1}, 79.0) == {0: "heartbeat stale 79.0 s"}


def test_heartbeat_age_of_unknown_task_is_none() -> None:
    assert HeartbeatTracker().heartbeat_age(TOPO, 3, 10.0) is None


# --- launch grace ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fingerprint", "now", "expected"),
    [
        (None, 0.0, {}),
        (None, 59.9, {}),
        (None, 60.0, {}),
        (None, 60.1, {0: REASON_HEARTBEAT_MISSING}),
        ("stuck", 59.9, {}),
        ("stuck", 60.0, {}),
        ("stuck", 61.0, {0: "heartbeat stale 61.0 s"}),
    ],
)
def test_grace_boundary(fingerprint: str | None, now: float, expected: dict[int, str]) -> None:
    tracker = HeartbeatTracker()
    tracker.observe(TOPO, 0, fingerprint, 0.0)
    dead(tracker, {0: W1}, 0.0)
    assert dead(tracker, {0: W1}, now) == expected


def test_reassignment_to_another_worker_restarts_the_grace() -> None:
    tracker = HeartbeatTracker()
    tracker.observe(TOPO, 0, None, 0.0)
    dead(tracker, {0: W1}, 0.0)
    assert dead(tracker, {0: W1}, 70.0) == {0: REASON_HEARTBEAT_MISSING}
    # Moved to W2 at 70: a new pairing, new grace.
    assert dead(tracker, {0: W2}, 70.0, start_times={0: 2000.0}) == {}
    assert dead(tracker, {0: W2}, 129.0, start_times={0: 2000.0}) == {}
    assert dead(tracker, {0: W2}, 130.5, start_times={0: 2000.0}) == {0: REASON_HEARTBEAT_MISSING}


def test_moving_away_and_back_between_polls_restarts_the_grace_via_start_time() -> None:
    tracker = HeartbeatTracker()
    tracker.observe(TOPO, 0, "old", 0.0)
    dead(tracker, {0: W1}, 0.0, start_times={0: 1.0})
    assert dead(tracker, {0: W1}, 80.0, start_times={0: 1.0}) == {0: "heartbeat stale 80.0 s"}
    # Same worker, but a different start time: it was reassigned meanwhile.
    assert dead(tracker, {0: W1}, 80.0, start_times={0: 2.0}) == {}
    assert dead(tracker, {0: W1}, 139.0, start_times={0: 2.0}) == {}


def test_missing_start_time_is_a_stable_pairing() -> None:
    tracker = HeartbeatTracker()
    tracker.observe(TOPO, 0, "x", 0.0)
    assert dead(tracker, {0: W1}, 0.0, start_times={}) == {}
    assert dead(tracker, {0: W1}, 61.0, start_times={}) == {0: "heartbeat stale 61.0 s"}


def test_unassigned_task_loses_its_pairing_and_gets_a_new_grace() -> None:
    tracker = HeartbeatTracker()
    tracker.observe(TOPO, 0, "x", 0.0)
    dead(tracker, {0: W1, 1: W1}, 0.0)
    assert 0 in dead(tracker, {0: W1, 1: W1}, 61.0)
    dead(tracker, {1: W1}, 62.0)  # task 0 left the assignment
    assert 0 not in dead(tracker, {0: W1, 1: W1}, 63.0)  # back: fresh grace


def test_zero_grace_means_heartbeat_rules_apply_immediately() -> None:
    tracker = HeartbeatTracker()
    tracker.observe(TOPO, 0, None, 0.0)
    assert dead(tracker, {0: W1}, 0.0, grace=0.0, timeout=1.0) == {}
    assert dead(tracker, {0: W1}, 1.5, grace=0.0, timeout=1.0) == {0: REASON_HEARTBEAT_MISSING}


# --- worker gone -------------------------------------------------------------------------------


def test_worker_gone_is_dead_at_once_even_within_grace() -> None:
    tracker = HeartbeatTracker()
    tracker.observe(TOPO, 0, "fresh", 0.0)
    tracker.observe(TOPO, 1, "fresh", 0.0)
    result = dead(tracker, {0: W1, 1: W2}, 0.0, live={W2})
    assert result == {0: REASON_WORKER_GONE}


def test_no_live_workers_means_every_task_is_dead() -> None:
    tracker = HeartbeatTracker()
    assigned = {t: (W1 if t % 2 else W2) for t in range(6)}
    assert dead(tracker, assigned, 5.0, live=set()) == dict.fromkeys(range(6), REASON_WORKER_GONE)


def test_worker_gone_wins_over_stale() -> None:
    tracker = HeartbeatTracker()
    tracker.observe(TOPO, 0, "x", 0.0)
    dead(tracker, {0: W1}, 0.0)
    assert dead(tracker, {0: W1}, 100.0, live={W2}) == {0: REASON_WORKER_GONE}


# --- clock skew --------------------------------------------------------------------------------


@pytest.mark.parametrize("skew", [-86_400.0, -3.0, 0.0, 7.5, 3_600.0, 1e9])
def test_start_times_from_a_skewed_clock_change_nothing(skew: float) -> None:
    """Start times are another process's wall clock: only their equality matters."""
    outcomes = []
    for start in (0.0 + skew, 1_700_000_000.0 + skew):
        tracker = HeartbeatTracker()
        seq = []
        for now in (100.0, 130.0, 160.0, 160.5, 170.0, 171.0):
            tracker.observe(TOPO, 0, "same", now)
            seq.append(dead(tracker, {0: W1}, now, start_times={0: start}, timeout=10.0, grace=60.0))
        outcomes.append(seq)
    expected = [{}, {}, {}, {0: "heartbeat stale 60.5 s"}, {0: "heartbeat stale 70.0 s"}, {0: "heartbeat stale 71.0 s"}]
    assert outcomes == [expected, expected]


def test_monitor_time_base_is_arbitrary() -> None:
    """Only differences of ``now`` matter: shifting the monitor's clock changes nothing."""
    results = []
    for base in (0.0, 12_345.678, -500.0):
        tracker = HeartbeatTracker()
        seq = []
        for offset, fp in [(0, "a"), (5, "b"), (20, "b"), (70, "b"), (75, "c"), (86, "c")]:
            tracker.observe(TOPO, 0, fp, base + offset)
            seq.append(dead(tracker, {0: W1}, base + offset))
        results.append(seq)
    assert results[0] == results[1] == results[2]
    assert results[0][3] == {0: "heartbeat stale 65.0 s"}
    assert results[0][4] == {}
    assert results[0][5] == {0: "heartbeat stale 11.0 s"}


def test_fingerprint_content_is_opaque() -> None:
    """A worker's clock inside the fingerprint does not matter, only whether it changed."""
    tracker = HeartbeatTracker()
    tracker.observe(TOPO, 0, ("w", "time=1e12"), 0.0)
    dead(tracker, {0: W1}, 0.0, grace=0.0)
    tracker.observe(TOPO, 0, ("w", "time=-5"), 8.0)  # goes "back in time" but changed
    assert dead(tracker, {0: W1}, 17.0, grace=0.0) == {}


# --- bookkeeping -------------------------------------------------------------------------------


def test_forget_gives_a_fresh_start() -> None:
    tracker = HeartbeatTracker()
    tracker.observe(TOPO, 0, "x", 0.0)
    dead(tracker, {0: W1}, 0.0)
    assert dead(tracker, {0: W1}, 100.0) == {0: "heartbeat stale 100.0 s"}
    tracker.forget(TOPO)
    assert TOPO not in tracker.topologies()
    assert tracker.heartbeat_age(TOPO, 0, 100.0) is None
    tracker.observe(TOPO, 0, "x", 100.0)
    assert dead(tracker, {0: W1}, 100.0) == {}
    assert dead(tracker, {0: W1}, 159.0) == {}


def test_topologies_are_independent() -> None:
    tracker = HeartbeatTracker()
    tracker.observe("a", 0, "x", 0.0)
    tracker.observe("b", 0, "x", 0.0)
    dead(tracker, {0: W1}, 0.0, topology="a")
    dead(tracker, {0: W1}, 50.0, topology="b")
    assert dead(tracker, {0: W1}, 70.0, topology="a") == {0: "heartbeat stale 70.0 s"}
    assert dead(tracker, {0: W1}, 70.0, topology="b") == {}
    tracker.forget("a")
    assert tracker.topologies() == {"b"}


def test_reset_heartbeat_clocks_restarts_ages_but_keeps_grace_spent() -> None:
    tracker = HeartbeatTracker()
    tracker.observe(TOPO, 0, "x", 0.0)
    dead(tracker, {0: W1}, 0.0)
    assert dead(tracker, {0: W1}, 100.0) == {0: "heartbeat stale 100.0 s"}
    tracker.reset_heartbeat_clocks(100.0)
    assert dead(tracker, {0: W1}, 105.0) == {}  # blind time does not count
    assert dead(tracker, {0: W1}, 111.0) == {0: "heartbeat stale 11.0 s"}  # no new grace


def test_only_dead_tasks_are_reported_among_many() -> None:
    tracker = HeartbeatTracker()
    assigned = {t: (W1 if t < 4 else W2) for t in range(8)}
    for t in range(8):
        tracker.observe(TOPO, t, ("fp", t, 0), 0.0)
    dead(tracker, assigned, 0.0)
    for now in range(1, 80):
        for t in range(8):
            if t not in (2, 5):  # tasks 2 and 5 stop beating at 0
                tracker.observe(TOPO, t, ("fp", t, now), float(now))
    result = dead(tracker, assigned, 79.0)
    assert result == {2: "heartbeat stale 79.0 s", 5: "heartbeat stale 79.0 s"}


def test_monitor_action_json() -> None:
    action = MonitorAction(
        topology_id=TOPO,
        dead={1: REASON_WORKER_GONE},
        unassigned=(3,),
        moved={1: (W1, W2), 3: (None, W2)},
        epoch=4,
        excluded_slots=(),
    )
    assert action.to_json_obj() == {
        "topology": TOPO,
        "epoch": 4,
        "dead": {"1": "worker gone"},
        "unassigned": [3],
        "moved": {"1": {"from": W1, "to": W2}, "3": {"from": None, "to": W2}},
        "excluded_slots": [],
        "spread": False,
    }
