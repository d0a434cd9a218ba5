"""End-to-end latency: a record's file landed -> its count visible to ``stream-ops query``.

Everything runs in one process, as in ``bench/wordcount.py`` (whose building blocks this reuses):
an embedded ZooKeeper, one SparkSession (``local[2]``) and a Worker on a thread sharing that
session, trigger ``processingTime`` ``--trigger`` s (0.2 by default).

Topology (two stages: 2 source tasks, 2 keyed tasks)::

    topology.source("records", FileTopic(input, queues=2), schema={"key": "string"})
        .group_by("key").persistent_aggregate(Count(), out="count", state=OpaqueMapState)
    topology.query("counts", counts)

Load: a writer thread lands files at a steady ``--rate`` records/s for the whole run: every
``--interval`` s one file per queue (``FileTopic.write_file``: a hidden temp file, fsync, rename
into place, fsync of the directory, as ``stream_ops.topics.producer.produce`` writes them),
records ``{"key": k}`` with ``k`` uniform among ``--keys`` background keys. It starts when
the first keyed batch committed (one record per queue, landed at submit, starts the tasks). The
schedule is absolute (tick ``i`` at ``t0 + i * interval``), so a late tick is caught up, not dropped.

Probes: ``--probes`` unique keys, spread evenly over ``--duration`` s (probe rate = probes /
duration), each one record in one of the writer's files (queues alternate). Its *landed* time is
taken right after that file's rename returned. A poller thread calls
``stream_ops.runtime.query_client.query_state`` (the function ``stream-ops query`` calls) every
``--poll`` s with all outstanding probe keys at once; a probe is *visible* when the call that
first returns count 1 for it has returned. Latency = visible - landed, so it includes one query
round trip and up to one poll interval.

Warm-up: probes start ``--warmup`` s after the first keyed batch committed (the first count
visible), and once the backlog (landed - committed) is at most 2 s of input or no longer shrinks.
After the last probe the writer keeps going until every probe is visible, then stops; once the
worker has caught up every key's count is compared with what was landed.

Rates: landed and processed (committed counts summed over all keys by the state query) over the
probe window, from a snapshot at its start and one at its end. Latency breakdown: each probe is
matched, from Spark's progress reports, to the source batch whose file listing (trigger start +
``latestOffset``) came after it landed and to the keyed batch that listed the source batch's
published shuffle file (``addBatch`` end); the parts are the waits for those batches, their
durations and the query's share. The attribution is approximate (a file landed during a listing).

Run: ``.venv/bin/python bench/latency.py [--quick] [--rate N] [--probes N] [--duration S]``
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import logging
import math
import os
import platform
import random
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyspark

from stream_ops import Count, FileTopic, Topology
from stream_ops.config import ClusterConfig
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import QueryError
from stream_ops.hashing import partition_for
from stream_ops.nimbus import kill, submit
from stream_ops.runtime.query_client import query_state
from stream_ops.runtime.task_runner import TaskRunner
from stream_ops.runtime.task_stats import COMMIT_STEPS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import SPARK_MASTER, BenchRig, wait_until  # the benchmarks' shared rig
from wordcount import QUEUES, STATES, _batch_progress  # the word count's input and progress reading

NAME = "latency"
QUERY = "counts"
QUERY_CHUNK = 500
"""Keys per ``query_state`` call when reading all counts (the query server takes up to 10,000)."""

# Defaults of the full run and of --quick; an option given on the command line wins.
FULL = {"probes": 1_000, "rate": 10_000, "duration": 50.0, "warmup": 5.0}
QUICK = {"probes": 100, "rate": 2_000, "duration": 10.0, "warmup": 3.0}


# --- load ----------------------------------------------------------------------------------


class Prober:
    """Polls the state query for the outstanding probe keys until each one's count is 1."""

    def __init__(self, store: ZkStore, *, poll_s: float) -> None:
        self.store = store
        self.poll_s = poll_s
        self.lock = threading.Lock()
        self.outstanding: dict[str, float] = {}
        self.landed: dict[str, float] = {}
        self.queue: dict[str, int] = {}
        self.visible: dict[str, float] = {}
        self.wrong: dict[str, Any] = {}
        """Probes whose first visible count was not 1."""
        self.query_ms: list[float] = []
        self.errors: Counter[str] = Counter()
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.run, name="latency-prober", daemon=True)

    def add(self, key: str, landed: float, queue: int) -> None:
        with self.lock:
            self.outstanding[key] = landed
            self.landed[key] = landed
            self.queue[key] = queue

    def pending(self) -> int:
        with self.lock:
            return len(self.outstanding)

    def run(self) -> None:
        while not self.stop_event.is_set():
            started = time.monotonic()
            with self.lock:
                keys = sorted(self.outstanding)
            if keys:
                try:
                    values = query_state(self.store, NAME, QUERY, [[k] for k in keys])
                except QueryError as e:
                    self.errors[str(e)[:120]] += 1
                    values = {}
                now = time.time()
                self.query_ms.append((time.monotonic() - started) * 1000.0)
                with self.lock:
                    for key in keys:
                        value = values.get(key)
                        if value is None:
                            continue
                        self.visible[key] = now
                        if value != 1:
                            self.wrong[key] = value
                        self.outstanding.pop(key, None)
            self.stop_event.wait(max(0.0, self.poll_s - (time.monotonic() - started)))

    def latencies(self) -> dict[str, float]:
        with self.lock:
            return {k: self.visible[k] - self.landed[k] for k in self.visible}


