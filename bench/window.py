"""Event-time windowed count: plain Spark Structured Streaming vs a stream_ops windowed topology.

Everything runs in one process, as in ``bench/wordcount.py``: an embedded ZooKeeper, one
SparkSession (``local[2]``) and, for stream_ops, a Worker on a thread that shares that session.
Both engines read the same input files (a 2-queue FileTopic of JSON lines ``{"user", "ts"}``,
written before the runs start) with the same trigger (``processingTime``) and the same
``maxFilesPerTrigger``, and write their results to a Parquet sink.

Input: ``--events`` events of ``--users`` users (uniform), event time ``ts`` (seconds since the
epoch, millisecond precision) spread evenly over ``--span`` seconds in file order, each up to
``--disorder`` seconds earlier than its place (out of order, within the lag), plus a fraction
``--late`` of *late* events that lie far behind (more than the event time a stream_ops window
batch can span at these settings, plus lag, disorder and a window), so both engines must drop
them. Files hold ``--records-per-file`` events per queue and are keyed by user
(``partition_for([user], 2)``, the same rule as stream_ops' shuffle), written chunk by chunk
in event-time order: queue 0's file then queue 1's file of each chunk, so Spark's file
source (oldest file first) reads them in that order. Keyed input gives each stream_ops window
task exactly one upstream source task; with ``--partitioning round-robin`` each window task
reads both source tasks, which run their batches independently, and its watermark is the
smallest event time both reported (minus the lag), so neither one's records count as late
because the other ran ahead.

* plain Spark: one query over both queue directories:
  ``withWatermark("ts_timestamp", "<lag> seconds")`` + ``groupBy(window("ts_timestamp",
  "<length> seconds"), "user").count()``, append output mode, Parquet file sink.
* stream_ops: ``events.window(Tumbling(<length>), time="event", timestamp_field="ts",
  lag=<lag>).group_by("user").aggregate(Count(), out="n").to_parquet(...)``: 2 source tasks
  count per (window, user) in Arrow the events that cannot be late at the window tasks and
  shuffle those counts, and the other events whole, to 2 window tasks (per-key partial counts
  per open window in RocksDB, emitted when the task's watermark passes the window's end), batch
  files fsynced (the default).

Timing, the same for both: *seconds* run from the trigger start of the first micro-batch that
read input (Spark's progress ``timestamp``; for stream_ops the earliest over its source tasks)
to the commit of the last result (Spark: the modification time of the ``_spark_metadata`` log
file that first lists the sink file holding the last rows; stream_ops: the modification time
of the ``_committed`` marker of the last sink batch that wrote rows, written after its
ZooKeeper commit). records/s = input events / seconds. *wall s* is from ``start()`` /
``submit()`` until the benchmark saw the last result and all input processed (Spark:
``processAllAvailable()`` returned; stream_ops: the window tasks idle with no unread shuffle
file, polled every ``--poll`` s), so it includes task start-up and polling. The last result can
come before the last input batch: events of the last windows, which never close, follow it.

Ground truth (Python): the final watermark is the largest event time minus the lag; every
window ending at or before it closes; count per (window, user) of the events that are not late.
Each engine's rows are compared with it, and the two engines with each other on the windows both
emitted; mismatches are printed, not hidden. Late-record rules differ a little (Spark drops a
row when its window already closed under the previous batch's watermark; stream_ops drops a
record older than its task's watermark at the start of the batch); the late events here are far
enough behind that both rules drop them.

A small warm-up run of each engine comes first (JIT, Python workers), and is not reported.
Spark's log level is ERROR (a batch longer than the trigger interval logs a warning each time),
and a batch refused while its task is killed at the end of the stream_ops run is not logged.

Run: ``.venv/bin/python bench/window.py [--events N] [--quick] [--partitioning user|round-robin]``
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import math
import os
import platform
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow.parquet as pq
import pyspark
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from stream_ops import Count, FileTopic, Topology, Tumbling
from stream_ops.config import ClusterConfig
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import TaskStoppingError
from stream_ops.hashing import partition_for
from stream_ops.nimbus import kill, submit
from stream_ops.sinks.parquet_sink import COMMITTED, committed_markers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import SPARK_MASTER, BenchRig, WorkerThread, wait_until  # the benchmarks' shared rig

QUEUES = 2
T0_MS = 1_699_999_200_000
"""Event time of the first event (2023-11-14T22:00:00Z, a whole hour, so windows align with it)."""
SCHEMA = {"user": "string", "ts": "double"}

# Defaults of the full run and of --quick; an option given on the command line wins.
FULL = {
    "events": 1_000_000,
    "users": 10_000,
    "span": 300.0,
    "records_per_file": 5_000,
    "max_files_per_trigger": 4,
    "warmup_events": 20_000,
}
QUICK = {
    "events": 100_000,
    "users": 2_000,
    "span": 120.0,
    "records_per_file": 1_000,
    "max_files_per_trigger": 2,
    "warmup_events": 5_000,
}

WindowKey = tuple[int, str]
"""(window start in ms since the epoch, user)."""

# --- input -------------------------------------------------------------------------------


@dataclass
class Input:
    """The generated events and what the ground truth makes of them."""

    users: list[str]
    ts_ms: list[int]
    late: list[bool]
    window_ms: int
    lag_ms: int
    late_delay_s: tuple[float, float]
    files: int = 0
    truth: dict[WindowKey, int] = field(default_factory=dict)
    final_watermark_ms: int = 0

    @property
    def events(self) -> int:
        return len(self.ts_ms)

    @property
    def n_late(self) -> int:
        return sum(self.late)

    def compute_truth(self) -> None:
        """Counts per (window, user) of the non-late events in windows the final watermark closes."""
        self.final_watermark_ms = max(self.ts_ms) - self.lag_ms
        truth: collections.Counter[WindowKey] = collections.Counter()
        w = self.window_ms
        for user, ts, late in zip(self.users, self.ts_ms, self.late, strict=True):
            if late:
                continue
            start = ts // w * w
            if start + w <= self.final_watermark_ms:
                truth[(start, user)] += 1
        self.truth = dict(truth)


def worst_window_batch_span_s(args: argparse.Namespace) -> float:
    """Event time one stream_ops window batch can span: ``maxFilesPerTrigger`` shuffle files, each
    one source batch of ``maxFilesPerTrigger`` input files of one queue."""
    per_queue_rate = args.events / args.span / QUEUES
    return args.max_files_per_trigger**2 * args.records_per_file / per_queue_rate


def make_input(
    n: int,
    n_users: int,
    *,
    span_s: float,
    disorder_s: float,
    late_fraction: float,
    late_min_s: float,
    window_s: float,
    lag_s: float,
    seed: int,
) -> Input:
    """``n`` events of ``n_users`` users, event times evenly over ``span_s`` with up to
    ``disorder_s`` of disorder; ``late_fraction`` of the events from ``2 * late_min_s`` on lie
    ``late_min_s`` to ``2 * late_min_s`` seconds behind their place instead."""
    rng = random.Random(seed)
    users = [f"u{i:06d}" for i in range(n_users)]
    span_ms = int(span_s * 1000)
    disorder_ms = int(disorder_s * 1000)
    late_lo, late_hi = int(late_min_s * 1000), int(2 * late_min_s * 1000)
    chosen = rng.choices(users, k=n)
    ts_ms: list[int] = []
    late: list[bool] = []
    for i in range(n):
        base = T0_MS + span_ms * i // n
        if late_fraction > 0 and base - T0_MS >= late_hi and rng.random() < late_fraction:
            ts_ms.append(base - rng.randint(late_lo, late_hi))
            late.append(True)
        else:
            ts_ms.append(base - rng.randint(0, disorder_ms))
            late.append(False)
    data = Input(
        users=chosen,
        ts_ms=ts_ms,
        late=late,
        window_ms=int(window_s * 1000),
        lag_ms=int(lag_s * 1000),
        late_delay_s=(late_lo / 1000, late_hi / 1000),
    )
    data.compute_truth()
    return data


def write_input(root: Path, data: Input, records_per_file: int, *, keyed: bool = True) -> FileTopic:
    """Write the events as a FileTopic, chunk by chunk in event-time order: keyed by user
    (``partition_for``, the rule of stream_ops' shuffle), or dealt round-robin."""
    topic = FileTopic(root, queues=QUEUES)
    topic.create()
    queue_of = {u: partition_for([u], QUEUES) for u in set(data.users)}
    stamp = time.time_ns()
    chunk = records_per_file * QUEUES
    files = 0
    for seq, begin in enumerate(range(0, data.events, chunk)):
        by_queue: list[list[str]] = [[] for _ in range(QUEUES)]
        for i in range(begin, min(begin + chunk, data.events)):
            user = data.users[i]
            # ts is ms / 1000: the JSON text is the shortest repr, so both engines parse the same double
            by_queue[queue_of[user] if keyed else i % QUEUES].append(f'{{"user":"{user}","ts":{data.ts_ms[i] / 1000!r}}}')
        for queue, lines in enumerate(by_queue):
            if lines:
                topic.write_lines(queue, f"p-{stamp:020d}-{seq:06d}-{uuid.uuid4().hex[:8]}.jsonl", lines)
                files += 1
    data.files = files
    return topic


# --- results -------------------------------------------------------------------------------


@dataclass
class RunResult:
    label: str
    events: int
    first_batch_at: float
    """Epoch seconds: trigger start of the first micro-batch that read input."""
    last_result_at: float
    """Epoch seconds: commit of the last result rows."""
    wall_s: float
    started_at: float
    """Epoch seconds: ``start()`` / ``submit()``."""
    rows: dict[WindowKey, int]
    late_dropped: int
    batches: dict[str, list[int]] = field(default_factory=dict)
    """Micro-batches that had input, per task, by stage kind ("all" for plain Spark's query)."""
    mean_batch_ms: dict[str, float] = field(default_factory=dict)
    duplicates: int = 0
    """(window, user) keys the sink holds more than once."""
    complete: bool = True
    """False when the run stopped waiting (stalled or timed out) before the expected rows came."""

    @property
    def seconds(self) -> float:
        return self.last_result_at - self.first_batch_at

    @property
    def records_per_s(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else math.nan

    @property
    def windows(self) -> int:
        return len({start for start, _ in self.rows})


def _batch_progress(progress: Sequence[Any]) -> list[Any]:
    """Progress reports of plain Spark's triggers that read input."""
    return [p for p in progress if int(p["numInputRows"]) > 0]


def _ran_batch(progress: Sequence[Any]) -> list[Any]:
    """Progress reports of a stream_ops task's triggers that ran a batch (idle triggers have no
    addBatch). Not ``numInputRows``: Spark counts 0 input rows for a batch stream_ops computes
    on the driver, since its DataFrame never runs."""
    return [p for p in progress if "addBatch" in (p["durationMs"] or {})]


def _progress_time(p: Any) -> float:
    return datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()


def _rows_of(table: Any) -> tuple[dict[WindowKey, int], int]:
    """(window start ms, user) -> n of a sink's rows, and how many keys came more than once
    (their counts are summed, so they show as differing counts too)."""
    if table is None:
        return {}, 0
    data = table.to_pydict()
    rows: dict[WindowKey, int] = {}
    duplicates = 0
    for user, n, start in zip(data["user"], data["n"], data["window_start"], strict=True):
        key = (round(start * 1000), user)
        duplicates += key in rows
        rows[key] = rows.get(key, 0) + int(n)
    return rows, duplicates


def _count_rows(files: Iterable[Path], cache: dict[Path, int]) -> int:
    total = 0
    for f in files:
        if f not in cache:
            cache[f] = pq.read_metadata(f).num_rows
        total += cache[f]
    return total


def _wait_rows(
    count: Callable[[], int], expected: int, *, ready: Callable[[], bool], poll_s: float, stall_s: float, timeout_s: float
) -> bool:
    """Poll ``count()`` until it reaches ``expected`` (and ``ready()``); False when it stalls for
    ``stall_s`` after ``ready()`` or the timeout passes."""
    deadline = time.monotonic() + timeout_s
    last, changed = -1, time.monotonic()
    while True:
        rows, is_ready = count(), ready()
        now = time.monotonic()
        if rows != last:
            last, changed = rows, now
        if rows >= expected and is_ready:
            return True
        if now > deadline or (is_ready and now - changed > stall_s):
            return False
        time.sleep(poll_s)


# --- plain Spark -------------------------------------------------------------------------


class SparkFileSink:
    """The committed files of a Spark Parquet file sink, from its ``_spark_metadata`` log."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.rows_cache: dict[Path, int] = {}

    def committed(self) -> dict[Path, float]:
        """Committed data file -> modification time of the log file that first listed it."""
        log = self.root / "_spark_metadata"
        if not log.exists():
            return {}
        entries = []
        for f in log.iterdir():
            name = f.name.removesuffix(".compact")
            if name.isdigit():
                entries.append((int(name), f))
        files: dict[Path, float] = {}
        for _, f in sorted(entries):
            try:
                mtime = f.stat().st_mtime
                lines = f.read_text(encoding="utf-8").splitlines()[1:]
            except FileNotFoundError:  # compacted away meanwhile
                continue
            for line in lines:
                entry = json.loads(line)
                if entry.get("action", "add") != "add":
                    continue
                path = Path(unquote(urlparse(entry["path"]).path))
                files.setdefault(path, mtime)
        return files

    def rows(self) -> int:
        return _count_rows(self.committed(), self.rows_cache)


def run_plain(
    spark: SparkSession,
    topic: FileTopic,
    work: Path,
    data: Input,
    *,
    label: str,
    trigger_s: float,
    max_files: int,
    poll_s: float,
    stall_s: float,
    timeout_s: float,
) -> RunResult:
    """Spark's own windowed count on ``topic``'s queue directories, append mode, Parquet sink."""
    out = work / f"plain-out-{label}"
    events = (
        spark.readStream.option("maxFilesPerTrigger", max_files)
        .schema("user string, ts double")
        .json(str(topic.root / "queue-*"))
    )
    counts = (
        events.withColumn("ts_timestamp", F.timestamp_seconds("ts"))
        .withWatermark("ts_timestamp", f"{data.lag_ms / 1000:g} seconds")
        .groupBy(F.window(F.col("ts_timestamp"), f"{data.window_ms / 1000:g} seconds"), "user")
        .count()
        .select(
            "user",
            F.col("count").alias("n"),
            (F.unix_micros(F.col("window.start")) / 1e6).alias("window_start"),
            (F.unix_micros(F.col("window.end")) / 1e6).alias("window_end"),
        )
    )
    sink = SparkFileSink(out)
    started_at, started_wall = time.time(), time.perf_counter()
    query = (
        counts.writeStream.queryName(f"plain-window-{label}")
        .outputMode("append")
        .format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(work / f"plain-checkpoint-{label}"))
        .trigger(processingTime=f"{trigger_s} seconds")
        .start()
    )
    try:
        query.processAllAvailable()
        complete = _wait_rows(sink.rows, len(data.truth), ready=lambda: True, poll_s=poll_s, stall_s=stall_s, timeout_s=timeout_s)
        wall = time.perf_counter() - started_wall
        progress = list(query.recentProgress)
    finally:
        query.stop()
    with_input = _batch_progress(progress)
    rows_in = sum(int(p["numInputRows"]) for p in with_input)
    if rows_in != data.events:
        print(f"WARNING: plain Spark progress reports {rows_in} rows in, expected {data.events}", file=sys.stderr)
    dropped = sum(int(op["numRowsDroppedByWatermark"]) for p in progress for op in (p["stateOperators"] or []))
    committed = sink.committed()
    with_rows = [f for f in committed if _count_rows([f], sink.rows_cache) > 0]
    rows, duplicates = _rows_of(pq.read_table([str(f) for f in with_rows]) if with_rows else None)
    return RunResult(
        label="plain Spark",
        events=data.events,
        first_batch_at=_progress_time(with_input[0]) if with_input else math.nan,
        last_result_at=max((committed[f] for f in with_rows), default=math.nan),
        wall_s=wall,
        started_at=started_at,
        rows=rows,
        duplicates=duplicates,
        late_dropped=dropped,
        batches={"all": [len(with_input)]},
        mean_batch_ms={"all": statistics.fmean(p["durationMs"]["triggerExecution"] for p in with_input) if with_input else 0.0},
        complete=complete,
    )


# --- stream_ops --------------------------------------------------------------------------


def build_window_count(name: str, input_root: Path, out: Path, *, window_s: float, lag_s: float) -> Topology:
    """The topology under test: event-time tumbling windows, count per user, Parquet sink."""
    t = Topology(name)
    events = t.source("events", FileTopic(input_root, queues=QUEUES), schema=SCHEMA)
    counts = events.window(Tumbling(window_s), time="event", timestamp_field="ts", lag=lag_s).group_by("user")
    counts.aggregate(Count(), out="n").to_parquet(out, name="counts")
    return t


def run_stream_ops(
    spark: SparkSession,
    store: ZkStore,
    cluster: ClusterConfig,
    worker: WorkerThread,
    topic: FileTopic,
    work: Path,
    data: Input,
    *,
    label: str,
    poll_s: float,
    stall_s: float,
    timeout_s: float,
) -> RunResult:
    """Submit the windowed count, wait for the sink to hold every closed window, kill it."""
    out = work / f"stream-ops-out-{label}"
    name = f"win-{label}"
    topology = build_window_count(name, topic.root, out, window_s=data.window_ms / 1000, lag_s=data.lag_ms / 1000)
    started_at, started_wall = time.time(), time.perf_counter()
    topology_id = submit(store, cluster, topology, workers=1)

    def runners() -> list[Any]:
        return [r for (tid, _), r in list(worker.worker._runners.items()) if tid == topology_id]

    idle_polls = [0]

    def all_input_done() -> bool:
        """Every event read by the source tasks, and the window tasks idle with no unread shuffle
        file on two polls in a row (the last windows that cannot close hold events too, and the
        late ones are counted once their batch ran)."""
        tasks = runners()
        done = sum(r.stats.rows_in for r in tasks if r.stage.kind == "source") >= data.events and all(
            r.stats.txid_in_flight is None and r.lag_files() == 0 for r in tasks if r.stage.kind != "source"
        )
        idle_polls[0] = idle_polls[0] + 1 if done else 0
        return idle_polls[0] >= 2

    cache: dict[Path, int] = {}

    def sink_rows() -> int:
        return _count_rows((out / f for m in committed_markers(out) for f in m.get("files", [])), cache)

    complete = _wait_rows(sink_rows, len(data.truth), ready=all_input_done, poll_s=poll_s, stall_s=stall_s, timeout_s=timeout_s)
    wall = time.perf_counter() - started_wall

    batches: dict[str, list[int]] = collections.defaultdict(list)
    durations: dict[str, list[float]] = collections.defaultdict(list)
    first_batch = math.inf
    dropped = 0
    for runner in sorted(runners(), key=lambda r: r.task.task_id):
        kind = runner.stage.kind
        batches[kind].append(runner.stats.batches)
        if kind != "source":
            dropped += runner.stats.dead_letters
        if runner.query is not None:
            with_input = _ran_batch(runner.query.recentProgress)
            durations[kind].extend(p["durationMs"]["triggerExecution"] for p in with_input)
            if kind == "source" and with_input:
                first_batch = min(first_batch, _progress_time(with_input[0]))

    # kill: stop the tasks before their znodes go, so the next run has the worker to itself
    def wait_stopped(_: float) -> None:
        wait_until(lambda: not any(t == topology_id for t, _ in worker.worker.running_tasks), 60)

    # a batch that starts while its task stops fails with TaskStoppingError (left for replay):
    # expected here, so Spark's log of the failed query is silenced for the kill
    spark.sparkContext.setLogLevel("OFF")
    try:
        kill(store, name, wait_s=1.0, sleep=wait_stopped)
    finally:
        spark.sparkContext.setLogLevel("ERROR")

    # the last result: the newest marker of a batch that wrote rows (markers are written after
    # the batch's ZooKeeper commit, when its files have been renamed into place)
    commit_times: list[float] = []
    files_with_rows: set[Path] = set()
    for marker in sorted((out / COMMITTED).glob("*t*-x*.json")):  # named <owner>.t<task>-x<txid>.json
        files = {out / f for f in json.loads(marker.read_text()).get("files", [])}
        if _count_rows(files, cache) > 0:
            files_with_rows |= files
            commit_times.append(marker.stat().st_mtime)
    table = pq.read_table([str(f) for f in sorted(files_with_rows)]) if files_with_rows else None
    rows, duplicates = _rows_of(table)
    return RunResult(
        label="stream_ops",
        events=data.events,
        first_batch_at=first_batch if math.isfinite(first_batch) else math.nan,
        last_result_at=max(commit_times, default=math.nan),
        wall_s=wall,
        started_at=started_at,
        rows=rows,
        duplicates=duplicates,
        late_dropped=dropped,
        batches=dict(batches),
        mean_batch_ms={k: statistics.fmean(v) for k, v in durations.items() if v},
        complete=complete,
    )


# --- verification --------------------------------------------------------------------------


def compare(got: dict[WindowKey, int], want: dict[WindowKey, int], window_ms: int, limit: int = 3) -> tuple[bool, str]:
    """Whether ``got`` equals ``want``, and a line saying how it differs."""
    missing = [k for k in want if k not in got]
    extra = [k for k in got if k not in want]
    differ = [k for k in want if k in got and got[k] != want[k]]
    if not (missing or extra or differ):
        return True, f"{len(want):,} (window, user) counts in {len({s for s, _ in want})} windows"

    def show(keys: list[WindowKey], what: Callable[[WindowKey], str]) -> str:
        return ", ".join(what(k) for k in sorted(keys)[:limit])

    def name(k: WindowKey) -> str:
        return f"{k[1]}@[{(k[0] - T0_MS) / 1000:g}, {(k[0] + window_ms - T0_MS) / 1000:g})"

    parts = []
    if missing:
        missing_windows = sorted({s for s, _ in missing} - {s for s, _ in got})
        note = f" ({len(missing_windows)} whole windows never emitted)" if missing_windows else ""
        parts.append(f"{len(missing):,} missing{note}, e.g. {show(missing, lambda k: f'{name(k)} want {want[k]}')}")
    if extra:
        parts.append(f"{len(extra):,} extra, e.g. {show(extra, lambda k: f'{name(k)} got {got[k]}')}")
    if differ:
        parts.append(f"{len(differ):,} differ, e.g. {show(differ, lambda k: f'{name(k)} got {got[k]} want {want[k]}')}")
    counted, truth = sum(got.values()), sum(want.values())
    parts.append(f"events counted {counted:,} vs {truth:,} (window times relative to the first event)")
    return False, "; ".join(parts)


def compare_engines(a: RunResult, b: RunResult, window_ms: int) -> tuple[bool, str]:
    """``a`` vs ``b`` on the windows both emitted."""
    common = {s for s, _ in a.rows} & {s for s, _ in b.rows}
    only_a = len({s for s, _ in a.rows} - common)
    only_b = len({s for s, _ in b.rows} - common)
    ra = {k: v for k, v in a.rows.items() if k[0] in common}
    rb = {k: v for k, v in b.rows.items() if k[0] in common}
    same, how = compare(ra, rb, window_ms)
    return same, (
        f"{len(common)} windows emitted by both ({only_a} only by {a.label}, {only_b} only by {b.label}): "
        + ("identical, " + how if same else f"{a.label} vs {b.label}: {how}")
    )


# --- report ------------------------------------------------------------------------------


def _fmt(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return "+".join(format(v, fmt) for v in value)
    return format(value, fmt)


def _pair(values: dict[str, Any], fmt: str) -> str:
    if "all" in values:
        return _fmt(values["all"], fmt)
    if not values:
        return "-"
    return " / ".join(_fmt(values[k], fmt) if k in values else "-" for k in ("source", "window"))


def report(
    spark: SparkSession,
    args: argparse.Namespace,
    data: Input,
    results: list[RunResult],
    load_start: tuple[float, ...],
) -> None:
    java = spark.sparkContext._jvm.System.getProperty("java.version")  # type: ignore[union-attr]
    plain, ops = results
    print()
    print(
        f"machine:  {platform.platform()}, {platform.machine()}, {os.cpu_count()} cpus, "
        f"Python {platform.python_version()}, pyspark {pyspark.__version__}, Java {java}"
    )
    print(
        f"load:     1/5/15-min load average {'/'.join(f'{x:.2f}' for x in load_start)} at the start, "
        f"{'/'.join(f'{x:.2f}' for x in os.getloadavg())} at the end "
        f"(1-min above ~0.5 before the runs: other processes shared the {os.cpu_count()} cpus)"
    )
    print(
        f"input:    {data.events:,} events of {args.users:,} users over {args.span:g} s of event time, "
        f"up to {args.disorder:g} s out of order, {data.n_late:,} late ones {data.late_delay_s[0]:g}-{data.late_delay_s[1]:g} s "
        f"behind (seed {args.seed}); {data.files} files of ~{args.records_per_file:,} events in {QUEUES} queues, "
        + ("keyed by user" if args.partitioning == "user" else "round-robin")
    )
    print(
        f"window:   tumbling {args.window:g} s, event time, lag (watermark delay) {args.lag:g} s; final watermark "
        f"{(data.final_watermark_ms - T0_MS) / 1000:g} s after the first event; ground truth {len(data.truth):,} "
        f"(window, user) counts in {len({s for s, _ in data.truth})} closed windows, {sum(data.truth.values()):,} events"
    )
    print(
        f"settings: {SPARK_MASTER}, shuffle partitions {spark.conf.get('spark.sql.shuffle.partitions')}, "
        f"trigger processingTime {args.trigger:g} s (both), maxFilesPerTrigger {args.max_files_per_trigger} per query "
        "(plain Spark: 1 query over both queues; stream_ops: 1 query per task, 2 source + 2 window tasks); "
        "Spark state store: default (HDFS-backed, in memory); stream_ops: RocksDB, batch files fsynced"
    )
    print(
        "timing:   seconds = trigger start of the first micro-batch with input -> commit of the last result rows "
        "(Spark: its _spark_metadata log file; stream_ops: the sink's _committed marker); records/s = input events / "
        "seconds; wall s = start()/submit() until the benchmark saw the last result and all input processed; 1st batch +s = start()/submit() "
        "to that first micro-batch (start-up, inside wall s, outside seconds)"
    )
    print()
    header = (
        f"{'engine':<12} {'records':>10} {'late dropped':>12} {'windows':>8} {'(window, user) rows':>20} "
        f"{'seconds':>8} {'records/s':>10} {'wall s':>7} {'1st batch +s':>12} {'batches/task src/win':>21} {'mean batch ms src/win':>22}  result"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        ok, _ = compare(r.rows, data.truth, data.window_ms)
        verdict = "matches ground truth" if ok else "MISMATCH"
        if r.duplicates:
            verdict += f" ({r.duplicates:,} emitted twice)"
        if not r.complete:
            verdict += " (incomplete: stopped waiting)"
        print(
            f"{r.label:<12} {r.events:>10,} {r.late_dropped:>12,} {r.windows:>8,} {len(r.rows):>20,} "
            f"{r.seconds:>8.2f} {r.records_per_s:>10,.0f} {r.wall_s:>7.2f} {r.first_batch_at - r.started_at:>12.2f} {_pair(r.batches, 'd'):>21} "
            f"{_pair(r.mean_batch_ms, '.0f'):>22}  {verdict}"
        )
    print(
        f"{'stream_ops / Spark':<24} records/s {ops.records_per_s / plain.records_per_s:.2f}x, "
        f"seconds {ops.seconds / plain.seconds:.2f}x, wall {ops.wall_s / plain.wall_s:.2f}x"
    )
    print()
    for r in results:
        ok, how = compare(r.rows, data.truth, data.window_ms)
        print(f"{r.label} vs ground truth: {'match, ' if ok else 'MISMATCH: '}{how}")
    _, how = compare_engines(ops, plain, data.window_ms)
    print(f"engines: {how}")
    print(
        f"late events: generated {data.n_late:,}; dropped by plain Spark {plain.late_dropped:,} "
        "(numRowsDroppedByWatermark: partially aggregated rows, one per (window, user) of a batch), "
        f"by stream_ops {ops.late_dropped:,} (the window tasks' dead letters)"
    )


# --- main --------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: " + ", ".join(f"{k} {v:,}" for k, v in QUICK.items()))
    parser.add_argument("--events", type=int, help=f"input events (default {FULL['events']:,})")
    parser.add_argument("--users", type=int, help=f"distinct users (default {FULL['users']:,})")
    parser.add_argument("--span", type=float, help=f"seconds of event time the events cover (default {FULL['span']:g})")
    parser.add_argument("--disorder", type=float, default=2.0, help="events are up to this many seconds out of order")
    parser.add_argument("--late", type=float, default=0.001, help="fraction of late events")
    parser.add_argument("--window", type=float, default=10.0, help="tumbling window length, seconds")
    parser.add_argument("--lag", type=float, default=5.0, help="watermark delay, seconds")
    parser.add_argument("--records-per-file", type=int, help=f"events per input file (default {FULL['records_per_file']:,})")
    parser.add_argument(
        "--max-files-per-trigger",
        type=int,
        help=f"both engines (default {FULL['max_files_per_trigger']}; small, so the watermark advances during the run)",
    )
    parser.add_argument(
        "--partitioning",
        choices=["user", "round-robin"],
        default="user",
        help="how events are spread over the 2 input queues: by user (each stream_ops window task then reads one "
        "source task) or round-robin (each window task reads both, and its watermark follows the faster one)",
    )
    parser.add_argument("--trigger", type=float, default=0.2, help="processingTime trigger in seconds, both engines")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--poll", type=float, default=0.2, help="sink poll interval, seconds")
    parser.add_argument("--stall", type=float, default=30.0, help="stop waiting after this long without new result rows")
    parser.add_argument("--warmup-events", type=int, help="0 skips the warm-up runs")
    parser.add_argument("--timeout", type=float, default=900.0, help="per run, seconds")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    defaults = QUICK if args.quick else FULL
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


class _NoLateLetterWarnings(logging.Filter):
    """Late events go to the dead letters by design here; they are counted, not logged per batch."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "records to the dead-letter topic" not in record.getMessage()


class _NoStoppingErrors(logging.Filter):
    """py4j's traceback of a batch refused because its task is being killed (expected)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], TaskStoppingError))


def _make_input(args: argparse.Namespace, n: int, span: float, late: float, seed: int) -> Input:
    late_min = worst_window_batch_span_s(args) + args.lag + args.disorder + args.window
    return make_input(
        n,
        args.users,
        span_s=span,
        disorder_s=args.disorder,
        late_fraction=late,
        late_min_s=math.ceil(late_min),
        window_s=args.window,
        lag_s=args.lag,
        seed=seed,
    )


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("stream_ops.runtime.batch_staging").addFilter(_NoLateLetterWarnings())
    logging.getLogger("py4j.clientserver").addFilter(_NoStoppingErrors())
    load_start = os.getloadavg()
    # keep every progress report: the first batch's start time is read from them; "Current batch
    # is falling behind" (every trigger that takes longer than its interval) is noise here
    progress = {"spark.sql.streaming.numRecentProgressUpdates": "100000"}
    with BenchRig("window", app_name="bench-window", keep=args.keep, spark_conf=progress, log_level="ERROR") as rig:
        work, spark, store = rig.work, rig.spark, rig.store
        t = time.perf_counter()
        data = _make_input(args, args.events, args.span, args.late, args.seed)
        topic = write_input(work / "input", data, args.records_per_file, keyed=args.partitioning == "user")
        print(
            f"input: {data.events:,} events, {data.n_late:,} late, {data.files} files written in "
            f"{time.perf_counter() - t:.1f} s; ground truth {len(data.truth):,} (window, user) counts",
            flush=True,
        )
        if data.n_late == 0 and args.late > 0:
            print(
                f"WARNING: no late events: late ones need {2 * data.late_delay_s[0]:g} s of event time before them "
                f"(--span {args.span:g}); raise --span or --events, or lower --records-per-file",
                file=sys.stderr,
            )

        cluster = ClusterConfig(root=work / "cluster")
        worker = rig.start_worker(cluster, trigger_s=args.trigger, max_files=args.max_files_per_trigger)
        common = dict(poll_s=args.poll, stall_s=args.stall, timeout_s=args.timeout)
        if args.warmup_events > 0:
            t = time.perf_counter()
            warm = _make_input(args, args.warmup_events, 60.0, 0.0, args.seed + 1)
            warm_topic = write_input(work / "warmup-input", warm, max(1, args.warmup_events // 8))
            for r in (
                run_plain(
                    spark,
                    warm_topic,
                    work,
                    warm,
                    label="warmup",
                    trigger_s=args.trigger,
                    max_files=args.max_files_per_trigger,
                    **common,
                ),
                run_stream_ops(spark, store, cluster, worker, warm_topic, work, warm, label="warmup", **common),
            ):
                ok, how = compare(r.rows, warm.truth, warm.window_ms)
                if not ok:
                    print(f"warm-up {r.label} differs from its ground truth: {how}", file=sys.stderr)
            print(f"warm-up ({args.warmup_events:,} events, both engines) took {time.perf_counter() - t:.1f} s", flush=True)

        results: list[RunResult] = []
        plain = run_plain(
            spark, topic, work, data, label="main", trigger_s=args.trigger, max_files=args.max_files_per_trigger, **common
        )
        print(f"plain Spark: {plain.seconds:.2f} s (wall {plain.wall_s:.2f} s)", flush=True)
        results.append(plain)
        ops = run_stream_ops(spark, store, cluster, worker, topic, work, data, label="main", **common)
        print(f"stream_ops: {ops.seconds:.2f} s (wall {ops.wall_s:.2f} s)", flush=True)
        results.append(ops)
        rig.stop_worker(worker)
        report(spark, args, data, results, load_start)


if __name__ == "__main__":
    main()
