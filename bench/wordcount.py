"""Word count throughput: plain Spark Structured Streaming vs a stream_ops topology.

Everything runs in one process: an embedded ZooKeeper, one SparkSession (``local[2]``) and,
for stream_ops, a Worker on a thread that shares that session. Both engines read the same
input files (a 2-queue FileTopic of JSON lines, produced before each run starts) with the
same trigger (``processingTime``) and the same ``maxFilesPerTrigger``.

* plain Spark: one query over both queue directories; ``split`` + ``explode`` +
  ``groupBy(word).count()`` in update mode, ``foreachBatch`` collects the updated counts to the
  driver. Timed from ``start()`` until ``processAllAvailable()`` returns.
* stream_ops: ``build_wordcount`` (source stage: 2 tasks; keyed stage with opaque or
  transactional state: 2 tasks), its split written as Spark SQL
  (``select_expr("explode(split(sentence, ' ')) AS word")``, ``--split sql``: run as Arrow
  compute on the driver when the Arrow path reads the batch, else in the JVM), as a
  ``map_batches`` function over Arrow batches (``--split arrow``) and/or as Trident's
  ``each(split)`` per record in Python (``--split row``). Timed from ``submit`` until the state query returns exactly
  the ground truth (asked right after each keyed task's commit, which a ZooKeeper watch reports, and at
  least every ``--poll`` s, 1 s by default: a sample of 16 words, then every word once the sample
  matches; only a commit can change the answer, and each probe on a timer costs the run CPU, so
  the timer is a fallback), so it
  includes task start-up, the shuffle through files, RocksDB, the state topic and the ZooKeeper
  commits (the keyed stage polls its shuffle every ``--trigger`` s too, the worker's default;
  ``--shuffle-trigger`` sets another interval). ``--arrow-path off`` runs stream_ops with FileTopic batches
  always computed in Spark, to compare.

Both results are checked against ``collections.Counter`` over the generated sentences. A small
warm-up run of each engine comes first (JIT, Python workers), and is not reported. Each engine
and split then runs ``--repeat`` times, the runs interleaved (plain Spark, then each split, then
again, each round starting one run later) with a ``--settle`` pause before each, and the median
is reported: the JVM's JIT compiler is still busy with Spark's code after the warm-up (0.3-0.7
cpu-seconds of compiling per stream_ops run of 1.2M words, measured per JVM thread), so one run
depends on what ran before it.

The fsync cost of the commit path is measured twice: stream_ops runs once with its batch files
fsynced (the default) and once with ``ClusterConfig(fsync=False)`` (``--fsync``), and one
staged batch file is timed with and without fsync on the same file system.

Each input size (``--sentences``, default 200,000 and 1,000,000 sentences: 1.2M and 6M words)
runs plain Spark and every stream_ops split on its own input; the last lines sum up the ratio of
each split's words/s to plain Spark's per size, with the load average during the runs.

Run: ``.venv/bin/python bench/wordcount.py [--sentences N ...] [--state opaque transactional] [--split sql arrow row]``
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import logging
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyspark
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from stream_ops import OpaqueMapState, TransactionalMapState
from stream_ops.compute import decision, row_processes
from stream_ops.compute.settings import ARROW_BATCH_BYTES_CONF, DEFAULT_ARROW_BATCH_BYTES, ROW_PROCESSES_CONF
from stream_ops.config import ClusterConfig
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import QueryError
from stream_ops.examples.wordcount import build_wordcount
from stream_ops.nimbus import kill, submit
from stream_ops.runtime.query_client import query_state
from stream_ops.runtime.worker import WorkerSettings
from stream_ops.topics.file_topic import FileTopic
from stream_ops.topics.producer import produce

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import SPARK_MASTER, BenchRig, CommitWatch, WorkerThread, wait_until  # the benchmarks' shared rig

STATES = {"opaque": OpaqueMapState, "transactional": TransactionalMapState}
PROBE_KEYS = 16
QUEUES = 2

# --- input -------------------------------------------------------------------------------


def make_vocabulary(size: int, rng: random.Random) -> list[str]:
    """``size`` distinct lower-case pseudo-words of 1-4 syllables (no spaces)."""
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"]
    words: set[str] = set()
    vocab: list[str] = []
    while len(vocab) < size:
        word = "".join(rng.choice(syllables) for _ in range(rng.randint(1, 4)))
        if word not in words:
            words.add(word)
            vocab.append(word)
    return vocab


def make_sentences(count: int, vocab_size: int, seed: int) -> list[str]:
    """``count`` sentences of 1-11 words (mean 6), words drawn Zipf-like from the vocabulary."""
    rng = random.Random(seed)
    vocab = make_vocabulary(vocab_size, rng)
    cum: list[float] = []
    total = 0.0
    for rank in range(1, vocab_size + 1):
        total += 1.0 / rank
        cum.append(total)
    lengths = [rng.randint(1, 11) for _ in range(count)]
    words = rng.choices(vocab, cum_weights=cum, k=sum(lengths))
    sentences = []
    pos = 0
    for n in lengths:
        sentences.append(" ".join(words[pos : pos + n]))
        pos += n
    return sentences


def write_input(root: Path, sentences: Sequence[str], records_per_file: int) -> FileTopic:
    topic = FileTopic(root, queues=QUEUES)
    produce(topic, ({"sentence": s} for s in sentences), records_per_file=records_per_file)
    return topic


# --- plain Spark -------------------------------------------------------------------------


@dataclass
class RunResult:
    label: str
    seconds: float
    sentences: int
    words: int
    batches: dict[str, list[int]] = field(default_factory=dict)
    """Batches per task, by stage kind ("all" for plain Spark's single query)."""
    mean_batch_ms: dict[str, float] = field(default_factory=dict)
    commit_ms_per_batch: dict[str, float] = field(default_factory=dict)
    stage_ms_per_batch: dict[str, float] = field(default_factory=dict)
    keyed_commit_steps_ms: dict[str, float] = field(default_factory=dict)
    """The keyed stage's commit ms per batch, by step (state topic, RocksDB, ZooKeeper, publish)."""
    startup_s: float | None = None
    arrow_batches: int | None = None
    """Source batches read and computed in Arrow on the driver (no Spark job)."""
    process_batches: int | None = None
    """Those of them whose per-record operations ran in local processes."""
    all_seconds: list[float] = field(default_factory=list)
    """The wall time of every repeat of this run (this one is their median)."""

    @property
    def sentences_per_s(self) -> float:
        return self.sentences / self.seconds

    @property
    def words_per_s(self) -> float:
        return self.words / self.seconds


def _batch_progress(progress: Sequence[Any]) -> list[Any]:
    """Progress reports of triggers that ran a batch (idle triggers have no addBatch)."""
    return [p for p in progress if "addBatch" in (p["durationMs"] or {})]


def run_plain(
    spark: SparkSession,
    topic: FileTopic,
    work: Path,
    expected: dict[str, int],
    *,
    label: str,
    n_sentences: int,
    trigger_s: float,
    max_files: int,
) -> RunResult:
    """Plain Structured Streaming word count on ``topic``'s queue directories."""
    counts: dict[str, int] = {}
    lock = threading.Lock()

    def collect(batch: DataFrame, batch_id: int) -> None:
        rows = batch.collect()
        with lock:
            for row in rows:
                counts[row["word"]] = int(row["count"])

    sentences = (
        spark.readStream.option("maxFilesPerTrigger", max_files).schema("sentence string").json(str(topic.root / "queue-*"))
    )
    words = sentences.select(F.explode(F.split("sentence", " ")).alias("word")).groupBy("word").count()
    started = time.perf_counter()
    query = (
        words.writeStream.queryName(f"plain-{label}")
        .outputMode("update")
        .foreachBatch(collect)
        .option("checkpointLocation", str(work / f"plain-checkpoint-{label}"))
        .trigger(processingTime=f"{trigger_s} seconds")
        .start()
    )
    try:
        query.processAllAvailable()
        seconds = time.perf_counter() - started
        progress = _batch_progress(query.recentProgress)
    finally:
        query.stop()
    rows_in = sum(int(p["numInputRows"]) for p in progress)
    if rows_in != n_sentences:
        print(f"WARNING: plain Spark progress reports {rows_in} rows in, expected {n_sentences}", file=sys.stderr)
    if counts != expected:
        wrong = {w: (counts.get(w), n) for w, n in expected.items() if counts.get(w) != n}
        raise SystemExit(f"plain Spark counts differ from the ground truth ({len(wrong)} words), e.g. {list(wrong.items())[:5]}")
    return RunResult(
        label="plain Spark",
        seconds=seconds,
        sentences=n_sentences,
        words=sum(expected.values()),
        batches={"all": [len(progress)]},
        mean_batch_ms={"all": statistics.fmean(p["durationMs"]["triggerExecution"] for p in progress) if progress else 0.0},
    )


# --- stream_ops --------------------------------------------------------------------------


def run_stream_ops(
    store: ZkStore,
    cluster: ClusterConfig,
    worker: WorkerThread,
    input_root: Path,
    expected: dict[str, int],
    *,
    name: str,
    state: str,
    n_sentences: int,
    poll_s: float,
    timeout_s: float,
    label: str,
    split_with: str = "row",
) -> RunResult:
    """Submit the word count, wait for exact counts, read the runners' stats, kill it."""
    topology = build_wordcount(input_root, name=name, queues=QUEUES, state=STATES[state], split_with=split_with)
    keys = [[w] for w in sorted(expected)]
    # The poll asks for a sample of the words until they all match, then for every word: a
    # query of all 1,000 words costs ~15 ms of this process's CPU (its worker answers it), a
    # sample of 16 ~5 ms. Probes on a 0.1 s timer (two or three a run, while the source batches
    # ran) took CPU from the run they measured: the timer is only a fallback for the watch.
    probe = random.Random(len(keys)).sample(keys, min(PROBE_KEYS, len(keys)))
    probe_expected = {k[0]: expected[k[0]] for k in probe}
    in_arrow_before, in_processes_before = ARROW_BATCHES
    submitted_wall = time.time()
    started = time.perf_counter()
    topology_id = submit(store, cluster, topology, workers=1)
    commits = CommitWatch(store, topology_id)
    deadline = time.monotonic() + timeout_s
    last: dict[str, Any] = {}
    while True:
        try:
            if query_state(store, name, "words", probe) == probe_expected:
                last = query_state(store, name, "words", keys)
        except QueryError:
            pass
        if last == expected:
            break
        if time.monotonic() > deadline:
            wrong = {w: (last.get(w), n) for w, n in expected.items() if last.get(w) != n}
            raise SystemExit(
                f"stream_ops ({state}) did not reach the ground truth in {timeout_s:.0f} s; "
                f"{len(wrong)} words differ, e.g. {list(wrong.items())[:5]}"
            )
        commits.wait(poll_s)
    seconds = time.perf_counter() - started
    commits.close()

    runners = [r for (tid, _), r in list(worker.worker._runners.items()) if tid == topology_id]
    batches: dict[str, list[int]] = collections.defaultdict(list)
    commit_ms: dict[str, float] = collections.defaultdict(float)
    keyed_steps: dict[str, float] = collections.defaultdict(float)
    stage_ms: dict[str, float] = collections.defaultdict(float)
    durations: dict[str, list[float]] = collections.defaultdict(list)
    rows_in: dict[str, int] = collections.Counter()
    for runner in sorted(runners, key=lambda r: r.task.task_id):
        kind = runner.stage.kind
        batches[kind].append(runner.stats.batches)
        commit_ms[kind] += runner.stats.commit_ms_total
        if kind == "keyed":
            for step, ms in runner.stats.commit_steps_ms.items():
                keyed_steps[step] += ms
        stage_ms[kind] += runner.stats.stage_ms_total
        rows_in[kind] += runner.stats.rows_in
        if runner.query is not None:
            durations[kind].extend(p["durationMs"]["triggerExecution"] for p in _batch_progress(runner.query.recentProgress))
    if split_with == "row" and rows_in["source"] != n_sentences:  # a SQL split counts words in
        print(f"WARNING: source tasks report {rows_in['source']} rows in, expected {n_sentences}", file=sys.stderr)
    startup = max((r.stats.started_at for r in runners), default=submitted_wall) - submitted_wall

    # kill: stop the tasks before their znodes go, so the next run has the worker to itself
    def wait_stopped(_: float) -> None:
        wait_until(lambda: not any(t == topology_id for t, _ in worker.worker.running_tasks), 60)

    kill(store, name, wait_s=1.0, sleep=wait_stopped)
    return RunResult(
        label=f"stream_ops ({label})",
        seconds=seconds,
        sentences=n_sentences,
        words=sum(expected.values()),
        batches=dict(batches),
        mean_batch_ms={k: statistics.fmean(v) for k, v in durations.items() if v},
        commit_ms_per_batch={k: commit_ms[k] / sum(batches[k]) for k in batches if sum(batches[k])},
        stage_ms_per_batch={k: stage_ms[k] / sum(batches[k]) for k in batches if sum(batches[k])},
        keyed_commit_steps_ms={step: ms / sum(batches["keyed"]) for step, ms in keyed_steps.items() if sum(batches["keyed"])},
        startup_s=startup,
        arrow_batches=ARROW_BATCHES[0] - in_arrow_before,
        process_batches=ARROW_BATCHES[1] - in_processes_before,
    )


ARROW_BATCHES = [0, 0]
"""Source batches computed in Arrow so far in this process, and those of them run in local
processes (counted by :func:`count_arrow_batches`)."""


def count_arrow_batches() -> None:
    """Count the source batches that take an Arrow path (``decision.arrow_batch`` and
    ``decision.row_processes_batch``), and those of them whose per-record operations run in
    local processes (``row_processes.row_processes``)."""
    real, real_in_processes = decision.arrow_batch, decision.row_processes_batch
    real_pool = row_processes.row_processes

    def counted(*args: Any, **kwargs: Any) -> Any:
        ARROW_BATCHES[0] += 1
        return real(*args, **kwargs)

    def counted_in_processes(*args: Any, **kwargs: Any) -> Any:
        ARROW_BATCHES[0] += 1
        return real_in_processes(*args, **kwargs)

    def pooled(processes: int) -> Any:
        ARROW_BATCHES[1] += 1
        return real_pool(processes)

    decision.arrow_batch = counted
    decision.row_processes_batch = counted_in_processes
    row_processes.row_processes = pooled


def measure_file_fsync(work: Path, *, lines: int, repeats: int) -> tuple[float, float]:
    """Median ms to stage one batch file of ``lines`` shuffle lines, with and without fsync.

    The same write the commit path makes (temp file, rename; with fsync of the file before the
    rename and of the directory after it), on the file system of the benchmark's work directory.
    """
    records = [{"key": f'["w{i}"]', "value": i} for i in range(lines)]
    timings: dict[bool, list[float]] = {True: [], False: []}
    for durable in (True, False) * repeats:
        topic = FileTopic(work / "fsync-probe" / ("on" if durable else "off"), queues=1, durable=durable)
        started = time.perf_counter()
        topic.stage_batch(0, 1, len(timings[durable]), 1, records)
        timings[durable].append((time.perf_counter() - started) * 1000.0)
    shutil.rmtree(work / "fsync-probe", ignore_errors=True)
    return statistics.median(timings[True]), statistics.median(timings[False])


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
    return " / ".join(_fmt(values[k], fmt) if k in values else "-" for k in ("source", "keyed"))


def _si(x: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.2f}{unit}"
    return f"{x:.0f}"


def report(
    spark: SparkSession,
    args: argparse.Namespace,
    n_sentences: int,
    n_files: int,
    n_words: int,
    results: list[RunResult],
    load: tuple[float, ...],
    fsync_probe: tuple[float, float],
) -> None:
    java = spark.sparkContext._jvm.System.getProperty("java.version")  # type: ignore[union-attr]
    plain = results[0]
    print()
    print(
        f"machine:  {platform.platform()}, {platform.machine()}, {os.cpu_count()} cpus, "
        f"Python {platform.python_version()}, pyspark {pyspark.__version__}, Java {java}"
    )
    print(
        f"load:     1-min load average {load[0]:.2f} before the runs, {os.getloadavg()[0]:.2f} after "
        f"(above ~0.5 other processes shared the {os.cpu_count()} cpus and the figures are low)"
    )
    print(
        f"input:    {n_sentences:,} sentences, {n_words:,} words, vocabulary {args.vocabulary:,} (seed {args.seed}); "
        f"{n_files} files of <= {args.records_per_file:,} sentences in {QUEUES} queues"
    )
    print(
        f"settings: {SPARK_MASTER}, shuffle partitions {spark.conf.get('spark.sql.shuffle.partitions')}, "
        f"trigger processingTime {args.trigger} s (both), maxFilesPerTrigger {args.max_files_per_trigger} "
        f"(per query: plain Spark 1 query over both queues; stream_ops 1 query per task)"
        + "".join(f"; {item}" for item in args.spark_conf)
    )
    print(
        "timing:   plain Spark from start() to processAllAvailable(); stream_ops from submit() to the state "
        f"query matching the ground truth (asked after each keyed commit, at least every {args.poll} s)"
    )
    print()
    header = (
        f"{'run':<34} {'wall s':>7} {'runs s':>16} {'sentences/s':>12} {'words/s':>10} {'vs plain':>9} "
        f"{'batches/task src/keyed':>22} {'mean batch ms src/keyed':>23} {'stage ms/batch src':>18} "
        f"{'commit ms/batch src/keyed':>26}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        ratio = r.words_per_s / plain.words_per_s
        print(
            f"{r.label:<34} {r.seconds:>7.2f} {' '.join(f'{x:.2f}' for x in r.all_seconds):>16} {r.sentences_per_s:>12,.0f} {r.words_per_s:>10,.0f} {ratio:>8.2f}x "
            f"{_pair(r.batches, 'd'):>22} {_pair(r.mean_batch_ms, '.0f'):>23} "
            f"{_fmt(r.stage_ms_per_batch.get('source'), '.1f'):>18} {_pair(r.commit_ms_per_batch, '.1f'):>26}"
        )
    print(
        "columns: wall s = the median of the runs (runs s, interleaved with the other engine's); the other columns "
        "are the median run's; batches/task = micro-batches that had input, per task (stream_ops: 2 source + 2 keyed tasks); "
        "mean batch ms = Spark's triggerExecution per such batch; stage ms/batch = writing the shuffle files "
        "(TaskStats.stage_ms_total / batches); commit ms/batch = TaskStats.commit_ms_total / batches "
        "(source: ZooKeeper commit and publish; keyed: state topic, RocksDB write and ZooKeeper commit)"
    )
    fsync_runs = {r.label: r for r in results[1:]}
    for r in results[1:]:
        if "fsync on" in r.label and (off := fsync_runs.get(r.label.replace("fsync on", "fsync off"))) is not None:
            cost = {k: r.commit_ms_per_batch.get(k, 0.0) - off.commit_ms_per_batch.get(k, 0.0) for k in ("source", "keyed")}
            staged = r.stage_ms_per_batch.get("source", 0.0) - off.stage_ms_per_batch.get("source", 0.0)
            print(
                f"fsync cost ({r.label.split('(')[1].split(',')[0]}): source stage {staged + cost['source']:+.1f} ms/batch "
                f"(staging {staged:+.1f}, commit {cost['source']:+.1f}), keyed stage {cost['keyed']:+.1f} ms/batch; "
                f"throughput {r.words_per_s / off.words_per_s:.2f}x of the run without fsync"
            )
    on, off = fsync_probe
    print(
        f"one staged batch file of {args.vocabulary:,} lines (what a source task writes per keyed queue): "
        f"{on:.2f} ms with fsync of file and directory, {off:.2f} ms without (+{on - off:.2f} ms per file; a source "
        f"batch writes one per keyed queue, a keyed batch one state-topic file; median of {args.fsync_repeats})"
    )
    for r in results[1:]:
        if r.startup_s is not None:
            print(f"{r.label}: last task runner created {r.startup_s:.2f} s after submit (included in wall s)")
        if r.arrow_batches is not None:
            print(
                f"{r.label}: {r.arrow_batches} of {sum(r.batches.get('source', []))} source batches read and computed in "
                f"Arrow ({r.process_batches} with their per-record operations in local processes)"
            )
        if r.keyed_commit_steps_ms:
            steps = ", ".join(f"{step} {ms:.1f}" for step, ms in r.keyed_commit_steps_ms.items())
            print(f"{r.label}: keyed commit ms per batch by step: {steps}")
    print()
    print("docs/benchmarks.md (Markdown):")
    print(
        "| machine | input | plain Spark words/s | stream_ops words/s | stream_ops / plain | stage + commit ms/batch (source / keyed) |"
    )
    print("|---|---|---|---|---|---|")
    machine = f"{os.cpu_count()} cpus, {SPARK_MASTER}, trigger {args.trigger} s"
    inp = f"{n_sentences:,} sentences / {n_words:,} words"
    for r in results[1:]:
        print(
            f"| {machine} | {inp} | {_si(plain.words_per_s)} ({plain.seconds:.1f} s) | "
            f"{_si(r.words_per_s)} ({r.seconds:.1f} s, {r.label.split('(')[1].rstrip(')')}) | "
            f"{r.words_per_s / plain.words_per_s:.2f}x | "
            f"{r.stage_ms_per_batch.get('source', 0) + r.commit_ms_per_batch.get('source', 0):.1f} / "
            f"{r.commit_ms_per_batch.get('keyed', 0):.1f} |"
        )


# --- start-up ----------------------------------------------------------------------------

STARTUP_CHILD = Path(__file__).resolve().parent / "startup_child.py"

STARTUP_MILESTONES: dict[str, list[tuple[str, str, str, str]]] = {
    # (label, where the event comes from, text it contains, first or last such event)
    "plain": [
        ("imports (pyspark)", "bench", "imports done", "first"),
        ("JVM and SparkSession", "bench", "SparkSession ready", "first"),
        ("query start", "bench", "query started", "first"),
        ("first batch (exact)", "bench", "first exact result", "first"),
    ],
    "stream_ops": [
        ("imports (stack process)", "bench", "imports done", "first"),
        ("ZooKeeper start", "stack", "ZooKeeper ready", "first"),
        ("worker process spawned", "stack", "started worker", "first"),
        ("worker: imports, JVM and SparkSession", "worker", "SparkSession ready", "first"),
        ("worker registered", "worker", "registered", "first"),
        ("stack sees the worker", "bench", "local stack up", "first"),
        ("submit", "bench", "submitted", "first"),
        ("first task owned", "worker", "owns task", "first"),
        ("last stage query started", "worker", "running on", "last"),
        ("first commit (a source task)", "zookeeper", "first commit", "first"),
        ("last task's first commit", "zookeeper", "first commit", "last"),
        ("state query exact", "bench", "first exact result", "first"),
    ],
}
"""The phases of the start-up breakdown: each runs from the previous milestone to its event."""


@dataclass
class StartupRun:
    engine: str
    seconds: float
    events: list[tuple[float, str, str]]
    """(seconds since the process was started, where, what), in time order."""

    def milestones(self) -> list[tuple[str, float | None]]:
        """Each milestone's time (None: no such event), in time order (the stack may start its
        worker before or after ZooKeeper)."""
        found = []
        for label, where, text, which in STARTUP_MILESTONES[self.engine]:
            times = [t for t, w, what in self.events if w == where and text in what]
            found.append((label, (times[0] if which == "first" else times[-1]) if times else None))
        return sorted(found, key=lambda item: float("inf") if item[1] is None else item[1])


def run_startup_child(engine: str, input_root: Path, expected_file: Path, work: Path, args: argparse.Namespace) -> StartupRun:
    """Start ``bench/startup_child.py engine`` in a fresh Python process and time it from its start
    (just before the fork) to its first exact result."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    cmd = [sys.executable, str(STARTUP_CHILD), engine, "--input", str(input_root), "--expected", str(expected_file)]
    cmd += ["--work", str(work), "--trigger", str(args.trigger), "--timeout", str(args.timeout)]
    started = time.time()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout + 60, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{engine} start-up run failed ({done.returncode}):\n{done.stderr[-4000:]}")
    events = json.loads(done.stdout.strip().splitlines()[-1])["events"]
    timeline = sorted((t - started, where, what) for t, where, what in events)
    exact = next(t for t, where, what in timeline if where == "bench" and what == "first exact result")
    return StartupRun(engine, exact, timeline)


def run_startup(args: argparse.Namespace) -> None:
    """Process start -> first exact result, each engine in a fresh process, ``--startup-repeat``
    times interleaved; prints every run, the median run's breakdown and the difference."""
    work = Path(tempfile.mkdtemp(prefix="stream_ops_bench_startup_"))
    try:
        sentences = make_sentences(args.startup_sentences, args.vocabulary, args.seed)
        expected = dict(collections.Counter(w for s in sentences for w in s.split(" ")))
        topic = write_input(work / "input", sentences, args.records_per_file)
        expected_file = work / "expected.json"
        expected_file.write_text(json.dumps(expected))
        n_files = sum(len(topic.files(q)) for q in range(QUEUES))
        print(
            f"start-up input: {len(sentences):,} sentences, {sum(expected.values()):,} words, {len(expected):,} distinct, "
            f"{n_files} files in {QUEUES} queues; trigger {args.trigger} s (both engines)",
            flush=True,
        )
        del sentences
        load_before = os.getloadavg()
        runs: dict[str, list[StartupRun]] = {"plain": [], "stream_ops": []}
        for repeat in range(args.startup_repeat):
            for engine in ("plain", "stream_ops") if repeat % 2 == 0 else ("stream_ops", "plain"):
                time.sleep(args.settle)
                run = run_startup_child(engine, topic.root, expected_file, work / f"run-{engine}-{repeat}", args)
                runs[engine].append(run)
                print(f"{engine}: first exact result {run.seconds:.2f} s after process start", flush=True)
        load_after = os.getloadavg()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    medians = {engine: sorted(r, key=lambda run: run.seconds)[(len(r) - 1) // 2] for engine, r in runs.items()}
    print()
    print(
        "start-up: process start (fork + exec of a fresh Python) -> first exact result; plain Spark: SparkSession, "
        "file-source query, foreachBatch counts equal to the ground truth; stream_ops: what `stream-ops demo` runs with "
        "one worker (embedded ZooKeeper, a `stream-ops worker` process, nimbus, submit, state query until exact)"
    )
    for engine, run in medians.items():
        print(f"{engine}: median {run.seconds:.2f} s of {' '.join(f'{r.seconds:.2f}' for r in runs[engine])}; breakdown:")
        previous = 0.0
        for label, at in run.milestones():
            if at is None:
                print(f"  {label:<42} (no event)")
                continue
            print(f"  {label:<42} +{at - previous:5.2f} s  (at {at:5.2f} s)")
            previous = at
    if args.startup_timeline:
        for engine, run in medians.items():
            print(f"{engine} median run, every event:")
            for t, where, what in run.events:
                print(f"  {t:6.2f} {where:<9} {what[:140]}")
    difference = medians["stream_ops"].seconds - medians["plain"].seconds
    print(
        f"stream_ops - plain Spark: {difference:+.2f} s (target <= +2.00 s: {'met' if difference <= 2.0 else 'NOT met'}); "
        f"1-min load average {load_before[0]:.2f} before, {load_after[0]:.2f} after"
    )


# --- main --------------------------------------------------------------------------------


def run_size(
    rig: BenchRig, args: argparse.Namespace, n_sentences: int, *, warm_up: bool
) -> tuple[list[RunResult], tuple[float, ...], tuple[float, float], int, int]:
    """Plain Spark and every stream_ops run on ``n_sentences`` sentences: (results, load average
    before the runs, fsync probe, input files, words)."""
    work, spark, store = rig.work / f"size-{n_sentences}", rig.spark, rig.store
    t = time.perf_counter()
    sentences = make_sentences(n_sentences, args.vocabulary, args.seed)
    expected = dict(collections.Counter(w for s in sentences for w in s.split(" ")))
    topic = write_input(work / "input", sentences, args.records_per_file)
    n_files = sum(len(topic.files(q)) for q in range(QUEUES))
    n_words = sum(expected.values())
    print(
        f"input: {len(sentences):,} sentences, {n_words:,} words, {len(expected):,} distinct, {n_files} files "
        f"written in {time.perf_counter() - t:.1f} s",
        flush=True,
    )
    del sentences

    common = dict(trigger_s=args.trigger, max_files=args.max_files_per_trigger)
    load_before = os.getloadavg()
    runs: dict[str, list[RunResult]] = collections.defaultdict(list)  # plain Spark first
    for mode in args.fsync:
        cluster = ClusterConfig(root=work / f"cluster-fsync-{mode}", fsync=mode == "on")
        worker = rig.start_worker(
            cluster, trigger_s=args.trigger, max_files=args.max_files_per_trigger, shuffle_trigger_s=args.shuffle_trigger
        )
        if warm_up and args.warmup_sentences > 0 and not runs:
            t = time.perf_counter()
            warm = make_sentences(args.warmup_sentences, args.vocabulary, args.seed + 1)
            warm_expected = dict(collections.Counter(w for s in warm for w in s.split(" ")))
            warm_topic = write_input(work / "warmup-input", warm, max(1, args.warmup_sentences // 4))
            run_plain(spark, warm_topic, work, warm_expected, label="warmup", n_sentences=len(warm), **common)
            for split_with, arrow_path, processes in itertools.product(args.split, args.arrow_path, args.row_processes):
                set_paths(spark, arrow_path, processes)
                try:
                    run_stream_ops(
                        store,
                        cluster,
                        worker,
                        warm_topic.root,
                        warm_expected,
                        name=f"wc-warmup-{split_with}-arrow-{arrow_path}-{processes}",
                        state=args.state[0],
                        n_sentences=len(warm),
                        poll_s=args.poll,
                        timeout_s=args.timeout,
                        label="warmup",
                        split_with=split_with,
                    )
                finally:
                    set_paths(spark, None, None)
            print(f"warm-up ({args.warmup_sentences:,} sentences, both engines) took {time.perf_counter() - t:.1f} s", flush=True)
            load_before = os.getloadavg()
        combinations = list(itertools.product(args.state, args.split, args.arrow_path, args.row_processes))
        jobs: list[tuple[str, str, str, str] | None] = [None] * (mode == args.fsync[0]) + combinations  # None: plain Spark
        for repeat in range(args.repeat):
            # Interleaved, each repeat starting one job later, and after a pause: a run leaves the
            # JVM compiling and collecting for a while, which slowed whichever run came next.
            for job in jobs[repeat % len(jobs) :] + jobs[: repeat % len(jobs)]:
                time.sleep(args.settle)
                if job is None:
                    run = run_plain(
                        spark, topic, work, expected, label=f"main-{n_sentences}-{repeat}", n_sentences=n_sentences, **common
                    )
                    runs["plain Spark"].append(run)
                    print(f"plain Spark: {run.seconds:.2f} s, counts verified", flush=True)
                    continue
                state, split_with, arrow_path, processes = job
                set_paths(spark, arrow_path, processes)
                try:
                    run = run_stream_ops(
                        store,
                        cluster,
                        worker,
                        topic.root,
                        expected,
                        name=f"wc-{n_sentences}-{state}-{split_with}-fsync-{mode}-arrow-{arrow_path}-{processes}-{repeat}",
                        state=state,
                        n_sentences=n_sentences,
                        poll_s=args.poll,
                        timeout_s=args.timeout,
                        label=f"{split_with}, {state}, fsync {mode}"
                        + ("" if arrow_path == "on" else ", Arrow path off")
                        + ("" if processes == "auto" else f", row processes {processes}"),
                        split_with=split_with,
                    )
                finally:
                    set_paths(spark, None, None)
                print(f"{run.label}: {run.seconds:.2f} s, counts verified", flush=True)
                runs[run.label].append(run)
        rig.stop_worker(worker)
    probe = measure_file_fsync(work, lines=args.vocabulary, repeats=args.fsync_repeats)
    shutil.rmtree(work / "input", ignore_errors=True)
    results = [_median_run(label_runs) for label_runs in runs.values()]
    return results, load_before, probe, n_files, n_words


def set_paths(spark: SparkSession, arrow_path: str | None, processes: str | None) -> None:
    """Set (or with None unset) the Arrow path's settings for the next stream_ops run: the Arrow
    path on or off, and the local processes for per-record operations ("auto": the default)."""
    if arrow_path is None:
        spark.conf.unset(ARROW_BATCH_BYTES_CONF)
    else:
        spark.conf.set(ARROW_BATCH_BYTES_CONF, str(DEFAULT_ARROW_BATCH_BYTES if arrow_path == "on" else 0))
    if processes in (None, "auto"):
        spark.conf.unset(ROW_PROCESSES_CONF)
    else:
        spark.conf.set(ROW_PROCESSES_CONF, str(processes))


def _median_run(runs: list[RunResult]) -> RunResult:
    """The run of median wall time (the lower middle one of an even count), with every run's time."""
    chosen = sorted(runs, key=lambda r: r.seconds)[(len(runs) - 1) // 2]
    chosen.all_seconds = [r.seconds for r in runs]
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sentences",
        type=int,
        nargs="+",
        default=[200_000, 1_000_000],
        help="input sizes in sentences (~6 words each), one full comparison per size",
    )
    parser.add_argument("--records-per-file", type=int, default=10_000, help="sentences per input file")
    parser.add_argument("--vocabulary", type=int, default=1_000, help="distinct words")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--state", nargs="+", choices=sorted(STATES), default=["opaque"], help="stream_ops state kinds to run")
    parser.add_argument(
        "--split",
        nargs="+",
        choices=["sql", "arrow", "row"],
        default=["sql", "arrow", "row"],
        help="how stream_ops splits: select_expr in the JVM (sql), map_batches over Arrow batches (arrow), "
        "each(split) per record in Python (row)",
    )
    parser.add_argument(
        "--fsync",
        nargs="+",
        choices=["on", "off"],
        default=["on", "off"],
        help="run stream_ops with batch files fsynced (the default setting) and/or without, to measure the cost",
    )
    parser.add_argument(
        "--arrow-path",
        nargs="+",
        choices=["on", "off"],
        default=["on"],
        help="stream_ops with FileTopic batches read and computed in Arrow on the driver (on, the default) and/or "
        "always in Spark (off: spark.stream_ops.arrowBatchBytes=0)",
    )
    parser.add_argument(
        "--row-processes",
        nargs="+",
        default=["auto"],
        help="local processes that run the row function of a large batch read in Arrow (spark.stream_ops.rowProcesses): "
        "auto (the default, a local master's cores) and/or numbers; 0 leaves such batches to Spark's Python workers",
    )
    parser.add_argument(
        "--shuffle-trigger",
        type=float,
        default=None,
        help="trigger of the stream_ops stages that read a shuffle, seconds (default: the worker's, the same as --trigger)",
    )
    parser.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of the one SparkSession both engines run in, e.g. "
        "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1 (repeatable)",
    )
    parser.add_argument("--trigger", type=float, default=0.2, help="processingTime trigger in seconds, both engines")
    parser.add_argument("--max-files-per-trigger", type=int, default=WorkerSettings().max_files_per_trigger)
    parser.add_argument("--fsync-repeats", type=int, default=50, help="batch files written to time one fsync")
    parser.add_argument(
        "--poll",
        type=float,
        default=1.0,
        help="stream_ops state-query interval when no stateful task commits (a ZooKeeper watch asks after each commit), seconds",
    )
    parser.add_argument(
        "--warmup-sentences",
        type=int,
        default=100_000,
        help="0 skips the warm-up runs; keep a source batch above spark.stream_ops.driverBatchBytes (1 MiB): smaller "
        "batches run on the driver and would leave Spark's Python workers to start inside the timed run",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="runs of each engine and split per size, interleaved; the median is reported (the JVM's JIT still "
        "compiles Spark's code for minutes, so a single run depends on what ran before it)",
    )
    parser.add_argument("--settle", type=float, default=1.0, help="pause before each timed run, seconds")
    parser.add_argument("--timeout", type=float, default=600.0, help="per run, seconds")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument(
        "--startup",
        action="store_true",
        help="measure start-up instead of throughput: each engine in a fresh process, from its start to the first "
        "exact result (bench/startup_child.py), with stream_ops' breakdown",
    )
    parser.add_argument("--startup-sentences", type=int, default=200_000, help="with --startup: the input, sentences")
    parser.add_argument("--startup-repeat", type=int, default=3, help="with --startup: runs of each engine, interleaved")
    parser.add_argument("--startup-timeline", action="store_true", help="with --startup: print every event of the median runs")
    args = parser.parse_args()
    if args.startup:
        run_startup(args)
        return

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    count_arrow_batches()
    summary: list[tuple[int, int, list[RunResult], tuple[float, ...], float]] = []
    spark_conf = dict(item.split("=", 1) for item in args.spark_conf) or None
    with BenchRig("wordcount", app_name="bench-wordcount", keep=args.keep, spark_conf=spark_conf) as rig:
        for n_sentences in args.sentences:
            results, load, probe, n_files, n_words = run_size(rig, args, n_sentences, warm_up=not summary)
            report(rig.spark, args, n_sentences, n_files, n_words, results, load, probe)
            summary.append((n_sentences, n_words, results, load, os.getloadavg()[0]))
    print()
    print("words/s of stream_ops / plain Spark, per input size (counts verified exactly in every run):")
    for n_sentences, n_words, results, load, load_after in summary:
        plain = results[0]
        ratios = ", ".join(f"{r.label.split('(')[1].rstrip(')')}: {r.words_per_s / plain.words_per_s:.2f}x" for r in results[1:])
        print(
            f"  {n_words / 1e6:.1f}M words ({n_sentences:,} sentences; plain Spark {_si(plain.words_per_s)} words/s): "
            f"{ratios}  [1-min load average {load[0]:.2f} before, {load_after:.2f} after]"
        )


if __name__ == "__main__":
    main()