class Writer:
    """Lands one file per queue every ``interval_s`` s at ``rate`` records/s, probes included."""

    def __init__(self, topic: FileTopic, prober: Prober, *, rate: float, keys: int, interval_s: float, seed: int) -> None:
        self.topic = topic
        self.prober = prober
        self.rate = rate
        self.interval_s = interval_s
        self.background = [f"k{i:05d}" for i in range(keys)]
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.total = 0
        self.files = 0
        self.max_behind_s = 0.0
        self.started_at: float | None = None
        self.stopped_at: float | None = None
        self.error: BaseException | None = None
        # probes: set by start_probes
        self.probe_start: float | None = None
        self.probe_rate = 0.0
        self.probe_count = 0
        self.probes_landed = 0
        self.seq = itertools.count()
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="latency-writer", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(30)

    def start_probes(self, count: int, duration_s: float) -> None:
        with self.lock:
            self.probe_rate = count / duration_s
            self.probe_count = count
            self.probe_start = time.time()

    def snapshot(self) -> tuple[int, dict[str, int]]:
        with self.lock:
            return self.total, dict(self.counts)

    def _probes_due(self, now: float) -> int:
        with self.lock:
            if self.probe_start is None:
                return 0
            due = min(self.probe_count, math.floor((now - self.probe_start) * self.probe_rate + 0.5))
            return max(0, due - self.probes_landed)

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            self.error = e

    def _loop(self) -> None:
        t0 = time.monotonic()
        self.started_at = time.time()
        tick = 0
        written_target = 0
        while not self.stop_event.is_set():
            behind = time.monotonic() - (t0 + tick * self.interval_s)
            if behind < 0:
                if self.stop_event.wait(-behind):
                    break
            else:
                self.max_behind_s = max(self.max_behind_s, behind)
            tick += 1
            target = round(self.rate * self.interval_s * tick)
            n = target - written_target
            written_target = target
            per_queue = [n // QUEUES + (1 if q < n % QUEUES else 0) for q in range(QUEUES)]
            new_probes = self._probes_due(time.time())
            probes: list[list[str]] = [[] for _ in range(QUEUES)]
            for j in range(self.probes_landed, self.probes_landed + new_probes):
                probes[j % QUEUES].append(f"probe-{j:05d}")
            for q in range(QUEUES):
                self.land(q, self.rng.choices(self.background, k=per_queue[q]), probes[q])
        self.stopped_at = time.time()

    def land(self, queue: int, keys: list[str], probes: Sequence[str] = ()) -> None:
        """Land one file of ``keys`` and ``probes`` in ``queue`` (temp file, fsync, rename)."""
        if not keys and not probes:
            return
        records = [*keys, *probes]
        name = f"p-{time.time_ns():020d}-{next(self.seq):06d}-{uuid.uuid4().hex[:8]}.jsonl"
        self.topic.write_file(queue, name, ({"key": k} for k in records))
        landed = time.time()
        with self.lock:
            self.counts.update(records)
            self.total += len(records)
            self.files += 1
            self.probes_landed += len(probes)
        for key in probes:
            self.prober.add(key, landed, queue)


# --- state queries ---------------------------------------------------------------------------


def query_counts(store: ZkStore, keys: Sequence[str]) -> dict[str, int | None]:
    """Counts of ``keys`` through ``query_state``, in chunks of :data:`QUERY_CHUNK` keys."""
    out: dict[str, int | None] = {}
    for i in range(0, len(keys), QUERY_CHUNK):
        chunk = keys[i : i + QUERY_CHUNK]
        out.update(query_state(store, NAME, QUERY, [[k] for k in chunk], timeout_s=30.0))
    return out


@dataclass
class Snapshot:
    """Landed and committed records at one moment (committed read right after landed)."""

    at: float
    landed: int
    committed: int


def snapshot(store: ZkStore, writer: Writer) -> Snapshot:
    landed, counts = writer.snapshot()
    at = time.time()
    committed = query_counts(store, sorted(counts))
    return Snapshot(at=at, landed=landed, committed=sum(v or 0 for v in committed.values()))


def drain(store: ZkStore, writer: Writer, *, rate: float, timeout_s: float) -> tuple[float, list[int]]:
    """Wait until the backlog (landed - committed) is steady: at most 2 s of input, or shrunk by
    less than 10% over 5 s; returns the seconds waited and the backlog sampled every second."""
    started = time.monotonic()
    trace: list[int] = []
    while time.monotonic() - started < timeout_s:
        s = snapshot(store, writer)
        trace.append(s.landed - s.committed)
        if trace[-1] <= 2 * rate or (len(trace) > 5 and trace[-1] > 0.9 * trace[-6]):
            break
        time.sleep(1.0)
    return time.monotonic() - started, trace


# --- Spark progress: per-batch times -----------------------------------------------------------


@dataclass
class Batch:
    start: float
    listed: float
    """Trigger start + ``latestOffset`` (the file listing ended)."""
    published: float
    """End of ``addBatch``: the batch committed to ZooKeeper and published its output."""
    end: float
    durations: dict[str, float] = field(default_factory=dict)


def batches_of(runner: TaskRunner) -> list[Batch]:
    """The runner's batches that had input, in order, from its query's progress reports."""
    if runner.query is None:
        return []
    out = []
    for p in _batch_progress(runner.query.recentProgress):
        start = datetime.fromisoformat(str(p["timestamp"]).replace("Z", "+00:00")).timestamp()
        d = {k: float(v) / 1000.0 for k, v in (p["durationMs"] or {}).items()}
        end = start + d.get("triggerExecution", 0.0)
        out.append(
            Batch(
                start=start,
                listed=start + d.get("latestOffset", 0.0),
                published=end - d.get("commitOffsets", 0.0),
                end=end,
                durations=d,
            )
        )
    out.sort(key=lambda b: b.start)
    return out


def first_listed_after(batches: Sequence[Batch], t: float) -> Batch | None:
    i = bisect.bisect_left([b.listed for b in batches], t)
    return batches[i] if i < len(batches) else None


PARTS = ("wait for source batch", "source batch", "wait for keyed batch", "keyed batch", "query and poll")


def breakdown(
    prober: Prober, sources: dict[int, list[Batch]], keyed: dict[int, list[Batch]], keyed_queues: int
) -> tuple[dict[str, list[float]], int]:
    """Per-probe latency parts (seconds) and how many probes could not be attributed."""
    parts: dict[str, list[float]] = {p: [] for p in PARTS}
    unattributed = 0
    with prober.lock:
        probes = [(k, prober.landed[k], prober.visible[k], prober.queue[k]) for k in prober.visible]
    for key, landed, visible, queue in probes:
        src = first_listed_after(sources.get(queue, []), landed)
        dst = first_listed_after(keyed.get(partition_for([key], keyed_queues), []), src.published) if src else None
        if src is None or dst is None or dst.published > visible:
            unattributed += 1
            continue
        for name, value in zip(
            PARTS,
            (
                src.start - landed,
                src.published - src.start,
                dst.start - src.published,
                dst.published - dst.start,
                visible - dst.published,
            ),
        ):
            parts[name].append(value)
    return parts, unattributed


# --- report ------------------------------------------------------------------------------------


def pct(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100.0 * len(ordered)) - 1)]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown cpu"


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _loads(values: Iterable[float]) -> str:
    return "/".join(f"{x:.2f}" for x in values)


