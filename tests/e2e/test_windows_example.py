"""The event-time windows example on worker processes: a worker is SIGKILLed mid-stream, yet
every window of the per-user count and of the sliding JoinBolt is written once, with exact
contents (read back with DuckDB), and a click that arrives after its window closed reaches
the late stream instead of any count."""

from __future__ import annotations

import random
import time
from collections import Counter

from e2e_helpers import read_parquet, wait_for

from stream_ops.coordination.store import ZkStore
from stream_ops.examples.windows import build_windows
from stream_ops.local_stack import LocalStack
from stream_ops.nimbus import describe_topology, submit
from stream_ops.topics.producer import produce

T0 = 1_000_000.0
USERS = [f"u{i}" for i in range(8)]
PAGES = [f"p{i}" for i in range(4)]
CHUNKS = 40
LAG = 30.0  # longer than anything the kill holds back, so no on-time record is late
CLOSE = T0 + 100.0  # a record at this time closes every window of the data (watermark T0 + 70)


def _chunk(i: int, rng: random.Random) -> tuple[list[dict], list[dict]]:
    base = T0 + i * 0.5
    clicks = [{"user": rng.choice(USERS), "page": rng.choice(PAGES), "ts": round(base + rng.random() * 0.5, 3)} for _ in range(6)]
    views = [{"page": rng.choice(PAGES), "ts": round(base + rng.random() * 0.5, 3)} for _ in range(2)]
    rng.shuffle(clicks)
    return clicks, views


def _expected_counts(clicks: list[dict]) -> list[tuple]:
    per = Counter((c["user"], (c["ts"] - T0) // 10 * 10 + T0) for c in clicks)
    return sorted((user, n, start, start + 10) for (user, start), n in per.items())


def _expected_pairs(views: list[dict], clicks: list[dict]) -> list[tuple]:
    pairs = []
    starts = {s for r in views + clicks for s in ((r["ts"] - T0) // 5 * 5 + T0, (r["ts"] - T0) // 5 * 5 + T0 - 5)}
    for start in sorted(starts):
        end = start + 10
        for view in views:
            if start <= view["ts"] < end:
                for click in clicks:
                    if click["page"] == view["page"] and start <= click["ts"] < end:
                        pairs.append((view["page"], view["ts"], click["user"], click["ts"]))
    return sorted(pairs)


def test_windows_survive_a_worker_sigkill_and_emit_each_window_once(tmp_path):
    home = tmp_path / "home"
    root = home / "input" / "windows"
    rng = random.Random(7)
    with (
        LocalStack(
            home=home, workers=2, worker_args=["--trigger-seconds", "0.2", "--heartbeat-interval", "0.5"], session_timeout_s=4.0
        ) as stack,
        ZkStore.connect(stack.zk_config) as store,
    ):
        topology = build_windows(root, queues=2, lag_s=LAG)
        topology_id = submit(store, stack.cluster, topology, workers=2)
        clicks_topic, views_topic = (c.source.topic for c in topology.chains)
        clicks: list[dict] = []
        views: list[dict] = []
        for i in range(CHUNKS):
            chunk_clicks, chunk_views = _chunk(i, rng)
            produce(clicks_topic, chunk_clicks)
            produce(views_topic, chunk_views)
            clicks += chunk_clicks
            views += chunk_views
            if i == CHUNKS // 3:
                victim = stack.worker_processes[0]
                stack.kill_worker(victim)  # SIGKILL mid-window: its tasks move, their windows come back from the state topic
                time.sleep(1.0)
                stack.start_worker(port=victim.port)
            time.sleep(0.2)
        stack.wait_for_workers(2)

        def sources_caught_up() -> bool:
            tasks = describe_topology(store, topology_id).tasks
            return all(t.committed_txid >= 0 and not t.has_lag for t in tasks if t.stage_name in ("clicks", "views"))

        wait_for(sources_caught_up, 150, "the source tasks to read every record")
        time.sleep(2.0)  # a heartbeat later, still caught up: every record is in the shuffle
        wait_for(sources_caught_up, 30, "the source tasks to stay caught up")
        produce(clicks_topic, [{"user": u, "page": PAGES[0], "ts": CLOSE} for u in USERS])
        produce(views_topic, [{"page": p, "ts": CLOSE} for p in PAGES])

        counts = root / "clicks_per_user"
        expected_counts = _expected_counts(clicks)
        wait_for(lambda: len(read_parquet(counts, "*")) >= len(expected_counts), 120, "every window of the data to close")
        time.sleep(2.0)  # nothing more may come: a window written twice would show now
        assert read_parquet(counts, "user, clicks, window_start, window_end") == expected_counts
        expected_pairs = _expected_pairs(views, clicks)
        wait_for(lambda: len(read_parquet(root / "view_clicks", "*")) >= len(expected_pairs), 60, "the join's windows")
        assert read_parquet(root / "view_clicks", 'page, "views:ts", "clicks:user", "clicks:ts"') == expected_pairs

        produce(clicks_topic, [{"user": USERS[0], "page": PAGES[1], "ts": T0 + 1.0}])  # its window closed long ago
        wait_for(lambda: read_parquet(root / "late_clicks", "user, ts") != [], 60, "the late click in the late stream")
        assert read_parquet(root / "late_clicks", "user, page, ts") == [(USERS[0], PAGES[1], T0 + 1.0)]
        assert read_parquet(counts, "user, clicks, window_start, window_end") == expected_counts
