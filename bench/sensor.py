"""Benchmark of the heartbeat sensor's tick against a real ZooKeeper, at 1,000 and 10,000 tasks.

Starts an embedded ZooKeeper and, for each size, submits word-count topologies of 100 tasks
each (50 queues x 2 stages) under a chroot of its own, registers 10 simulated workers and
gives every task an owner, a heartbeat and a committed txid, the znodes real workers write:

* ``1k``: 10 topologies, 1,000 tasks; target <= 0.3 s per tick;
* ``10k``: 100 topologies, 10,000 tasks; target <= 3 s per tick.

Then it evaluates the heartbeat sensor (observations, both asset checks, rebalance and
worker-launch run requests) through ``build_sensor_context``, as the sensor daemon does, while
simulated workers (another process by default, as real workers are) rewrite every heartbeat
and committed txid each ``--beat-interval`` seconds. Finally 5 tasks of every topology die, to
time ticks that also request a rebalance of every topology.

Checks, per size (any failure makes the exit status 1):

* every tick reports exactly topologies x 2 stages x (1 observation + 2 check evaluations)
  asset events; no run request while all are healthy; one rebalance per topology, for the
  dead tasks, once they died;
* ``verify``: with the workers paused, the tick's reads (:func:`read_topologies`, batched
  multiRead requests) give exactly the tick that one synchronous read per znode gives (the
  read path before batching, kept below as :func:`describe_topology_one_by_one`): same asset
  events (every metadata value), rebalances, spreads and cursor. Its time is printed as the
  "before" figure (``--no-verify`` skips it: it takes ~20 s at 10k).

The verdict compares the p90 of every timed tick of a size with its target.

Dagster gives a sensor tick 60 s (``DAGSTER_SENSOR_GRPC_TIMEOUT_SECONDS``); the sensor's own
wall-clock budget (``tick_budget_s``, default 20 s) stops it from starting new topologies after
that.

Run: ``.venv/bin/python bench/sensor.py [--sizes 1k,10k] [--ticks 20] [--beater process|thread|none]``
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import logging
import multiprocessing
import os
import platform
import pstats
import statistics
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dagster as dg

from stream_ops.config import ClusterConfig, SpreadPolicy, ZooKeeperConfig
from stream_ops.coordination.embedded import EmbeddedZooKeeper
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import (
    HeartbeatRecord,
    OwnerRecord,
    TaskRecord,
    TransactionalRecord,
    WorkerRecord,
)
from stream_ops.coordination.store import ZkStore, encode_json
from stream_ops.examples.wordcount import build_wordcount
from stream_ops.nimbus.assignment import live_workers, read_assignment
from stream_ops.nimbus.monitor import HeartbeatTracker
from stream_ops.nimbus.status import (
    AGE_OBSERVED,
    AGE_WORKER_CLOCK,
    TaskStatus,
    TopologyStatus,
    heartbeat_age,
    read_heartbeat,
    read_topologies,
    task_status,
)
from stream_ops.nimbus.submission import list_topologies, read_storm, submit
from stream_ops.orchestration import (
    HeartbeatCursor,
    StreamOpsTranslator,
    ZooKeeperResource,
    build_heartbeat_sensor,
    build_jobs,
    observe_tick,
)
from stream_ops.orchestration import sensors as sensors_module
from stream_ops.runtime.task_failures import read_task_errors

WORKERS = tuple(f"127.0.0.1:{6700 + i}" for i in range(10))
STAGES = 2  # the word count's: sentences, count
HEARTBEAT_TIMEOUT_S = 10.0
DEAD_PER_TOPOLOGY = 5


@dataclass(frozen=True)
class Size:
    label: str
    topologies: int
    queues: int
    target_s: float

    @property
    def tasks(self) -> int:
        return self.topologies * self.queues * STAGES


SIZES = {
    "1k": Size("1k", topologies=10, queues=50, target_s=0.3),
    "10k": Size("10k", topologies=100, queues=50, target_s=3.0),
}


@dataclass
class Outcome:
    size: Size
    times: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    before_s: float | None = None
    after_s: float | None = None


# --- the machine -------------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def load_avg() -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return ", ".join(f"{x:.2f}" for x in load)


def machine_info() -> list[str]:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return [
        f"platform   {platform.platform()}",
        f"cpu        {cpu_model()}, {os.cpu_count()} cpus ({usable} usable)",
        f"load avg   {load_avg()} at start",
        f"python     {platform.python_version()}, dagster {dg.__version__}",
    ]


# --- simulated workers -------------------------------------------------------------------------


def write_task_nodes(store: ZkStore, topology_id: str, txid: int, *, create: bool, skip: frozenset[int] = frozenset()) -> int:
    """What workers write, in transactions of <= 99 ops.

    ``create``: each assigned task's owner, heartbeat and committed txid. Otherwise (a beat):
    its heartbeat and committed txid (owners do not change while a worker runs a task).
    """
    assignment = read_assignment(store, topology_id)
    assert assignment is not None
    now = time.time()
    ops = 0
    tx = store.transaction()
    pending = 0
    for task_id, worker_id in sorted(assignment[0].tasks.items()):
        if task_id in skip:
            continue
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
        heartbeat = encode_json(beat.to_json_obj())
        if create:
            owner = OwnerRecord(worker_id=worker_id, epoch=1, since=now)
            tx.create(ZkPaths.owner(topology_id, task_id), encode_json(owner.to_json_obj()), ephemeral=True)
            tx.create(ZkPaths.heartbeat(topology_id, task_id), heartbeat, ephemeral=True)
            pending += 2
        else:
            tx.set_data(ZkPaths.heartbeat(topology_id, task_id), heartbeat)
            pending += 1
        tx.set_data(ZkPaths.transactional_task(topology_id, task_id), encode_json(committed.to_json_obj()))
        pending += 1
        if pending >= 97:
            store.commit_transaction(tx)
            ops += pending
            tx = store.transaction()
            pending = 0
    if pending:
        store.commit_transaction(tx)
        ops += pending
    return ops


def beat_forever(
    zk_config: ZooKeeperConfig,
    ids: list[str],
    interval_s: float,
    stop: Any,
    lock: Any,
    dead: Any,
    rounds: Any,
) -> None:
    """Workers beating: every live task's heartbeat and txid rewritten each round.

    ``lock`` is held while a round writes (the bench takes it to pause the workers); tasks
    ``0 .. dead.value - 1`` of every topology are dead (no more beats).
    """
    with ZkStore.connect(zk_config) as store:
        while not stop.is_set():
            with lock:
                rounds.value += 1
                skip = frozenset(range(dead.value))
                for topology_id in ids:
                    write_task_nodes(store, topology_id, rounds.value, create=False, skip=skip)
            stop.wait(interval_s)


class Beater:
    """Simulated workers in another process (``process``), a thread of this one, or ``none``."""

    def __init__(self, mode: str, zk_config: ZooKeeperConfig, ids: list[str], interval_s: float) -> None:
        self.mode = mode
        if mode == "process":
            ctx = multiprocessing.get_context("spawn")  # no fork of a process running kazoo threads
            self.stop_event: Any = ctx.Event()
            self.lock: Any = ctx.Lock()
            self.dead: Any = ctx.Value("i", 0)
            self.rounds: Any = ctx.Value("i", 0)
            make: Callable[..., Any] = ctx.Process
        else:
            self.stop_event, self.lock = threading.Event(), threading.Lock()
            self.dead, self.rounds = _Box(0), _Box(0)
            make = threading.Thread
        args = (zk_config, ids, interval_s, self.stop_event, self.lock, self.dead, self.rounds)
        self.runner = make(target=beat_forever, args=args, name="beater", daemon=True) if mode != "none" else None
        if self.runner is not None:
            self.runner.start()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No worker writes inside (waits for a round in progress to end)."""
        with self.lock:
            yield

    def stop(self) -> int:
        self.stop_event.set()
        if self.runner is not None:
            self.runner.join(60)
        return int(self.rounds.value)


