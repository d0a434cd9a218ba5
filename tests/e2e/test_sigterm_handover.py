"""A clean worker shutdown (SIGTERM): its tasks are released at once and move without waiting
for the ZooKeeper session to expire, those with a standby replica handed over to it by the
stopping worker itself (before the nimbus acts), counts stay exact; and with ZooKeeper
unreachable the worker still exits within a few seconds."""

from __future__ import annotations

import signal
import time

from e2e_helpers import wait_for

from stream_ops.coordination.cluster_state import read_assignment
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.examples.wordcount import SAMPLE_SENTENCES, build_wordcount
from stream_ops.local_stack import LocalStack, expected_word_counts, wait_for_counts
from stream_ops.nimbus import describe_topology, submit
from stream_ops.topics.producer import produce

WORKER_ARGS = ["--trigger-seconds", "0.2", "--heartbeat-interval", "0.5"]


def _sigterm_and_time_exit(worker) -> float:
    started = time.monotonic()
    worker.proc.send_signal(signal.SIGTERM)
    worker.proc.wait(60)
    return time.monotonic() - started


def test_a_sigtermed_workers_tasks_move_before_its_session_could_expire(tmp_path):
    session_s = 30.0  # expiry-based detection would take this long at least
    with (
        LocalStack(
            home=tmp_path / "home", workers=2, worker_args=WORKER_ARGS, session_timeout_s=session_s, task_timeout_s=60
        ) as stack,
        ZkStore.connect(stack.zk_config) as store,
    ):
        topology = build_wordcount(tmp_path / "home" / "in", queues=2)
        topology_id = submit(store, stack.cluster, topology, workers=2, standby_replicas=1)
        topic = topology.chains[0].source.topic
        sent = list(SAMPLE_SENTENCES) * 3
        produce(topic, ({"sentence": s} for s in sent))
        wait_for_counts(store, topology.name, "words", expected_word_counts(sent), timeout_s=120)
        keyed = {t.task_id for t in describe_topology(store, topology_id).tasks if t.stage_name != "sentences"}
        keyed_owner = read_assignment(store, topology_id)[0].tasks[min(keyed)]
        leaving = next(w for w in stack.worker_processes if w.worker_id == keyed_owner)
        staying = next(w for w in stack.worker_processes if w is not leaving)
        wait_for(
            lambda: all(
                store.exists(ZkPaths.standby(topology_id, t, staying.worker_id))
                for t, w in read_assignment(store, topology_id)[0].tasks.items()
                if t in keyed and w == leaving.worker_id
            ),
            60,
            "the staying worker's standbys of the leaving worker's keyed tasks",
        )
        record, epoch = read_assignment(store, topology_id)
        handed = {t for t in record.standbys if record.tasks[t] == leaving.worker_id}

        started = time.monotonic()
        exit_s = _sigterm_and_time_exit(leaving)
        stack.worker_processes.remove(leaving)
        assert exit_s < 10.0, f"the worker took {exit_s:.1f} s to stop"
        # The first assignment after the SIGTERM is the stopping worker's own handover of its
        # keyed tasks to their standbys; the nimbus moved the rest once the worker left its slot.
        moves = ", ".join(f"{t}: '{leaving.worker_id} -> {staying.worker_id}'" for t in sorted(handed))
        assert handed and f"handed its tasks over to their standbys at assignment epoch {epoch + 1}: {{{moves}}}" in (
            leaving.log.read_text()
        )
        deadline = started + session_s / 2
        while time.monotonic() < deadline:
            tasks = describe_topology(store, topology_id).tasks
            if all(t.owner == staying.worker_id and t.committed_txid >= 0 for t in tasks):
                break
            time.sleep(0.2)
        moved_s = time.monotonic() - started
        assert all(t.owner == staying.worker_id for t in describe_topology(store, topology_id).tasks), (
            f"tasks not moved {moved_s:.1f} s after SIGTERM"
        )
        more = list(SAMPLE_SENTENCES)
        produce(topic, ({"sentence": s} for s in more))
        wait_for_counts(store, topology.name, "words", expected_word_counts(sent + more), timeout_s=120)


def test_a_sigtermed_worker_exits_within_seconds_with_zookeeper_unreachable(tmp_path):
    with LocalStack(home=tmp_path / "home", workers=1, worker_args=WORKER_ARGS, session_timeout_s=20.0) as stack:
        with ZkStore.connect(stack.zk_config) as store:
            topology = build_wordcount(tmp_path / "home" / "in", queues=2)
            submit(store, stack.cluster, topology, workers=1)
            sent = list(SAMPLE_SENTENCES)
            produce(topology.chains[0].source.topic, ({"sentence": s} for s in sent))
            wait_for_counts(store, topology.name, "words", expected_word_counts(sent), timeout_s=120)
        assert stack.zookeeper is not None
        stack.zookeeper.stop()
        produce(topology.chains[0].source.topic, ({"sentence": s} for s in sent))  # batches that cannot commit
        time.sleep(2.0)
        worker = stack.worker_processes[0]
        exit_s = _sigterm_and_time_exit(worker)
        stack.worker_processes.remove(worker)
        assert exit_s < 10.0, f"with ZooKeeper away the worker took {exit_s:.1f} s to stop (4 tasks)"
