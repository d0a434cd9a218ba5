"""Benchmark of the heartbeat sensor's tick against a real ZooKeeper.

Starts an embedded ZooKeeper, submits 10 word-count topologies of 100 tasks each (1,000 tasks:
50 queues x 2 stages), registers simulated workers and gives every task an owner, a heartbeat
and a committed txid, the znodes real workers write. Then it evaluates the heartbeat sensor
(observations, both asset checks, rebalance and worker-launch run requests) through
``build_sensor_context``, as the sensor daemon does, while a background thread rewrites every
heartbeat and txid the way workers beating every 2 s would. Finally a few tasks are killed to
time ticks that also request rebalances.

Dagster gives a sensor tick 60 s (``DAGSTER_SENSOR_GRPC_TIMEOUT_SECONDS``); the sensor's own
wall-clock budget (``tick_budget_s``, default 20 s) stops it from starting new topologies after
that. The figures show how far below both a tick stays.

Run: ``.venv/bin/python bench/sensor.py [--topologies 10] [--queues 50] [--ticks 20]``
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dagster as dg

from stream_ops.config import ClusterConfig, ZooKeeperConfig
from stream_ops.coordination.embedded import EmbeddedZooKeeper
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import (
    HeartbeatRecord,
    OwnerRecord,
    TransactionalRecord,
    WorkerRecord,
)
from stream_ops.coordination.store import ZkStore, encode_json
from stream_ops.examples.wordcount import build_wordcount
from stream_ops.nimbus.assignment import read_assignment
from stream_ops.nimbus.status import describe_topology
from stream_ops.nimbus.submission import submit
from stream_ops.orchestration import ZooKeeperResource, build_heartbeat_sensor, build_jobs

WORKERS = tuple(f"127.0.0.1:{6700 + i}" for i in range(10))


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def machine_info() -> list[str]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return [
        f"platform   {platform.platform()}",
        f"cpu        {cpu_model()}, {os.cpu_count()} cpus ({usable} usable)",
        f"load avg   {', '.join(f'{x:.2f}' for x in load)} at start",
        f"python     {platform.python_version()}, dagster {dg.__version__}",
    ]


def write_task_nodes(store: ZkStore, topology_id: str, txid: int, *, create: bool, skip: frozenset[int] = frozenset()) -> int:
    """Owner, heartbeat and committed txid of every assigned task, in transactions of 100 ops."""
    assignment = read_assignment(store, topology_id)
    assert assignment is not None
    now = time.time()
    ops = 0
    tx = store.transaction()
    pending = 0
    for task_id, worker_id in sorted(assignment[0].tasks.items()):
        if task_id in skip:
            continue
        owner = OwnerRecord(worker_id=worker_id, epoch=1, since=now)
        beat = HeartbeatRecord(
            worker_id=worker_id,
            time=now,
            epoch=1,
            txid_in_flight=txid + 1,
            committed_txid=txid,
            rows_per_s=120.0,
            rows_out_per_s=80.0,
            lag_files=1,
            state_keys=1000,
            dead_letters=0,
        )
        committed = TransactionalRecord(committed_txid=txid, committed_epoch=1, epoch=1)
        for path, record, persistent in (
            (ZkPaths.owner(topology_id, task_id), owner, False),
            (ZkPaths.heartbeat(topology_id, task_id), beat, False),
            (ZkPaths.transactional_task(topology_id, task_id), committed, True),
        ):
            data = encode_json(record.to_json_obj())
            if create and path != ZkPaths.transactional_task(topology_id, task_id):
                tx.create(path, data, ephemeral=not persistent)
            else:
                tx.set_data(path, data)
            pending += 1
            ops += 1
        if pending >= 99:
            store.commit_transaction(tx)
            tx = store.transaction()
            pending = 0
    if pending:
        store.commit_transaction(tx)
    return ops


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topologies", type=int, default=10)
    parser.add_argument("--queues", type=int, default=50, help="queues per stage; tasks per topology = 2 x queues")
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--beat-interval", type=float, default=2.0, help="seconds between simulated heartbeat rounds")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.disable(logging.INFO)  # the sensor logs each lost topology at INFO on every tick
    warnings.filterwarnings("ignore", category=dg.BetaWarning)

    for line in machine_info():
        print(line)
    with tempfile.TemporaryDirectory(prefix="bench-sensor-") as tmp:
        home = Path(tmp)
        zookeeper = EmbeddedZooKeeper(home / "zookeeper", tick_time_ms=500)
        started = time.perf_counter()
        zookeeper.start(timeout_s=60)
        print(f"zookeeper  embedded {zookeeper.hosts}, ready in {time.perf_counter() - started:.2f} s (tickTime 500 ms)")
        try:
            run(zookeeper, home, args)
        finally:
            zookeeper.stop()


def run(zookeeper: EmbeddedZooKeeper, home: Path, args: Any) -> None:
    zk_config = ZooKeeperConfig(hosts=zookeeper.hosts, chroot="/bench", session_timeout_s=10.0, insecure=True)
    cluster = ClusterConfig(root=home / "cluster")
    names = [f"wordcount_{i:02d}" for i in range(args.topologies)]
    with ZkStore.connect(zk_config) as store:
        store.ensure_path(ZkPaths.WORKERS)
        for worker_id in WORKERS:
            host, _, port = worker_id.rpartition(":")
            record = WorkerRecord(worker_id=worker_id, host=host, port=int(port), pid=1, capacity=1000, started_at=time.time())
            store.create_json(ZkPaths.worker(worker_id), record.to_json_obj(), ephemeral=True)
        started = time.perf_counter()
        ids = [
            submit(store, cluster, build_wordcount(home / "input" / name, name=name, queues=args.queues), workers=len(WORKERS))
            for name in names
        ]
        ops = sum(write_task_nodes(store, topology_id, 0, create=True) for topology_id in ids)
        tasks = ops // 3
        print(
            f"setup      {len(ids)} topologies, {tasks} tasks on {len(WORKERS)} workers, {ops} znodes written "
            f"in {time.perf_counter() - started:.1f} s"
        )

        # Workers beating in the background: every task's heartbeat and txid rewritten each round.
        stop = threading.Event()
        rounds = [0]
        dead: frozenset[int] = frozenset()  # tasks whose worker "died": no more beats

        def beat_forever() -> None:
            with ZkStore.connect(zk_config) as beater:
                while not stop.is_set():
                    rounds[0] += 1
                    for topology_id in ids:
                        write_task_nodes(beater, topology_id, rounds[0], create=False, skip=dead)
                    stop.wait(args.beat_interval)

        beater = threading.Thread(target=beat_forever, name="beater", daemon=True)
        beater.start()

        jobs = build_jobs(topology_names=names)
        sensor = build_heartbeat_sensor(
            topology_names=names,
            heartbeat_timeout_s=10.0,
            launch_grace_s=0.0,
            rebalance_job=jobs.rebalance,
            worker_job=jobs.worker,
        )
        resource = ZooKeeperResource(hosts=zk_config.hosts, chroot=zk_config.chroot, session_timeout_s=10.0)

        def measure(label: str, ticks: int, cursor: str | None, instance: dg.DagsterInstance) -> str | None:
            times: list[float] = []
            events = requests = 0
            for _ in range(ticks):
                t0 = time.perf_counter()
                with dg.build_sensor_context(resources={"zookeeper": resource}, cursor=cursor, instance=instance) as context:
                    result = sensor(context)
                times.append(time.perf_counter() - t0)
                cursor = result.cursor
                events = len(result.asset_events or [])
                requests = len(result.run_requests or [])
            print(
                f"{label:<34} ticks {ticks:3d}  p50 {statistics.median(times) * 1000:7.0f} ms  "
                f"p95 {percentile(times, 0.95) * 1000:7.0f} ms  max {max(times) * 1000:7.0f} ms  "
                f"({events} asset events, {requests} run requests per tick)"
            )
            return cursor

        with dg.DagsterInstance.ephemeral() as instance:
            cursor = measure("first tick (no cursor)", 1, None, instance)
            cursor = measure("steady state, all healthy", args.ticks, cursor, instance)
            # Where a tick's time goes: the ZooKeeper reads alone (describe_topology of every
            # topology, one session), as the CLI's `stream-ops status` does them.
            reads: list[float] = []
            for _ in range(5):
                t0 = time.perf_counter()
                for topology_id in ids:
                    describe_topology(store, topology_id)
                reads.append(time.perf_counter() - t0)
            print(
                f"{'  of which ZooKeeper reads':<34} runs  {len(reads):3d}  p50 {statistics.median(reads) * 1000:7.0f} ms  "
                f"max {max(reads) * 1000:7.0f} ms  (describe_topology x {len(ids)}, ~{4 * tasks + 20 * len(ids)} sync gets)"
            )
            # 5 tasks of every topology die: no more beats, and their owner and heartbeat vanish.
            dead = frozenset(range(5))
            time.sleep(args.beat_interval * 1.5)  # let a beat round that started before pass
            for topology_id in ids:
                for task_id in dead:
                    store.delete_recursive(ZkPaths.owner(topology_id, task_id))
                    store.delete_recursive(ZkPaths.heartbeat(topology_id, task_id))
            measure("50 tasks lost (10 rebalances)", max(3, args.ticks // 4), cursor, instance)
            stop.set()
            beater.join(30)
        print(f"background {rounds[0]} heartbeat rounds of {tasks} tasks written while ticking")
        print("limits     Dagster sensor timeout 60 s; sensor tick_budget_s 20 s")


if __name__ == "__main__":
    main()