def _ms(x: float) -> str:
    return f"{x * 1000:.0f} ms"


def stage_summary(label: str, batches: dict[int, list[Batch]], lo: float, hi: float) -> str:
    """Batches with input in [lo, hi): count, mean duration and its main parts."""
    inside = [b for bs in batches.values() for b in bs if lo <= b.start < hi]
    if not inside:
        return f"{label}: no batches with input in the probe window"
    span = hi - lo
    keys = ("latestOffset", "walCommit", "queryPlanning", "getBatch", "addBatch", "commitOffsets")
    parts = ", ".join(f"{k} {statistics.fmean(b.durations.get(k, 0.0) for b in inside) * 1000:.0f}" for k in keys)
    per_task = len(inside) / len(batches) / span
    return (
        f"{label}: {len(inside)} batches with input over {len(batches)} tasks ({per_task:.2f}/s per task); duration mean "
        f"{statistics.fmean(b.end - b.start for b in inside) * 1000:.0f} ms, p50 {pct([b.end - b.start for b in inside], 50) * 1000:.0f}, "
        f"p99 {pct([b.end - b.start for b in inside], 99) * 1000:.0f} (ms, mean by step: {parts})"
    )


def runner_summary(label: str, runners: Sequence[TaskRunner]) -> str:
    """stream_ops' part of ``addBatch``: the runners' own per-batch times (all batches of the run)."""
    batches = sum(r.stats.batches for r in runners)
    if not batches:
        return f"{label}: no batches"
    parts = {
        "computing the batch (Spark or Arrow)": sum(r.stats.spark_ms_total for r in runners),
        "state": sum(r.stats.state_ms_total for r in runners),
        "staging": sum(r.stats.stage_ms_total for r in runners),
        "commit": sum(r.stats.commit_ms_total for r in runners),
    }
    steps = {step: sum(r.stats.commit_steps_ms[step] for r in runners) for step in COMMIT_STEPS}
    rows = sum(r.stats.rows_in for r in runners) / batches
    return (
        f"{label}: {rows:,.0f} rows in per batch (stream_ops' count: Spark's numInputRows misses the batches "
        "it did not read, those of the Arrow path); "
        + ", ".join(f"{name} {ms / batches:.1f}" for name, ms in parts.items())
        + " (ms per batch; commit by step: "
        + ", ".join(f"{step} {ms / batches:.1f}" for step, ms in steps.items())
        + ", rocksdb after the commit on the task's I/O thread)"
    )


