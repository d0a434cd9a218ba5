"""Batched topology reads (read_topologies / TopologyReads.describe) give what one read per znode gave.

The reference below is ``describe_topology`` as it was before the reads were batched: one
synchronous read per znode through the public readers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import (
    ErrorRecord,
    HeartbeatRecord,
    OwnerRecord,
    TaskError,
    TaskRecord,
    TransactionalRecord,
)
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import TopologyNotFoundError, ZooKeeperUnavailableError
from stream_ops.nimbus.assignment import live_workers, read_assignment
from stream_ops.nimbus.monitor import HeartbeatTracker
from stream_ops.nimbus.status import (
    AGE_OBSERVED,
    AGE_WORKER_CLOCK,
    TaskStatus,
    TopologyStatus,
    describe_topology,
    heartbeat_age,
    read_heartbeat,
    read_topologies,
    task_status,
)
from stream_ops.nimbus.submission import read_storm, submit
from stream_ops.orchestration import HeartbeatCursor, StreamClusterResource, StreamOpsTranslator, observe_tick
from stream_ops.orchestration import sensors as sensors_module
from stream_ops.runtime.task_failures import read_task_errors

WORKERS = ("127.0.0.1:6700", "127.0.0.1:6701")  # those of the sim_workers fixture (conftest.py)


def _describe_one_read_at_a_time(
    store: ZkStore, topology_id: str, *, clock: Callable[[], float], tracker: HeartbeatTracker | None
) -> TopologyStatus:
    """The former ``describe_topology``: one synchronous read per znode."""
    storm = read_storm(store, topology_id)
    assignment = read_assignment(store, topology_id)
    assigned = assignment[0].tasks if assignment else {}
    workers = live_workers(store)
    errors = read_task_errors(store, topology_id)
    now = clock()
    tasks: list[TaskStatus] = []

    def value(path: str) -> Any:
        found = store.get_json(path)
        return None if found is None else found[0]

    for name in sorted(store.children(ZkPaths.tasks(topology_id)), key=int):
        task_id = int(name)
        task_data = value(ZkPaths.task(topology_id, task_id))
        if task_data is None:
            continue
        task = TaskRecord.model_validate(task_data)
        owner_data = value(ZkPaths.owner(topology_id, task_id))
        owner = OwnerRecord.model_validate(owner_data) if owner_data else None
        tx_data = value(ZkPaths.transactional_task(topology_id, task_id))
        tx = TransactionalRecord.model_validate(tx_data) if tx_data else TransactionalRecord()
        found = store.get_json(ZkPaths.heartbeat(topology_id, task_id))
        worker = owner.worker_id if owner else assigned.get(task_id)
        hb, fingerprint = (None, None) if found is None else read_heartbeat(found[0], found[1].mzxid, worker)
        tasks.append(
            task_status(
                task_id,
                task,
                assigned_to=assigned.get(task_id),
                owner=owner,
                tx=tx,
                heartbeat=hb,
                fingerprint=fingerprint,
                heartbeat_age_s=heartbeat_age(hb, fingerprint, topology_id, task_id, now, tracker),
                error=errors.get(task_id),
            )
        )
    return TopologyStatus(
        topology_id=topology_id,
        name=storm.name,
        status=storm.status,
        workers_wanted=storm.workers,
        workers_live=sorted(workers),
        assignment_epoch=assignment[1] if assignment else None,
        tasks=tasks,
        heartbeat_age_basis=AGE_OBSERVED if tracker is not None else AGE_WORKER_CLOCK,
    )


@pytest.fixture
def topologies(zk_store: ZkStore, make_wordcount: Any, cluster_resource: StreamClusterResource, sim_workers: Any) -> list[str]:
    """Three 4-task word counts in every state a task can be in."""
    sim_workers.register()
    ids = [submit(zk_store, cluster_resource.config(), make_wordcount(name=n), workers=2) for n in ("wc_a", "wc_b", "wc_c")]
    a, b, c = ids
    assigned = read_assignment(zk_store, a)[0].tasks  # type: ignore[index]
    # wc_a: 0 and 1 beat, 2's beat is another worker's leftover, 3 has nothing; errors on 1 and 3.
    for task_id in (0, 1, 2):
        sim_workers.beat(a, task_id, worker_id=assigned[task_id], committed_txid=3 + task_id, rows_per_s=10.0, lag_files=2)
    other = next(w for w in WORKERS if w != assigned[2])
    zk_store.set_json(ZkPaths.heartbeat(a, 2), HeartbeatRecord(worker_id=other, time=time.time(), epoch=1).to_json_obj())
    failure = TaskError(time=123.0, worker_id=WORKERS[0], reason="OperationalError: boom", attempt=5)
    record = ErrorRecord(errors=[failure], consecutive_failures=5, quarantined=True, worker_id=WORKERS[0])
    zk_store.create_json(ZkPaths.task_errors(a, 1), record.to_json_obj())
    zk_store.create_json(ZkPaths.task_errors(a, 3), {"errors": "not a list"})  # read as an empty record
    zk_store.create_json(f"{ZkPaths.errors(a)}/not-a-task", {})
    # wc_b: no assignment any more, task 3's record gone, an owner without heartbeat.
    zk_store.delete(ZkPaths.assignment(b))
    zk_store.delete(ZkPaths.task(b, 3))
    sim_workers.beat(b, 0)
    zk_store.delete(ZkPaths.heartbeat(b, 0))
    # wc_c: every task beats.
    for task_id in range(4):
        sim_workers.beat(c, task_id, committed_txid=7)
    return ids


def test_batched_reads_describe_every_topology_as_single_reads_did(zk_store: ZkStore, topologies: list[str]) -> None:
    now = time.time()
    reads = read_topologies(zk_store, topologies, concurrency=3)
    assert reads.topology_ids == tuple(topologies)
    for topology_id in topologies:
        expected = _describe_one_read_at_a_time(zk_store, topology_id, clock=lambda: now, tracker=None)
        assert reads.describe(topology_id, clock=lambda: now) == expected
        assert describe_topology(zk_store, topology_id, clock=lambda: now) == expected
        # With trackers, fed alike: same statuses and the same beats seen.
        mine, theirs = HeartbeatTracker(), HeartbeatTracker()
        for tick in (now, now + 5.0):
            observed = reads.describe(topology_id, clock=lambda t=tick: t, tracker=mine)  # type: ignore[misc]
            assert observed == _describe_one_read_at_a_time(zk_store, topology_id, clock=lambda t=tick: t, tracker=theirs)  # type: ignore[misc]
        assert mine.export_beats(topology_id) == theirs.export_beats(topology_id)

    a_tasks = {t.task_id: t for t in reads.describe(topologies[0]).tasks}
    assert a_tasks[1].quarantined and a_tasks[1].last_error == "OperationalError: boom"
    assert a_tasks[2].heartbeat_fingerprint is None  # another worker's beat does not count
    assert a_tasks[3].owner is None and a_tasks[3].failures == 0
    b_status = reads.describe(topologies[1])
    assert b_status.assignment_epoch is None and [t.task_id for t in b_status.tasks] == [0, 1, 2]


def test_a_topology_missing_or_not_read_is_not_found(zk_store: ZkStore, topologies: list[str]) -> None:
    reads = read_topologies(zk_store, [topologies[0], "ghost-1-1700000000"])
    with pytest.raises(TopologyNotFoundError):
        reads.describe("ghost-1-1700000000")
    with pytest.raises(TopologyNotFoundError):
        reads.describe(topologies[1])  # not among those read
    assert reads.describe(topologies[0]).name == "wc_a"
    with pytest.raises(TopologyNotFoundError):
        describe_topology(zk_store, "ghost-1-1700000000")


def test_a_bad_record_fails_only_its_topology(zk_store: ZkStore, topologies: list[str]) -> None:
    zk_store.set_json(ZkPaths.task(topologies[1], 0), {"not": "a task"})
    reads = read_topologies(zk_store, topologies)
    with pytest.raises(ValueError):
        reads.describe(topologies[1])
    tick = observe_tick(
        zk_store,
        HeartbeatCursor(),
        topology_names=["wc_a", "wc_b", "wc_c"],
        translator=StreamOpsTranslator(),
        heartbeat_timeout_s=10.0,
        tick_budget_s=60.0,
    )
    assert tick.observed == ["wc_a", "wc_c"]
    assert list(tick.failed) == ["wc_b"]


def test_the_tick_reads_ahead_in_batches(zk_store: ZkStore, topologies: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    kwargs: dict[str, Any] = dict(
        topology_names=["wc_a", "wc_b", "wc_c"], translator=StreamOpsTranslator(), heartbeat_timeout_s=10.0, tick_budget_s=60.0
    )
    whole = observe_tick(zk_store, HeartbeatCursor(), **kwargs)
    batches: list[list[str]] = []

    def spy(store: ZkStore, topology_ids: list[str]) -> Any:
        batches.append(list(topology_ids))
        return read_topologies(store, topology_ids)

    monkeypatch.setattr(sensors_module, "_READ_AHEAD", 2)
    monkeypatch.setattr(sensors_module, "read_topologies", spy)
    split = observe_tick(zk_store, HeartbeatCursor(), **kwargs)
    assert batches == [topologies[:2], topologies[2:]]
    assert split.observed == whole.observed == ["wc_a", "wc_b", "wc_c"]
    assert [(e.asset_key, dict(e.metadata)) for e in split.observations] == [
        (e.asset_key, dict(e.metadata)) for e in whole.observations
    ]
    assert len(split.check_evaluations) == len(whole.check_evaluations) == 12


def test_a_failed_batch_fails_each_of_its_topologies(
    zk_store: ZkStore, topologies: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def unavailable(store: ZkStore, topology_ids: list[str]) -> Any:
        raise ZooKeeperUnavailableError("cannot read: lost the connection to ZooKeeper")

    monkeypatch.setattr(sensors_module, "read_topologies", unavailable)
    tick = observe_tick(
        zk_store,
        HeartbeatCursor(),
        topology_names=["wc_a", "wc_b", "wc_c"],
        translator=StreamOpsTranslator(),
        heartbeat_timeout_s=10.0,
        tick_budget_s=60.0,
    )
    assert tick.observed == []
    assert tick.failed == dict.fromkeys(["wc_a", "wc_b", "wc_c"], "cannot read: lost the connection to ZooKeeper")
