"""Failover under faults (DESIGN invariant 6): three workers and a nimbus monitor.

Input is fed continuously to three word counts (opaque, transactional and non-transactional
state). Workers are SIGKILLed while batches flow, one worker is frozen (SIGSTOP) past its
ZooKeeper session timeout so its session expires and it comes back as a zombie, killed
workers are restarted, and a rebalance spreads the tasks again. At the end every count equals
the ground truth computed independently from what was fed.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from stream_ops import MapState, OpaqueMapState, TransactionalMapState
from stream_ops.coordination.store import ZkStore
from stream_ops.examples.wordcount import SAMPLE_SENTENCES, build_wordcount
from stream_ops.local_stack import LocalStack, expected_word_counts, wait_for_counts
from stream_ops.nimbus import describe_topology, submit
from stream_ops.nimbus.rebalance import rebalance
from stream_ops.topics.producer import produce

SESSION_TIMEOUT_S = 4.0


def _feeder(topologies, sent, stop):
    i = 0
    while not stop.is_set():
        batch = list(SAMPLE_SENTENCES)[i % 8 :] + [f"unique{i} how"]
        for topology in topologies:
            produce(topology.chains[0].source.topic, ({"sentence": s} for s in batch))
        sent.extend(batch)
        i += 1
        time.sleep(0.1)


def test_exact_counts_after_kills_session_expiry_and_restarts(tmp_path, wait_until):
    home = tmp_path / "home"
    args = ["--trigger-seconds", "0.3", "--heartbeat-interval", "0.5"]
    with LocalStack(
        home=home, workers=3, worker_args=args, session_timeout_s=SESSION_TIMEOUT_S, task_timeout_s=5.0, launch_grace_s=30.0
    ) as stack:
        topologies = [
            build_wordcount(home / "in-o", name="wc-opaque", state=OpaqueMapState),
            build_wordcount(home / "in-t", name="wc-tx", state=TransactionalMapState),
            build_wordcount(home / "in-n", name="wc-nontx", queues=1, state=MapState),
        ]
        with ZkStore.connect(stack.zk_config) as store:
            ids = [submit(store, stack.cluster, t, workers=3) for t in topologies]
            sent: list[str] = []
            stop = threading.Event()
            feeder = threading.Thread(target=_feeder, args=(topologies, sent, stop))
            feeder.start()
            try:
                wait_until(
                    lambda: all(t.committed_txid >= 0 for t in describe_topology(store, ids[0]).tasks), 60, "first commits"
                )

                # 1. SIGKILL a worker mid-stream; the monitor moves its tasks at once.
                victim = stack.worker_processes[0]
                stack.kill_worker(victim)
                wait_until(
                    lambda: all(t.assigned_to != victim.worker_id for i in ids for t in describe_topology(store, i).tasks),
                    30,
                    "reassignment",
                )
                time.sleep(2.0)

                # 2. Freeze another past its session timeout: its session expires, its tasks move,
                #    and when it thaws it is a zombie whose commits are refused.
                frozen = stack.worker_processes[0]
                os.killpg(frozen.proc.pid, signal.SIGSTOP)
                try:
                    wait_until(
                        lambda: all(t.assigned_to != frozen.worker_id for i in ids for t in describe_topology(store, i).tasks),
                        30,
                        "reassignment after session expiry",
                    )
                finally:
                    os.killpg(frozen.proc.pid, signal.SIGCONT)

                # 3. Restart the killed worker on its slot, kill the last original one.
                stack.start_worker(port=victim.port)
                time.sleep(3.0)
                stack.kill_worker(stack.worker_processes[1])
                stack.wait_for_workers(2)
                time.sleep(2.0)
            finally:
                stop.set()
                feeder.join()

            # 4. Spread the tasks over the live workers again, then check every count.
            for topology_id in ids:
                rebalance(store, topology_id)
            expected = expected_word_counts(sent)
            for topology in topologies:
                wait_for_counts(store, topology.name, "words", expected, timeout_s=180)
            epochs = [t.owner_epoch or 0 for i in ids for t in describe_topology(store, i).tasks]
            assert max(epochs) >= 2, "tasks really changed owners"
