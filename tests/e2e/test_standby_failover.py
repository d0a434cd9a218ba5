"""Standby replicas on worker processes: with ``standby_replicas=1`` every stateful task has a
warm copy on another worker; a SIGKILL of an owner moves its tasks onto their standbys, which
apply the state-topic tail only (their logs say so, and none rebuilt), and counts stay exact."""

from __future__ import annotations

import threading
import time

from e2e_helpers import feed_sentences, wait_for

from stream_ops.coordination.cluster_state import read_assignment
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import StandbyRecord
from stream_ops.coordination.store import ZkStore
from stream_ops.examples.wordcount import SAMPLE_SENTENCES, build_wordcount
from stream_ops.local_stack import LocalStack, expected_word_counts, wait_for_counts
from stream_ops.nimbus import describe_topology, submit


def test_a_killed_owners_tasks_move_to_their_standbys_and_replay_only_the_tail(tmp_path):
    home = tmp_path / "home"
    with (
        LocalStack(
            home=home, workers=3, worker_args=["--trigger-seconds", "0.2", "--heartbeat-interval", "0.5"], session_timeout_s=4.0
        ) as stack,
        ZkStore.connect(stack.zk_config) as store,
    ):
        topology = build_wordcount(home / "in", name="wc-standby")
        topology_id = submit(store, stack.cluster, topology, workers=2, standby_replicas=1)
        keyed = [t.task_id for t in describe_topology(store, topology_id).tasks if t.stage_name != "sentences"]

        batches = [list(SAMPLE_SENTENCES)[i % 8 :] + [f"unique{i} how"] for i in range(200)]  # up to ~30 s of input
        sent: list[str] = []
        stop = threading.Event()
        feeder = threading.Thread(target=feed_sentences, args=(topology.chains[0].source.topic, batches, sent, stop))
        feeder.start()

        def warm_standbys():
            record = read_assignment(store, topology_id)[0]
            warm = {}
            for task in keyed:
                for worker in record.standbys.get(task, []):
                    found = store.get_json(ZkPaths.standby(topology_id, task, worker))
                    if found is not None and StandbyRecord.model_validate(found[0]).applied_txid >= 1:
                        warm[task] = worker
            return (record, warm) if len(warm) == len(keyed) else None

        record, standby_of = wait_for(warm_standbys, 90, "a warm standby of every keyed task")
        assert all(standby_of[t] != record.tasks[t] for t in keyed)
        victim_id = record.tasks[keyed[0]]
        moving = [t for t in keyed if record.tasks[t] == victim_id]
        victim = next(w for w in stack.worker_processes if w.worker_id == victim_id)
        stack.kill_worker(victim)  # SIGKILL; not restarted

        def moved():
            now = read_assignment(store, topology_id)[0]
            return now if all(now.tasks[t] != victim_id for t in moving) else None

        after = wait_for(moved, 60, "the killed worker's tasks to move")
        time.sleep(3.0)  # input keeps flowing while the standbys take over
        stop.set()
        feeder.join()
        wait_for_counts(store, "wc-standby", "words", expected_word_counts(sent), timeout_s=120)
        for task in moving:
            assert after.tasks[task] == standby_of[task]  # onto its warm standby
            new_owner = next(w for w in stack.worker_processes if w.worker_id == standby_of[task])
            log = new_owner.log.read_text()
            assert f"task {topology_id}/{task}: kept the local state store (no rebuild), applied the state-topic tail only" in log
            assert f"task {topology_id}/{task}: state rebuilt" not in log
