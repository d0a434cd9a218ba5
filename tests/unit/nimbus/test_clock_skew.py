"""One liveness rule: a worker's skewed clock changes nothing, for the nimbus nor for the sensor.

A worker whose clock is 60 s ahead of (or behind) everybody else's beats every 2 s for 30 s,
then hangs: its heartbeat node stays but is never rewritten again. Both paths judge it by the
tracker's rule (the time since *they* saw the heartbeat change, by their own clock):

* the nimbus path: ``HeartbeatTracker.dead_tasks`` fed the heartbeat's fingerprint, as
  ``Monitor`` does every 0.5 s;
* the sensor path: every 5 s, the tracker restored from the sensor cursor's JSON, the age
  computed as ``describe_topology`` does (``read_heartbeat`` + ``heartbeat_age``), the task
  judged with ``TaskStatus.alive``, and the tracker written back into the cursor.

Both keep it alive while it beats and call it dead once it has not beaten for the timeout.
The worker-clock age (what the sensor used before) gets it wrong both ways.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from stream_ops.coordination.records import HeartbeatRecord
from stream_ops.nimbus.monitor import HeartbeatTracker, heartbeat_fingerprint
from stream_ops.nimbus.status import TaskStatus, heartbeat_age, read_heartbeat
from stream_ops.orchestration.cursor import HeartbeatCursor, TopologyCursor

TOPOLOGY = "wordcount-1-1700000000"
WORKER = "10.0.0.7:6700"
TIMEOUT_S = 10.0
BEAT_EVERY_S = 2.0
LAST_BEAT_S = 30.0
START = 1_700_000_000.0  # the true time (the observers' clocks) at the first beat


@dataclass
class SkewedWorker:
    """The heartbeat znode of one task: JSON the worker writes with its own (skewed) clock, and the mzxid."""

    skew_s: float
    data: dict = field(default_factory=dict)
    mzxid: int = 0

    def at(self, t: float) -> None:
        """What the node holds at true time START + t (beats every 2 s up to LAST_BEAT_S)."""
        beats = int(min(t, LAST_BEAT_S) // BEAT_EVERY_S) + 1
        if beats != self.mzxid:
            self.mzxid = beats  # every write gives the node a new mzxid
            written = START + (beats - 1) * BEAT_EVERY_S + self.skew_s
            self.data = HeartbeatRecord(worker_id=WORKER, time=written, epoch=1).to_json_obj()


def nimbus_verdicts(worker: SkewedWorker, until: float) -> dict[float, bool]:
    """True (alive) / False per monitor tick, as ``Monitor._check`` judges (grace over)."""
    tracker = HeartbeatTracker()
    verdicts = {}
    for step in range(int(until / 0.5) + 1):
        t = step * 0.5
        worker.at(t)
        now = 5000.0 + t  # the monitor's monotonic clock: any base, never compared with the worker's
        tracker.observe(TOPOLOGY, 0, heartbeat_fingerprint(worker.data, worker.mzxid, WORKER), now)
        dead = tracker.dead_tasks(TOPOLOGY, {0: WORKER}, {0: 1.0}, {WORKER}, now, TIMEOUT_S, launch_grace_s=0.0)
        verdicts[t] = 0 not in dead
    return verdicts


def _status(age: float | None) -> TaskStatus:
    return TaskStatus(
        task_id=0,
        stage=0,
        stage_name="sentences",
        queue=0,
        assigned_to=WORKER,
        owner=WORKER,
        owner_epoch=1,
        heartbeat_age_s=age,
        committed_txid=0,
        txid_in_flight=None,
        rows_per_s=0.0,
        rows_out_per_s=0.0,
        lag_files=0,
        state_keys=0,
        dead_letters=0,
    )


def sensor_verdicts(worker: SkewedWorker, until: float) -> dict[float, bool]:
    """True (alive) / False per sensor tick (every 5 s), the tracker living in the cursor's JSON."""
    cursor = HeartbeatCursor().to_json()
    verdicts = {}
    for step in range(int(until / 5.0) + 1):
        t = step * 5.0
        worker.at(t)
        now = START + t  # the sensor's wall clock: right; the worker's is off by skew_s
        stored = HeartbeatCursor.parse(cursor).topologies.get("wordcount")
        tracker = HeartbeatTracker()
        if stored is not None:
            tracker.import_beats(TOPOLOGY, stored.heartbeats)
        record, fingerprint = read_heartbeat(worker.data, worker.mzxid, WORKER)
        age = heartbeat_age(record, fingerprint, TOPOLOGY, 0, now, tracker)
        verdicts[t] = _status(age).alive(TIMEOUT_S)
        entry = TopologyCursor(topology_id=TOPOLOGY, heartbeats=tracker.export_beats(TOPOLOGY))
        cursor = HeartbeatCursor().with_topology("wordcount", entry).to_json()
    return verdicts


