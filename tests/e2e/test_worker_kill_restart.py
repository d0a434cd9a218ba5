"""Two worker processes; one is SIGKILLed mid-stream and restarted on its slot: exact counts."""

from __future__ import annotations

import threading
import time

from e2e_helpers import feed_sentences

from stream_ops import OpaqueMapState, TransactionalMapState
from stream_ops.coordination.store import ZkStore
from stream_ops.examples.wordcount import SAMPLE_SENTENCES, build_wordcount
from stream_ops.local_stack import LocalStack, expected_word_counts, wait_for_counts
from stream_ops.nimbus import describe_topology, submit


def test_sigkill_and_restart_on_the_same_slot_loses_and_doubles_nothing(tmp_path):
    home = tmp_path / "home"
    with (
        LocalStack(
            home=home, workers=2, worker_args=["--trigger-seconds", "0.2", "--heartbeat-interval", "0.5"], session_timeout_s=4.0
        ) as stack,
        ZkStore.connect(stack.zk_config) as store,
    ):
        opaque = build_wordcount(home / "in-opaque", name="wc-opaque", state=OpaqueMapState)
        transactional = build_wordcount(home / "in-tx", name="wc-tx", state=TransactionalMapState)
        ids = [submit(store, stack.cluster, t, workers=2) for t in (opaque, transactional)]
        assert all(len({t.assigned_to for t in describe_topology(store, i).tasks}) == 2 for i in ids)

        batches = [list(SAMPLE_SENTENCES)[i % 8 :] + [f"unique{i} how"] for i in range(60)]
        sent = {"o": [], "t": []}
        stop = threading.Event()
        feeders = [
            threading.Thread(target=feed_sentences, args=(opaque.chains[0].source.topic, batches, sent["o"], stop)),
            threading.Thread(target=feed_sentences, args=(transactional.chains[0].source.topic, batches, sent["t"], stop)),
        ]
        for f in feeders:
            f.start()
        # Kill a worker while batches are flowing, then bring it back on the same port.
        time.sleep(3.0)
        victim = stack.worker_processes[0]
        committed_before = {t.task_id: t.committed_txid for t in describe_topology(store, ids[0]).tasks}
        stack.kill_worker(victim)
        time.sleep(1.0)
        stack.start_worker(port=victim.port)
        for f in feeders:
            f.join()
        stack.wait_for_workers(2)

        for name, key in (("wc-opaque", "o"), ("wc-tx", "t")):
            wait_for_counts(store, name, "words", expected_word_counts(sent[key]), timeout_s=120)
        after = describe_topology(store, ids[0])
        assert any(t.committed_txid > committed_before[t.task_id] for t in after.tasks)
        assert any((t.owner_epoch or 0) >= 2 for t in after.tasks), "the restarted worker took its tasks over"