class _Box:
    def __init__(self, value: int) -> None:
        self.value = value


# --- the read path before batching (the reference of ``verify``) ------------------------------


def describe_topology_one_by_one(
    store: ZkStore, topology_id: str, *, clock: Callable[[], float] = time.time, tracker: HeartbeatTracker | None = None
) -> TopologyStatus:
    """``describe_topology`` before batching: one synchronous ZooKeeper read per znode."""
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


@contextlib.contextmanager
def one_read_per_znode() -> Iterator[None]:
    """Make ``observe_tick`` read as it did before batching (patches the sensor module's hooks)."""

    def describe(
        self: Any, index: int, topology_id: str, *, clock: Callable[[], float], tracker: HeartbeatTracker
    ) -> TopologyStatus:
        return describe_topology_one_by_one(self._store, topology_id, clock=clock, tracker=tracker)

    with (
        mock.patch.object(sensors_module._ReadAhead, "describe", describe),
        mock.patch.object(sensors_module, "_list_topologies", list_topologies),
    ):
        yield


def verify(store: ZkStore, names: list[str], cursor: str | None, beater: Beater, outcome: Outcome, state: str) -> None:
    """The tick's batched reads give exactly the tick of one read per znode (workers paused)."""
    kwargs: dict[str, Any] = dict(
        topology_names=names,
        translator=StreamOpsTranslator(),
        heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
        tick_budget_s=1e9,  # observe every topology, however long the old path takes
        launch_grace_s=0.0,
        spread=SpreadPolicy(),
    )
    start = HeartbeatCursor.parse(cursor)
    now = time.time()
    with beater.paused():
        t0 = time.perf_counter()
        with one_read_per_znode():
            before = observe_tick(store, start, wall_clock=lambda: now, **kwargs)
        t1 = time.perf_counter()
        after = observe_tick(store, start, wall_clock=lambda: now, **kwargs)
        t2 = time.perf_counter()
    if outcome.before_s is None:
        outcome.before_s, outcome.after_s = t1 - t0, t2 - t1
    same = {
        "asset events": before.asset_events == after.asset_events,
        "rebalances": before.rebalances == after.rebalances,
        "spreads": before.spreads == after.spreads,
        "workers wanted": before.workers_wanted == after.workers_wanted,
        "observed/absent/deferred/failed": (before.observed, before.absent, before.deferred, before.failed)
        == (after.observed, after.absent, after.deferred, after.failed),
        "cursor": before.cursor == after.cursor,
    }
    differ = [what for what, ok in same.items() if not ok]
    if len(after.asset_events) != len(names) * STAGES * 3 or after.failed:
        differ.append(f"{len(after.asset_events)} asset events, failed {after.failed}")
    if differ:
        outcome.problems.append(f"verify ({state}): batched reads differ from one read per znode in {', '.join(differ)}")
    print(
        f"  {'verify (' + state + '): same as before':<40} {'OK' if not differ else 'DIFFERS: ' + ', '.join(differ)}  "
        f"(observe_tick, workers paused: one read per znode {(t1 - t0) * 1000:.0f} ms, batched {(t2 - t1) * 1000:.0f} ms; "
        f"{len(after.asset_events)} asset events, {len(after.rebalances)} rebalances)"
    )


