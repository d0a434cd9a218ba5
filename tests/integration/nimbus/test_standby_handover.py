"""A stopping worker's handover of its tasks to their standbys (``hand_over_to_standbys``),
against a real ZooKeeper with fake workers (no Spark): the assignment moves only onto a live
standby, only at the version it was planned from, and ownership still changes hands the usual
way (the old owner cannot commit once the new one took the task)."""

from __future__ import annotations

import time

import pytest

from stream_ops.config import ClusterConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import AssignmentRecord, StandbyRecord
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import OwnershipLostError, TaskBusyError
from stream_ops.examples.wordcount import build_wordcount
from stream_ops.nimbus.assignment import (
    commit_handover,
    hand_over_to_standbys,
    plan_handover,
    read_assignment,
    reassign,
)
from stream_ops.nimbus.submission import submit
from stream_ops.runtime.ownership import acquire, commit, release


def _topology(zk_store: ZkStore, tmp_path) -> str:
    """A word count with one standby per keyed task, assigned over the registered workers."""
    topology = build_wordcount(tmp_path / "in", name="handover")
    topology_id = submit(zk_store, ClusterConfig(root=tmp_path / "cluster"), topology, workers=2, standby_replicas=1)
    reassign(zk_store, topology_id)
    return topology_id


def _keep_standby(store: ZkStore, topology_id: str, task_id: int, worker_id: str) -> None:
    """Write the standby's progress record from ``store``'s session, as its worker does."""
    store.ensure_path(ZkPaths.standbys(topology_id))
    record = StandbyRecord(worker_id=worker_id, applied_txid=0, applied_epoch=1, time=time.time(), keys=0)
    store.create_json(ZkPaths.standby(topology_id, task_id, worker_id), record.to_json_obj(), ephemeral=True)


def _stateful_tasks_of(zk_store: ZkStore, topology_id: str, worker_id: str) -> dict[int, str]:
    """Task -> standby worker, for the stateful tasks ``worker_id`` holds."""
    record = read_assignment(zk_store, topology_id)[0]
    return {t: record.standbys[t][0] for t, w in record.tasks.items() if w == worker_id and record.standbys.get(t)}


def test_a_stopping_worker_moves_its_tasks_onto_their_live_standbys(zk_store, fake_worker, tmp_path):
    leaving, staying = fake_worker(6700), fake_worker(6701)
    topology_id = _topology(zk_store, tmp_path)
    before, epoch = read_assignment(zk_store, topology_id)
    stateful = _stateful_tasks_of(zk_store, topology_id, leaving.worker_id)
    assert stateful and set(stateful.values()) == {staying.worker_id}
    for task_id in stateful:
        _keep_standby(staying.store, topology_id, task_id, staying.worker_id)
    owned = leaving.assigned(topology_id)

    handover = hand_over_to_standbys(leaving.store, topology_id, leaving.worker_id, owned, clock=lambda: 12345.0)

    assert handover is not None and handover.moves == stateful
    after, new_epoch = read_assignment(zk_store, topology_id)
    assert new_epoch == epoch + 1
    assert after.tasks == {**before.tasks, **stateful}  # stateless tasks stay for the nimbus to move
    assert all(after.start_times[t] == 12345.0 and staying.worker_id not in after.standbys.get(t, []) for t in stateful)
    assert {t: s for t, s in after.start_times.items() if t not in stateful} == {
        t: s for t, s in before.start_times.items() if t not in stateful
    }


def test_a_handover_is_not_written_over_a_newer_assignment(zk_store, fake_worker, tmp_path):
    leaving, staying = fake_worker(6700), fake_worker(6701)
    topology_id = _topology(zk_store, tmp_path)
    for task_id in _stateful_tasks_of(zk_store, topology_id, leaving.worker_id):
        _keep_standby(staying.store, topology_id, task_id, staying.worker_id)
    handover = plan_handover(zk_store, topology_id, leaving.worker_id, leaving.assigned(topology_id))
    assert handover is not None
    record, version = read_assignment(zk_store, topology_id)
    zk_store.set_json(ZkPaths.assignment(topology_id), record.to_json_obj(), version=version)  # the nimbus wrote meanwhile

    assert commit_handover(zk_store, handover) is None
    assert read_assignment(zk_store, topology_id) == (record, version + 1)


