"""The S4 example on worker processes: a prototype PE per card over payments and a key-less
limits stream that is broadcast to the instances of both tasks, alerts to a named output
stream counted by a singleton PE, and on_time summaries. A worker is SIGKILLed while alerts
are being raised, yet every alert and every running total is written once (read back with
DuckDB)."""

from __future__ import annotations

import time
from pathlib import Path

from e2e_helpers import read_parquet, wait_for

from stream_ops.coordination.store import ZkStore
from stream_ops.examples.s4_parity import build_s4_parity
from stream_ops.local_stack import LocalStack
from stream_ops.nimbus import submit
from stream_ops.topics.producer import produce

CARDS = [f"c{i}" for i in range(8)]


def _latest_summaries(root: Path) -> dict[str, tuple[int, int]]:
    """Per card: (payments, limit) of its most advanced summary."""
    latest: dict[str, tuple[int, int]] = {}
    for card, payments, limit in read_parquet(root / "card_summaries", 'card, payments, "limit"'):
        latest[card] = max(latest.get(card, (0, 0)), (payments, limit), key=lambda p: (p[0], -p[1]))
    return latest


def test_broadcast_named_outputs_and_a_singleton_survive_a_worker_sigkill(tmp_path):
    home = tmp_path / "home"
    root = home / "input" / "s4-parity"
    with (
        LocalStack(
            home=home, workers=2, worker_args=["--trigger-seconds", "0.2", "--heartbeat-interval", "0.5"], session_timeout_s=4.0
        ) as stack,
        ZkStore.connect(stack.zk_config) as store,
    ):
        topology = build_s4_parity(root, queues=2, limit=3, timer_interval=1.0)
        submit(store, stack.cluster, topology, workers=2)
        payments_topic, limits_topic = (c.source.topic for c in topology.chains)

        produce(payments_topic, [{"card": c, "amount": 1} for c in CARDS for _ in range(2)])
        wait_for(lambda: _latest_summaries(root) == {c: (2, 3) for c in CARDS}, 120, "every card's instance with 2 payments")
        produce(limits_topic, [{"limit": 1}])  # no key: reaches every card's instance, on both tasks
        wait_for(lambda: _latest_summaries(root) == {c: (2, 1) for c in CARDS}, 60, "the new limit on every instance")

        for i in range(2):  # payments 3 and 4 of each card: two alerts per card
            produce(payments_topic, [{"card": c, "amount": 10} for c in CARDS])
            if i == 0:
                victim = stack.worker_processes[0]
                stack.kill_worker(victim)  # its tasks move; instances come back from the state topic
                time.sleep(1.0)
                stack.start_worker(port=victim.port)
            time.sleep(0.5)
        stack.wait_for_workers(2)
        expected = sorted((c, n, 1) for c in CARDS for n in (3, 4))
        wait_for(lambda: len(read_parquet(root / "alert_totals", "*")) >= len(expected), 150, "every alert counted")
        time.sleep(2.0)  # nothing more may come: an alert counted twice would show now
        assert read_parquet(root / "alert_totals", "alerts") == [(n,) for n in range(1, len(expected) + 1)]