# --- one size ----------------------------------------------------------------------------------


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def run_size(zookeeper: EmbeddedZooKeeper, home: Path, size: Size, args: Any) -> Outcome:
    outcome = Outcome(size)
    print(f"\n== {size.label}: {size.topologies} topologies x {size.queues * STAGES} tasks = {size.tasks} tasks ==")
    zk_config = ZooKeeperConfig(hosts=zookeeper.hosts, chroot=f"/bench-{size.label}", session_timeout_s=10.0, insecure=True)
    cluster = ClusterConfig(root=home / size.label / "cluster")
    names = [f"wordcount_{i:03d}" for i in range(size.topologies)]
    # per stage: 1 observation + 2 check evaluations; per topology: its health materialization + check
    expected_events = size.topologies * (STAGES * 3 + 2)
    with ZkStore.connect(zk_config) as store:
        store.ensure_path(ZkPaths.WORKERS)
        for worker_id in WORKERS:
            host, _, port = worker_id.rpartition(":")
            record = WorkerRecord(
                worker_id=worker_id, host=host, port=int(port), pid=1, capacity=1000, started_at=time.time(), tls=False
            )
            store.create_json(ZkPaths.worker(worker_id), record.to_json_obj(), ephemeral=True)
        started = time.perf_counter()
        ids = [
            submit(
                store, cluster, build_wordcount(home / size.label / "input" / n, name=n, queues=size.queues), workers=len(WORKERS)
            )
            for n in names
        ]
        submitted = time.perf_counter()
        ops = sum(write_task_nodes(store, topology_id, 0, create=True) for topology_id in ids)
        print(
            f"  setup      {len(ids)} topologies submitted in {submitted - started:.1f} s; {ops} owner/heartbeat/txid "
            f"znodes written in {time.perf_counter() - submitted:.1f} s (transactions)"
        )
        beater = Beater(args.beater, zk_config, ids, args.beat_interval)
        jobs = build_jobs(topology_names=names)
        sensor = build_heartbeat_sensor(
            topology_names=names,
            heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
            launch_grace_s=0.0,
            rebalance_job=jobs.rebalance,
            worker_job=jobs.worker,
            report_health=True,  # as build_definitions' sensor does
        )
        resource = ZooKeeperResource(hosts=zk_config.hosts, chroot=zk_config.chroot, session_timeout_s=10.0)

        def tick(cursor: str | None, instance: dg.DagsterInstance) -> tuple[dg.SensorResult, float]:
            t0 = time.perf_counter()
            with dg.build_sensor_context(resources={"zookeeper": resource}, cursor=cursor, instance=instance) as context:
                result = sensor(context)
            return result, time.perf_counter() - t0

        def measure(label: str, ticks: int, cursor: str | None, instance: dg.DagsterInstance, lost: bool) -> str | None:
            times: list[float] = []
            events = requests = 0
            for _ in range(ticks):
                result, elapsed = tick(cursor, instance)
                times.append(elapsed)
                cursor = result.cursor
                events = len(result.asset_events or [])
                run_requests = result.run_requests or []
                requests = len(run_requests)
                observations = sum(isinstance(e, dg.AssetObservation) for e in result.asset_events or [])
                if events != expected_events or observations != size.topologies * STAGES:
                    outcome.problems.append(
                        f"{label}: {events} asset events ({observations} observations), expected {expected_events}"
                    )
                want = sorted(
                    f"rebalance-{tid}-tasks-{'-'.join(map(str, range(DEAD_PER_TOPOLOGY)))}-epoch-" for tid in ids if lost
                )
                got = sorted((r.run_key or "").partition("epoch-")[0] + "epoch-" for r in run_requests)
                if got != want:
                    outcome.problems.append(f"{label}: run requests {got[:3]}..., expected {want[:3]}... ({len(want)})")
            outcome.times.extend(times)
            print(
                f"  {label:<40} ticks {ticks:3d}  p50 {statistics.median(times) * 1000:6.0f} ms  "
                f"p90 {percentile(times, 0.9) * 1000:6.0f} ms  max {max(times) * 1000:6.0f} ms  "
                f"({events} asset events, {requests} run requests per tick)"
            )
            return cursor

        try:
            with dg.DagsterInstance.ephemeral() as instance:
                cursor = measure("first tick (no cursor)", 1, None, instance, lost=False)
                cursor = measure("steady state, all healthy", args.ticks, cursor, instance, lost=False)
                if args.profile:
                    profiler = cProfile.Profile()
                    profiler.enable()
                    tick(cursor, instance)
                    profiler.disable()
                    text = io.StringIO()
                    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(30)
                    print("\n".join("    " + line for line in text.getvalue().splitlines()))
                # The reads alone, all topologies in one batch, as `stream-ops status` of each would.
                reads: list[float] = []
                for _ in range(5):
                    t0 = time.perf_counter()
                    batch = read_topologies(store, ids)
                    for topology_id in ids:
                        batch.describe(topology_id)
                    reads.append(time.perf_counter() - t0)
                print(
                    f"  {'  of which ZooKeeper reads + statuses':<40} runs  {len(reads):3d}  p50 {statistics.median(reads) * 1000:6.0f} ms  "
                    f"max {max(reads) * 1000:6.0f} ms  (read_topologies of all {len(ids)}, ~{4 * size.tasks + 4 * len(ids)} znodes)"
                )
                if args.verify:
                    verify(store, names, cursor, beater, outcome, "all healthy")
                # DEAD_PER_TOPOLOGY tasks of every topology die: no more beats, owner and heartbeat gone.
                with beater.paused():
                    beater.dead.value = DEAD_PER_TOPOLOGY
                    for topology_id in ids:
                        for task_id in range(DEAD_PER_TOPOLOGY):
                            store.delete_recursive(ZkPaths.owner(topology_id, task_id))
                            store.delete_recursive(ZkPaths.heartbeat(topology_id, task_id))
                label = f"{DEAD_PER_TOPOLOGY * len(ids)} tasks lost ({len(ids)} rebalances)"
                cursor = measure(label, max(3, args.ticks // 4), cursor, instance, lost=True)
                if args.verify:
                    verify(store, names, cursor, beater, outcome, "tasks lost")
        finally:
            rounds = beater.stop()
        print(
            f"  background {rounds} heartbeat rounds of {size.tasks} tasks written while ticking ({args.beater}); load avg {load_avg()}"
        )
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1k,10k", help=f"comma-separated, of {', '.join(SIZES)} (default: all)")
    parser.add_argument("--ticks", type=int, default=20, help="steady-state ticks timed per size")
    parser.add_argument("--beat-interval", type=float, default=2.0, help="seconds between simulated heartbeat rounds")
    parser.add_argument(
        "--beater", choices=["process", "thread", "none"], default="process", help="where simulated workers write from"
    )
    parser.add_argument("--no-verify", dest="verify", action="store_false", help="skip comparing with one read per znode")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of one steady-state tick per size")
    args = parser.parse_args()
    sizes = [SIZES[s.strip()] for s in args.sizes.split(",") if s.strip()]
    logging.basicConfig(level=logging.WARNING)
    logging.disable(logging.INFO)  # the sensor logs each lost topology at INFO on every tick
    warnings.filterwarnings("ignore", category=dg.BetaWarning)

    for line in machine_info():
        print(line)
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="bench-sensor-") as tmp:
        home = Path(tmp)
        zookeeper = EmbeddedZooKeeper(home / "zookeeper", tick_time_ms=500)
        started = time.perf_counter()
        zookeeper.start(timeout_s=60)
        print(f"zookeeper  embedded {zookeeper.hosts}, ready in {time.perf_counter() - started:.2f} s (tickTime 500 ms)")
        try:
            for size in sizes:
                outcomes.append(run_size(zookeeper, home, size, args))
        finally:
            zookeeper.stop()

    print("\nsize   tasks   ticks  median      p90      max   target  verdict (p90)   before -> after (observe_tick, verify)")
    failed = False
    for o in outcomes:
        p90 = percentile(o.times, 0.9)
        verdict = "PASS" if p90 <= o.size.target_s else "MISS"
        compare = f"{o.before_s:.2f} s -> {o.after_s:.2f} s" if o.before_s is not None and o.after_s is not None else "-"
        print(
            f"{o.size.label:<5} {o.size.tasks:6d}  {len(o.times):5d}  {statistics.median(o.times):5.2f} s  {p90:5.2f} s  "
            f"{max(o.times):5.2f} s  {o.size.target_s:5.1f} s  {verdict:<14}  {compare}"
        )
        failed |= verdict == "MISS" or bool(o.problems)
        for problem in o.problems[:10]:
            print(f"       PROBLEM {problem}")
    print("limits     Dagster sensor timeout 60 s; sensor tick_budget_s 20 s")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