def test_no_task_is_handed_to_a_worker_that_is_gone(zk_store, fake_worker, tmp_path):
    leaving, staying = fake_worker(6700), fake_worker(6701)
    topology_id = _topology(zk_store, tmp_path)
    stateful = _stateful_tasks_of(zk_store, topology_id, leaving.worker_id)
    owned = leaving.assigned(topology_id)
    for task_id in stateful:  # a standby record outliving its worker's registration
        _keep_standby(zk_store, topology_id, task_id, staying.worker_id)
    zk_store.delete(ZkPaths.worker(staying.worker_id))
    assert plan_handover(zk_store, topology_id, leaving.worker_id, owned) is None

    back = fake_worker(6701)  # registered again, then gone between the plan and the write
    handover = plan_handover(zk_store, topology_id, leaving.worker_id, owned)
    assert handover is not None and set(handover.moves.values()) == {back.worker_id}
    back.die(zk_store)
    unchanged = read_assignment(zk_store, topology_id)
    assert commit_handover(zk_store, handover) is None
    assert read_assignment(zk_store, topology_id) == unchanged


def test_the_old_owner_cannot_commit_once_the_standby_took_the_handed_over_task(zk_store, fake_worker, tmp_path):
    leaving, staying = fake_worker(6700), fake_worker(6701)
    topology_id = _topology(zk_store, tmp_path)
    task_id, standby = next(iter(_stateful_tasks_of(zk_store, topology_id, leaving.worker_id).items()))
    _keep_standby(staying.store, topology_id, task_id, standby)
    old = acquire(leaving.store, topology_id, task_id, leaving.worker_id)
    commit(leaving.store, old, 0, offsets=[], rows=1)

    assert hand_over_to_standbys(leaving.store, topology_id, leaving.worker_id, [task_id]) is not None
    with pytest.raises(TaskBusyError):  # assigned to the standby, but still owned: one owner at a time
        acquire(staying.store, topology_id, task_id, staying.worker_id)
    commit(leaving.store, old, 1, offsets=[], rows=1)  # the batch it was finishing
    release(leaving.store, old)
    new = acquire(staying.store, topology_id, task_id, staying.worker_id)

    assert new.epoch == old.epoch + 1 and new.committed_txid == 1
    with pytest.raises(OwnershipLostError):
        commit(leaving.store, old, 2, offsets=[], rows=1)
    commit(staying.store, new, 2, offsets=[], rows=1)


def test_a_task_the_even_split_would_move_again_is_left_to_the_nimbus(zk_store, fake_worker, tmp_path):
    leaving, one, other = fake_worker(6700), fake_worker(6701), fake_worker(6702)
    topology = build_wordcount(tmp_path / "in", name="handover")  # tasks 0, 1: source; 2, 3: keyed
    topology_id = submit(zk_store, ClusterConfig(root=tmp_path / "cluster"), topology, workers=3, standby_replicas=1)
    record = AssignmentRecord(
        tasks={0: one.worker_id, 1: other.worker_id, 2: leaving.worker_id, 3: leaving.worker_id},
        start_times=dict.fromkeys(range(4), 1.0),
        standbys={2: [one.worker_id], 3: [one.worker_id]},
    )
    version = read_assignment(zk_store, topology_id)[1]
    zk_store.set_json(ZkPaths.assignment(topology_id), record.to_json_obj(), version=version)
    for task_id in (2, 3):
        _keep_standby(one.store, topology_id, task_id, one.worker_id)

    handover = hand_over_to_standbys(leaving.store, topology_id, leaving.worker_id, [2, 3])

    # Two tasks each on the two slots left: task 3 would not stay on its standby's slot.
    assert handover is not None and handover.moves == {2: one.worker_id}
    assert read_assignment(zk_store, topology_id)[0].tasks == {**record.tasks, 2: one.worker_id}