# --- main ----------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: " + ", ".join(f"{k} {v:,}" for k, v in QUICK.items()))
    parser.add_argument("--probes", type=int, help=f"probe records (default {FULL['probes']:,})")
    parser.add_argument("--rate", type=float, help=f"records/s landed, steady (default {FULL['rate']:,})")
    parser.add_argument("--duration", type=float, help=f"seconds the probes are spread over (default {FULL['duration']:g})")
    parser.add_argument(
        "--warmup", type=float, help=f"seconds after the first commit before probing (default {FULL['warmup']:g})"
    )
    parser.add_argument("--keys", type=int, default=1_000, help="distinct background keys")
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between files (one per queue each time)")
    parser.add_argument(
        "--shuffle-trigger",
        type=float,
        default=None,
        help="trigger of the stream_ops stages that read a shuffle, seconds (default: the worker's, the same as --trigger)",
    )
    parser.add_argument("--trigger", type=float, default=0.2, help="processingTime trigger of the worker's queries, seconds")
    parser.add_argument("--max-files-per-trigger", type=int, default=100)
    parser.add_argument("--poll", type=float, default=0.02, help="state-query poll interval, seconds")
    parser.add_argument("--state", choices=sorted(STATES), default="opaque")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for the last probes, and for catch-up")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting on top of the defaults (repeatable)",
    )
    args = parser.parse_args()
    defaults = QUICK if args.quick else FULL
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    load_start = os.getloadavg()
    prober: Prober | None = None
    writer: Writer | None = None
    # keep every progress report: the latency breakdown reads them all; "Current batch is falling
    # behind" (every trigger that takes longer than its interval) is noise here
    progress = {"spark.sql.streaming.numRecentProgressUpdates": "100000"}
    progress.update(dict(item.split("=", 1) for item in args.spark_conf))
    with BenchRig("latency", app_name="bench-latency", keep=args.keep, spark_conf=progress, log_level="ERROR") as rig:
        try:
            work, spark, store = rig.work, rig.spark, rig.store
            cluster = ClusterConfig(root=work / "cluster")
            worker = rig.start_worker(
                cluster, trigger_s=args.trigger, max_files=args.max_files_per_trigger, shuffle_trigger_s=args.shuffle_trigger
            )

            topic = FileTopic(work / "input", queues=QUEUES)
            topology = Topology(NAME)
            counts = (
                topology.source("records", topic, schema={"key": "string"})
                .group_by("key")
                .persistent_aggregate(Count(), out="count", state=STATES[args.state])
            )
            topology.query(QUERY, counts)

            prober = Prober(store, poll_s=args.poll)
            writer = Writer(topic, prober, rate=args.rate, keys=args.keys, interval_s=args.interval, seed=args.seed)
            submitted = time.time()
            topology_id = submit(store, cluster, topology, workers=1)
            # one record per queue starts the tasks; the steady load starts with the first commit, so
            # the tasks' start-up (Spark queries, ~10-20 s here) leaves no backlog behind it
            topic.create()
            for q in range(QUEUES):
                writer.land(q, [writer.background[q]])
            first_keys = [[k] for k in writer.background[:QUEUES]]

            def first_commit() -> bool:
                try:
                    return any(v is not None for v in query_state(store, NAME, QUERY, first_keys).values())
                except QueryError:
                    return False

            if not wait_until(first_commit, 120, 0.05):
                raise SystemExit("no keyed batch committed within 120 s of submit")
            first_at = time.time()
            writer.start()
            print(f"first keyed batch committed {first_at - submitted:.1f} s after submit; warm-up {args.warmup:g} s", flush=True)
            time.sleep(args.warmup)
            if writer.error is not None:
                raise SystemExit(f"the writer failed: {writer.error!r}")
            # the start-up backlog (input landed while the tasks started) must be worked off first
            drain_s, backlog_trace = drain(store, writer, rate=args.rate, timeout_s=args.timeout)
            print(
                f"start-up backlog worked off in {drain_s:.1f} s (landed but uncommitted records, 1 s apart: "
                f"{', '.join(f'{b:,}' for b in backlog_trace[-8:])})",
                flush=True,
            )

            prober.thread.start()
            start = snapshot(store, writer)
            py_cpu0 = cpu_seconds(os.getpid())
            jvm_pid = spark.sparkContext._gateway.proc.pid  # type: ignore[union-attr]
            jvm_cpu0 = cpu_seconds(jvm_pid)
            writer.start_probes(args.probes, args.duration)
            probe_rate = args.probes / args.duration
            print(f"probing: {args.probes:,} probes over {args.duration:g} s ({probe_rate:.1f}/s)", flush=True)
            wait_until(lambda: writer.probes_landed >= args.probes or writer.error is not None, args.duration + 60, 0.05)
            end = snapshot(store, writer)
            py_cpu1 = cpu_seconds(os.getpid())
            jvm_cpu1 = cpu_seconds(jvm_pid)
            window_s = end.at - start.at
            print(f"all probes landed; waiting for {prober.pending()} still invisible", flush=True)
            wait_until(lambda: prober.pending() == 0, args.timeout, 0.05)
            all_visible_at = time.time()
            writer.stop()
            prober.stop_event.set()
            prober.thread.join(30)
            if writer.error is not None:
                raise SystemExit(f"the writer failed: {writer.error!r}")

            # exactness: every key's count against what was landed, once the worker caught up
            landed_total, landed = writer.snapshot()
            keys = sorted(landed)
            final: dict[str, int | None] = {}

            def caught_up() -> bool:
                nonlocal final
                try:
                    final = query_counts(store, keys)
                except QueryError:
                    return False
                return sum(v or 0 for v in final.values()) >= landed_total

            t = time.perf_counter()
            caught = wait_until(caught_up, args.timeout, 0.2)
            catch_up_s = time.perf_counter() - t
            mismatched = {k: (final.get(k), n) for k, n in landed.items() if final.get(k) != n}

            runners = [r for (tid, _), r in list(worker.worker._runners.items()) if tid == topology_id]
            sources = {r.task.queue: batches_of(r) for r in runners if r.stage.kind == "source"}
            keyed = {r.task.queue: batches_of(r) for r in runners if r.stage.kind == "keyed"}
            keyed_queues = next((r.stage.queues for r in runners if r.stage.kind == "keyed"), QUEUES)

            def wait_stopped(_: float) -> None:
                wait_until(lambda: not any(t == topology_id for t, _ in worker.worker.running_tasks), 60)

            kill(store, NAME, wait_s=1.0, sleep=wait_stopped)
            rig.stop_worker(worker)
            load_end = os.getloadavg()

            # --- report ---
            java = spark.sparkContext._jvm.System.getProperty("java.version")  # type: ignore[union-attr]
            lat = prober.latencies()
            values = list(lat.values())
            missing = args.probes - len(values)
            writer_s = (writer.stopped_at or time.time()) - (writer.started_at or submitted)
            print()
            print(
                f"machine:  {cpu_model()}, {os.cpu_count()} cpus, {platform.platform()}, Python {platform.python_version()}, "
                f"pyspark {pyspark.__version__}, Java {java}"
            )
            print(f"load:     1/5/15-min load average {_loads(load_start)} at the start, {_loads(load_end)} at the end")
            print(
                f"settings: {SPARK_MASTER}, trigger processingTime {args.trigger:g} s, maxFilesPerTrigger "
                f"{args.max_files_per_trigger}, {args.state} state, fsync on; topology: FileTopic source ({QUEUES} queues, "
                f"{QUEUES} tasks) -> group_by(key).persistent_aggregate(Count()) ({keyed_queues} keyed tasks) + query "
                f"{QUERY!r}; input {args.rate:,.0f} records/s over {args.keys:,} keys, one file per queue every "
                f"{args.interval:g} s ({args.rate * args.interval / QUEUES:,.0f} records each); {args.probes:,} probes "
                f"over {args.duration:g} s ({probe_rate:.1f}/s), polled every {args.poll * 1000:.0f} ms "
                f"(all outstanding keys per query_state call); warm-up {args.warmup:g} s after the first commit "
                f"({first_at - submitted:.1f} s after submit)"
                + (f"; Spark conf {', '.join(args.spark_conf)}" if args.spark_conf else "")
            )
            print(
                f"input:    landed {landed_total:,} records in {writer.files:,} files over {writer_s:.1f} s "
                f"({landed_total / writer_s:,.0f} records/s; writer at most {writer.max_behind_s * 1000:.0f} ms behind schedule)"
            )
            backlog = end.landed - end.committed
            print(
                f"rates:    probe window {window_s:.1f} s: landed {(end.landed - start.landed) / window_s:,.0f} records/s, "
                f"processed (committed counts from the state query) {(end.committed - start.committed) / window_s:,.0f} records/s; "
                f"landed but not yet committed at its start {start.landed - start.committed:,}, at its end {backlog:,} "
                f"({backlog / args.rate:.2f} s of input)"
            )
            landed_rate = (end.landed - start.landed) / window_s
            processed_rate = (end.committed - start.committed) / window_s
            if processed_rate < 0.95 * landed_rate:
                print(
                    f"          NOT STEADY: processed {processed_rate / landed_rate:.0%} of the landed rate; the backlog, "
                    "and with it the latency, grew through the probe window"
                )
            if py_cpu0 is not None and py_cpu1 is not None and jvm_cpu0 is not None and jvm_cpu1 is not None:
                print(
                    f"cpu:      during the probe window Python (driver, writer, poller) {(py_cpu1 - py_cpu0) / window_s:.2f} cores, "
                    f"JVM {(jvm_cpu1 - jvm_cpu0) / window_s:.2f} cores, of {os.cpu_count()}"
                )
            qms = prober.query_ms
            print(
                f"query:    {len(qms):,} query_state calls while probing, round trip p50 {pct(qms, 50):.1f} ms, "
                f"p99 {pct(qms, 99):.1f} ms" + (f"; errors {dict(prober.errors)}" if prober.errors else "")
            )
            print()
            if values:
                p50, p90, p99, worst = (pct(values, p) for p in (50, 90, 99, 100))
                print(
                    f"latency:  {len(values):,} probes: p50 {p50:.3f} s, p90 {p90:.3f} s, p99 {p99:.3f} s, max {worst:.3f} s, "
                    f"min {min(values):.3f} s, mean {statistics.fmean(values):.3f} s"
                    + (f"; {missing} never visible within {args.timeout:g} s" if missing else "")
                )
                with prober.lock:
                    in_order = [lat[k] for k in sorted(lat, key=prober.landed.__getitem__)]
                quarters = [in_order[i * len(in_order) // 4 : (i + 1) * len(in_order) // 4] for i in range(4)]
                print(
                    "          p50 by quarter of the probes in landing order: "
                    + " / ".join(f"{pct(q, 50):.3f}" for q in quarters if q)
                    + " s"
                )
                print(f"target p50 <= 1 s: {'PASS' if p50 <= 1.0 else 'MISS'}")
            else:
                print(f"latency:  no probe became visible within {args.timeout:g} s")
                print("target p50 <= 1 s: MISS")
            if prober.wrong:
                print(
                    f"WARNING: {len(prober.wrong)} probes first seen with a count other than 1: {list(prober.wrong.items())[:5]}"
                )

            parts, unattributed = breakdown(prober, sources, keyed, keyed_queues)
            n = len(parts[PARTS[0]])
            if n:
                print(
                    f"breakdown ({n:,} probes matched to their batches from Spark's progress reports, {unattributed} not): "
                    + ", ".join(f"{p} {_ms(statistics.fmean(parts[p]))} mean / {_ms(pct(parts[p], 50))} p50" for p in PARTS)
                )
            lo, hi = start.at, all_visible_at
            print(stage_summary("source stage", sources, lo, hi))
            print(runner_summary("  its addBatch", [r for r in runners if r.stage.kind == "source"]))
            print(stage_summary("keyed stage ", keyed, lo, hi))
            print(runner_summary("  its addBatch", [r for r in runners if r.stage.kind == "keyed"]))
            print()
            verdict = "MATCH" if caught and not mismatched else "MISMATCH"
            print(
                f"exactness: {verdict}: {len(keys):,} keys ({args.keys:,} background + {args.probes:,} probes) queried after "
                f"the writer stopped; worker caught up in {catch_up_s:.1f} s; committed "
                f"{sum(v or 0 for v in final.values()):,} vs landed {landed_total:,}"
                + (f"; {len(mismatched)} keys differ, e.g. {list(mismatched.items())[:5]}" if mismatched else "")
            )
            if verdict != "MATCH":
                sys.exit(1)
        finally:
            if prober is not None:
                prober.stop_event.set()
            if writer is not None:
                writer.stop_event.set()


if __name__ == "__main__":
    main()