def expected(verdicts: dict[float, bool]) -> dict[float, bool]:
    """Alive while it beats; dead once the last beat is more than the timeout old (as the observer saw it)."""
    return {t: t - LAST_BEAT_S <= TIMEOUT_S for t in verdicts}


@pytest.mark.parametrize("skew_s", [60.0, -60.0, 0.0])
def test_the_nimbus_path_ignores_the_workers_clock(skew_s: float) -> None:
    verdicts = nimbus_verdicts(SkewedWorker(skew_s), until=60.0)
    assert verdicts == expected(verdicts)
    assert verdicts[LAST_BEAT_S] and not verdicts[LAST_BEAT_S + TIMEOUT_S + 0.5]


@pytest.mark.parametrize("skew_s", [60.0, -60.0, 0.0])
def test_the_sensor_path_ignores_the_workers_clock(skew_s: float) -> None:
    verdicts = sensor_verdicts(SkewedWorker(skew_s), until=60.0)
    # A sensor tick sees the last beat up to 5 s late (at 30 s it sees the beat of 30 s), so it
    # is dead from the first tick more than the timeout after the last change it saw.
    assert verdicts == expected(verdicts)
    assert all(verdicts[t] for t in (0.0, 15.0, 30.0, 40.0))
    assert not any(verdicts[t] for t in (45.0, 50.0, 60.0))


@pytest.mark.parametrize("skew_s", [60.0, -60.0])
def test_both_paths_agree_on_every_sensor_tick(skew_s: float) -> None:
    nimbus = nimbus_verdicts(SkewedWorker(skew_s), until=60.0)
    sensor = sensor_verdicts(SkewedWorker(skew_s), until=60.0)
    assert {t: nimbus[t] for t in sensor} == sensor


def test_the_worker_clock_age_would_judge_a_skewed_worker_wrongly() -> None:
    """Why the rule changed: by the worker-written time, -60 s looks dead while beating and
    +60 s looks alive long after it stopped."""
    behind, ahead = SkewedWorker(-60.0), SkewedWorker(60.0)
    behind.at(10.0)
    record, fingerprint = read_heartbeat(behind.data, behind.mzxid, WORKER)
    assert not _status(heartbeat_age(record, fingerprint, TOPOLOGY, 0, START + 10.0, None)).alive(TIMEOUT_S)
    ahead.at(55.0)
    record, fingerprint = read_heartbeat(ahead.data, ahead.mzxid, WORKER)
    assert _status(heartbeat_age(record, fingerprint, TOPOLOGY, 0, START + 55.0, None)).alive(TIMEOUT_S)


def test_the_cursor_carries_the_tracker_compactly() -> None:
    tracker = HeartbeatTracker()
    for task in range(100):
        tracker.observe(TOPOLOGY, task, 1_000_000 + task, 1_700_000_000.123)
    entry = TopologyCursor(topology_id=TOPOLOGY, heartbeats=tracker.export_beats(TOPOLOGY))
    text = HeartbeatCursor().with_topology("wordcount", entry).to_json()
    assert len(text) < 100 * 40  # about 30 bytes per task
    again = HeartbeatTracker()
    again.import_beats(TOPOLOGY, HeartbeatCursor.parse(text).topologies["wordcount"].heartbeats)
    assert again.heartbeat_age(TOPOLOGY, 42, 1_700_000_010.123) == pytest.approx(10.0)
