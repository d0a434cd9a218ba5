"""Failing and quarantined tasks in ``status`` and in the Dagster observations (pure)."""

from __future__ import annotations

import dagster as dg

from stream_ops.nimbus.status import TaskStatus, TopologyStatus
from stream_ops.orchestration.observations import OBSERVATION_FIELDS, observe_topology


def _task(task_id: int, stage: int, **failure: object) -> TaskStatus:
    return TaskStatus(
        task_id=task_id,
        stage=stage,
        stage_name=("sentences", "words")[stage],
        queue=0,
        assigned_to="w:1",
        owner=None if failure else "w:1",
        owner_epoch=None if failure else 1,
        heartbeat_age_s=None if failure else 0.1,
        committed_txid=-1,
        txid_in_flight=None,
        rows_per_s=0.0,
        rows_out_per_s=0.0,
        lag_files=0,
        state_keys=0,
        dead_letters=0,
        **failure,  # type: ignore[arg-type]
    )


STATUS = TopologyStatus(
    topology_id="db-1-1700000000",
    name="db",
    status="ACTIVE",
    workers_wanted=1,
    workers_live=["w:1"],
    assignment_epoch=1,
    tasks=[
        _task(0, 0),
        _task(
            1,
            1,
            failures=5,
            quarantined=True,
            last_error="start failed: OperationalError: unable | to open",
            last_error_worker="w:1",
            last_error_at=1.0,
        ),
        _task(2, 1, failures=2, last_error="query failed: boom", last_error_worker="w:1", last_error_at=2.0),
    ],
)


def test_status_lists_each_failing_task_once() -> None:
    assert STATUS.problems() == [
        "task 1 (words) quarantined after 5 failures on w:1: start failed: OperationalError: unable | to open",
        "task 2 (words) failing (2 in a row) on w:1: query failed: boom",
    ]
    assert STATUS.to_json_obj()["tasks"][1]["quarantined"] is True


def test_observations_carry_the_errors_of_their_stage() -> None:
    observed = {o.asset_key.path[-1]: o.metadata for o in observe_topology(STATUS)}
    assert observed["sentences"]["failing_tasks"].value == {}
    assert observed["sentences"]["quarantined_tasks"].value == []
    words = observed["words"]
    assert words["quarantined_tasks"].value == [1]
    assert words["failing_tasks"].value == {
        "1": {"error": "start failed: OperationalError: unable | to open", "failures": 5, "quarantined": True, "worker": "w:1"},
        "2": {"error": "query failed: boom", "failures": 2, "quarantined": False, "worker": "w:1"},
    }
    table = words["tasks"].value
    assert "| **quarantined** start failed: OperationalError: unable \\| to open |" in table
    assert "| 2x query failed: boom |" in table
    assert {"failing_tasks", "quarantined_tasks"} <= set(OBSERVATION_FIELDS)
    assert all(isinstance(o, dg.AssetObservation) for o in observe_topology(STATUS))
