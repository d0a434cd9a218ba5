"""Storm's spreading: workers started one after the other get an even share, counts stay exact.

A word count with 6 tasks (3 source + 3 keyed) is submitted with ``workers=3`` while only one
worker is up, so every task lands on it. Two more workers start one after the other. The
nimbus (inside ``LocalStack``) spreads the topology over them by its
:class:`~stream_ops.config.SpreadPolicy`, shortened by the topology's conf (a slot counts after
2 s, at most one spread per 4 s; the defaults are 5 s and 10 s), moving the fewest tasks
through the usual ownership protocol. Sentences are fed before, during and after; every
count must equal the ground truth.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from stream_ops.coordination.store import ZkStore
from stream_ops.examples.wordcount import SAMPLE_SENTENCES, build_wordcount
from stream_ops.local_stack import LocalStack, expected_word_counts, wait_for_counts
from stream_ops.nimbus import describe_topology, submit
from stream_ops.nimbus.assignment import read_assignment
from stream_ops.scheduler import moved_tasks
from stream_ops.topics.file_topic import FileTopic
from stream_ops.topics.producer import produce

WORKER_ARGS = ["--trigger-seconds", "1", "--heartbeat-interval", "0.5"]
SPREAD_WITHIN_S = 30.0
SPREAD_CONF = {"spread_stability_s": 2.0, "spread_interval_s": 4.0}


def _feed(topic: FileTopic, sent: list[str], stop: threading.Event) -> None:
    i = 0
    while not stop.is_set():
        batch = [*list(SAMPLE_SENTENCES)[i % 8 :], f"unique{i} how"]
        produce(topic, ({"sentence": s} for s in batch))
        sent.extend(batch)
        i += 1
        time.sleep(0.5)


def _fewest_moves(before: Mapping[int, str], slots: int) -> int:
    """The fewest tasks an even split over ``slots`` slots can move from ``before`` (sticky rule)."""
    base, extra = divmod(len(before), slots)
    shares = sorted([base + 1] * extra + [base] * (slots - extra), reverse=True)
    counts = sorted(Counter(before.values()).values(), reverse=True)
    return len(before) - sum(min(c, s) for c, s in zip(counts, shares, strict=False))


class AssignmentLog:
    """Records every distinct assignment of a topology, polled on a thread."""

    def __init__(self, store: ZkStore, topology_id: str) -> None:
        self.store, self.topology_id = store, topology_id
        self.history: list[dict[int, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.1):
            found = read_assignment(self.store, self.topology_id)
            if found is not None and (not self.history or dict(found[0].tasks) != self.history[-1]):
                self.history.append(dict(found[0].tasks))

    def loads(self) -> list[int]:
        return sorted(Counter(self.history[-1].values()).values()) if self.history else []

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def test_workers_started_one_after_another_get_an_even_share_and_counts_stay_exact(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with (
        LocalStack(home=home, workers=0, worker_args=WORKER_ARGS, session_timeout_s=4.0, task_timeout_s=5.0) as stack,
        ZkStore.connect(stack.zk_config) as store,
    ):
        first = stack.start_worker()
        stack.wait_for_workers(1)
        topology = build_wordcount(home / "in", name="wc-spread", queues=3, split_with="row")
        topology_id = submit(store, stack.cluster, topology, workers=3, conf=SPREAD_CONF)
        initial = read_assignment(store, topology_id)
        assert initial is not None and set(initial[0].tasks.values()) == {first.worker_id}
        assert len(initial[0].tasks) == 6
        log = AssignmentLog(store, topology_id)

        sent: list[str] = []
        stop = threading.Event()
        feeder = threading.Thread(target=_feed, args=(topology.chains[0].source.topic, sent, stop))
        feeder.start()
        try:
            stack.start_worker()
            stack.wait_for_workers(2)
            stack.start_worker()
            stack.wait_for_workers(3)
            registered = time.monotonic()
            while log.loads() != [2, 2, 2]:
                assert time.monotonic() - registered < SPREAD_WITHIN_S, (
                    f"not spread 2/2/2 within {SPREAD_WITHIN_S:g} s of the third worker's registration: {log.history}"
                )
                time.sleep(0.2)
            time.sleep(3.0)  # keep feeding while the moved tasks start on their new workers
        finally:
            stop.set()
            feeder.join()
            log.stop()

        # Every change was a spread moving the fewest tasks: nothing that fit its share moved.
        assert log.history[0] == dict(initial[0].tasks)
        for before, after in zip(log.history, log.history[1:], strict=False):
            assert len(moved_tasks(before, after)) == _fewest_moves(before, len(set(after.values()))), log.history
        assert len(set(log.history[-1].values())) == 3

        wait_for_counts(store, topology.name, "words", expected_word_counts(sent), timeout_s=120)
        owners = Counter(t.owner for t in describe_topology(store, topology_id).tasks)
        assert sorted(owners.values()) == [2, 2, 2] and None not in owners, owners
