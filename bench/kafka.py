"""Kafka -> word count -> Kafka: plain Spark Structured Streaming, a stream_ops topology and Kafka
Streams, on a real single-node broker, one engine after another.

An embedded Kafka broker (KRaft, from the cached jars), an embedded ZooKeeper, one SparkSession
(``local[2]``, with Spark's Kafka connector) and, for stream_ops, a Worker on a thread sharing
that session. Each engine reads its own copy of the same sentences (a 2-partition input topic
filled before it starts) and writes the updated counts to its own output topic:

* plain Spark: ``readStream.format("kafka")``, ``from_json`` + ``explode(split)`` +
  ``groupBy(word).count()`` in update mode, ``writeStream.format("kafka")`` (key = word, value
  = the count as JSON), checkpointed. At-least-once on the Kafka side (Spark's Kafka sink has no
  transactions).
* stream_ops: ``KafkaTopic`` source -> ``select_expr(explode(split))`` -> ``group_by(word)`` ->
  ``persistent_aggregate(Count())`` (opaque state) -> ``new_values()`` ->
  ``to_kafka(key="word")``: every batch one Kafka transaction, exactly once for
  ``read_committed`` consumers.
* Kafka Streams 4.3.1 (the peer, ``bench/peers/kafka-streams/``, built with Maven once into the
  stream_ops cache by ``bench/kafka_streams_peer.py``; skipped, with the reason printed, when
  Maven or Maven Central is not there): ``flatMapValues(split)`` -> ``groupBy(word)`` (a
  repartition topic) -> ``count()`` (RocksDB store, changelog topic) -> ``to(output)`` with the
  same key and ``{"count": n}`` value as stream_ops, ``processing.guarantee=exactly_once_v2``,
  ``commit.interval.ms`` = the trigger (0.2 s), ``--kstreams-threads`` stream threads (2, as
  ``local[2]``), the default record cache (counts are deduplicated per commit, as a micro-batch
  does). Its own JVM, one for the whole benchmark (warmed up like the others); a new
  application id (consumer group, state, internal topics) per run.

**Throughput.** From the engine's start (``start()`` / ``submit``) until a consumer of the
output topic (``read_committed``) has seen, for every word, its final count. Every output is
checked against ``collections.Counter`` over the sentences.

**CPU.** Read from ``/proc`` (user + system, all threads) at the start and end of each phase:
the throughput run (start -> every final count seen) and the latency run's load after its
warm-up (every engine warmed at the same rate before its CPU is counted). Plain Spark and
stream_ops run in this process and its SparkSession: their CPU is this process's threads + the
Spark JVM + the Python workers it starts (live or reaped), less the harness's own Python threads
(the output reader's loop, the load loop, the probe breakdown's poller: measured with
``time.thread_time`` and shown apart); the librdkafka threads of the harness's consumer and load
producer stay in (the only part of the harness not separable). Kafka Streams: its JVM. The
broker and ZooKeeper are shown apart (all engines load the broker; only stream_ops uses
ZooKeeper). CPU per sentence (an input record, ~6 words) = CPU s / sentences.

**Latency.** Then each engine gets a steady load (``--rate`` sentences/s on a fresh input
topic) with a probe sentence of one unique word every ``1/--probe-rate`` s; a probe's latency is
the time from its produce call until its word's count 1 is read from the output topic (the
same clock: producer and consumer run in this process). p50/p99 over the probes. The first
``--warmup`` s of probes are not counted, nor the CPU of that time: the JVMs' JIT compilers are
still at work then (a stream_ops run's compiler threads took 0.47 cores in its first 15 s and
0.09 after two minutes), so the CPU compared is each engine's at steady load.

**Where a probe's time goes (stream_ops).** Each probe is followed exactly through the topology:
its input offset (the producer's delivery report) names the source task (the one reading its
partition) and the source batch whose offset range, in Spark's progress report, holds it; the
headers of its output message (task, txid) name the keyed batch that wrote its count. Their
times come from Spark's progress reports (a batch's trigger start) and from the runtime's
per-batch step times (``TaskStats.recent_batches``, :mod:`stream_ops.runtime.batch_timeline`),
both polled every second while the run lasts. A probe's latency is split into consecutive
parts that add up to it: the wait for the source batch's trigger, Spark's start of the batch
(offsets, its log, planning), the source batch's read and compute, its shuffle files staged,
its ZooKeeper commit, its publish (the shuffle visible to the keyed stage), the wait for the
keyed batch's trigger, Spark's start of that batch, the keyed compute, its sink batch staged,
the state-topic append, the ZooKeeper commit, the publish, the Kafka transaction (its records
produced, then committed with their markers: split at the output message's create time) and
the consumer's read. p50/p99 per part (each over the probes on its own, so they do not add up;
the means do) next to the total. Plain Spark: the total only.

It prints figures only (no speed asserts).

Run: ``.venv/bin/python bench/kafka.py [--quick] [--sentences 200000] [--rate 2000] [--duration 60] [--warmup 60]
[--engines plain stream_ops kafka-streams] [--skip throughput]``; ``--quick`` is 20k sentences and 15 s of probes
after 3 s of warm-up (a few minutes in all).
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import Message, Producer
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from stream_ops import Count, OpaqueMapState, Topology
from stream_ops.config import ClusterConfig
from stream_ops.kafka.client import client_config
from stream_ops.kafka.embedded import EmbeddedKafka
from stream_ops.kafka.jars import KAFKA_VERSION
from stream_ops.kafka.producing import produce_json
from stream_ops.kafka.sink_records import HEADER_TASK, HEADER_TXID
from stream_ops.runtime.batch_timeline import BatchTimes
from stream_ops.runtime.task_runner import TaskRunner
from stream_ops.sources import KafkaTopic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (  # the benchmarks' shared rig
    IN_PROCESS,
    SPARK_MASTER,
    BenchRig,
    CpuUse,
    OutputReader,
    Processes,
    SparkKafkaQueries,
    Topologies,
    WorkerThread,
    cpu_use,
    kafka_broker,
    kafka_processes,
    pct,
    print_kafka_machine,
    wait_until,
)
from kafka_streams_peer import KafkaStreamsPeer, PeerBuildError, build  # the Kafka Streams peer
from wordcount import make_sentences  # the word count's input

PARTITIONS = 2
QUICK = {"sentences": 20_000, "duration": 15.0, "warmup": 3.0}
"""``--quick``: the sizes of a run of a few minutes."""
FULL = {"sentences": 200_000, "duration": 60.0, "warmup": 60.0}


# --- reading the output ------------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """A word's first output message: when this process read it (wall clock), the batch that
    wrote it (stream_ops' headers; None for plain Spark) and the message's create time."""

    at: float
    task: int | None
    txid: int | None
    created_at: float | None


class CountsReader(OutputReader[tuple[str, int]]):
    """Reads an output topic (``read_committed``) on a thread: the latest count per word, and
    each word's first message (the probes' arrivals)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.latest: dict[str, int] = {}
        self.first_seen: dict[str, Seen] = {}
        super().__init__(bootstrap, topic, PARTITIONS)

    def _decode(self, message: Message) -> tuple[str, int] | None:
        key, value = message.key(), message.value()
        if key is None or value is None:
            return None
        return key.decode("utf-8"), _count_of(value)

    def _take(self, decoded: tuple[str, int], message: Message, now: float) -> None:
        word, count = decoded
        self.latest[word] = count
        if word not in self.first_seen:
            self.first_seen[word] = _seen(message, now)

    def matches(self, expected: dict[str, int]) -> bool:
        with self._lock:
            return len(self.latest) >= len(expected) and all(self.latest.get(w) == n for w, n in expected.items())

    def arrival(self, word: str) -> Seen | None:
        with self._lock:
            return self.first_seen.get(word)


def _seen(message: Message, now: float) -> Seen:
    headers = dict(message.headers() or [])
    task, txid = headers.get(HEADER_TASK), headers.get(HEADER_TXID)
    kind, created_ms = message.timestamp()
    return Seen(
        at=now,
        task=int(task) if task is not None else None,
        txid=int(txid) if txid is not None else None,
        created_at=created_ms / 1000.0 if kind == 1 else None,  # 1: TIMESTAMP_CREATE_TIME
    )


def _count_of(value: bytes) -> int:
    """The count in an output value: ``{"count": n}`` (stream_ops) or ``n`` (plain Spark)."""
    decoded = json.loads(value)
    return int(decoded["count"]) if isinstance(decoded, dict) else int(decoded)


# --- the two engines ---------------------------------------------------------------------------


@dataclass
class Engine:
    """Starting and stopping one engine on an input topic, writing to an output topic;
    ``cpu_parts`` names its processes in :meth:`Processes.sample`; ``runners`` lists a
    stream_ops engine's running tasks (None for the others)."""

    name: str
    start: Callable[[str, str], None]
    stop: Callable[[], None]
    cpu_parts: tuple[str, ...]
    runners: Callable[[], list[TaskRunner]] | None = None


def plain_spark(spark: SparkSession, kafka: EmbeddedKafka, work: Path, trigger_s: float) -> Engine:
    """Plain Structured Streaming: Kafka in, count by word, Kafka out."""
    queries = SparkKafkaQueries(spark, kafka.bootstrap_servers, work / "plain-checkpoints", trigger_s)

    def start(input_topic: str, output_topic: str) -> None:
        sentences = queries.read(input_topic).select(F.from_json(F.col("value").cast("string"), "sentence STRING").alias("v"))
        counts = sentences.select(F.explode(F.split("v.sentence", " ")).alias("word")).groupBy("word").count()
        out = counts.select(F.col("word").alias("key"), F.col("count").cast("string").alias("value"))
        queries.write(out, output_topic, output_mode="update")

    return Engine("plain Spark", start, queries.stop, IN_PROCESS)


def stream_ops_engine(rig: BenchRig, worker: WorkerThread, kafka: EmbeddedKafka) -> Engine:
    """The stream_ops topology: KafkaTopic -> split -> persistent count -> new_values -> to_kafka."""
    topologies = Topologies(rig, worker)

    def start(input_topic: str, output_topic: str) -> None:
        t = Topology(f"kwc-{output_topic}")
        source = KafkaTopic(kafka.bootstrap_servers, input_topic, partitions=PARTITIONS)
        words = t.source("sentences", source, schema={"sentence": "string"}).select_expr("explode(split(sentence, ' ')) AS word")
        counts = words.group_by("word").persistent_aggregate(Count(), out="count", state=OpaqueMapState)
        counts.new_values().to_kafka(kafka.bootstrap_servers, output_topic, key="word")
        topologies.submit(t)

    def runners() -> list[TaskRunner]:
        return [r for (tid, _), r in list(worker.worker._runners.items()) if tid in topologies.ids]

    return Engine("stream_ops", start, topologies.kill_all, IN_PROCESS, runners)


def kafka_streams_engine(peer: KafkaStreamsPeer) -> Engine:
    """The Kafka Streams peer: a new application (group, state, internal topics) per run, in the one JVM."""

    def start(input_topic: str, output_topic: str) -> None:
        peer.start(f"kwc-{output_topic}", input_topic, output_topic)

    return Engine("Kafka Streams", start, peer.stop, ("kafka-streams",))


ENGINE_OPTIONS = {"plain Spark": "plain", "stream_ops": "stream_ops", "Kafka Streams": "kafka-streams"}
"""Engine name -> its ``--engines`` value."""


# --- where a probe's time goes (stream_ops) -------------------------------------------------------


@dataclass(frozen=True)
class SparkBatch:
    """One batch of a task's query, from Spark's progress report."""

    txid: int
    trigger_at: float
    """Wall-clock start of the trigger that ran the batch."""
    durations_ms: dict[str, float]
    offsets: dict[int, tuple[int, int]]
    """Kafka partition -> [start, end) offsets the batch read (a Kafka source's batch only)."""


def _json_field(value: Any) -> Any:
    """A progress report's offset field: a JSON string, or already decoded."""
    return json.loads(value) if isinstance(value, str) else value


def spark_batch(progress: Any) -> SparkBatch:
    """A progress report of a trigger that ran a batch, as a :class:`SparkBatch`."""
    offsets: dict[int, tuple[int, int]] = {}
    for source in progress["sources"] or []:
        if "kafka" not in str(source["description"]).lower():
            continue  # the shuffle queue's offsets
        start, end = _json_field(source["startOffset"]), _json_field(source["endOffset"])
        start = start if isinstance(start, dict) else {}  # null before the first batch
        for topic, partitions in (end if isinstance(end, dict) else {}).items():
            begin = start.get(topic) or {}
            for partition, until in partitions.items():
                offsets[int(partition)] = (int(begin.get(partition, 0)), int(until))
    return SparkBatch(
        txid=int(progress["batchId"]),
        trigger_at=datetime.fromisoformat(str(progress["timestamp"]).replace("Z", "+00:00")).timestamp(),
        durations_ms={k: float(v) for k, v in (progress["durationMs"] or {}).items()},
        offsets=offsets,
    )


class TaskTimelines:
    """What a stream_ops topology's tasks did per batch, polled every ``interval_s`` on a thread
    while a run lasts: Spark's progress reports and the runtime's step times, per (task, txid)."""

    def __init__(self, runners: Callable[[], list[TaskRunner]], interval_s: float = 1.0) -> None:
        self._runners = runners
        self._interval_s = interval_s
        self.spark: dict[tuple[int, int], SparkBatch] = {}
        self.steps: dict[tuple[int, int], BatchTimes] = {}
        self.source_task: dict[int, int] = {}
        """Input partition -> the source task reading it."""
        self.kind: dict[int, str] = {}
        """Task id -> ``source`` or ``keyed``."""
        self.kafka_shuffle = False
        self.thread_cpu_s = 0.0
        """CPU seconds of the polling thread so far (the harness's, not the engine's)."""
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="task-timelines", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        started = time.thread_time()
        while not self._stop.wait(self._interval_s):
            self.poll()
            self.thread_cpu_s = time.thread_time() - started

    def poll(self) -> None:
        """Take what the running tasks hold now (older batches drop out of both records)."""
        for runner in self._runners():
            task = runner.task.task_id
            progress = self._new_progress(runner)
            with self._lock:
                self.kind[task] = "source" if runner.stage.reads_source else "keyed"
                if runner.stage.reads_source:
                    self.source_task[runner.task.queue] = task
                self.kafka_shuffle = self.kafka_shuffle or runner.kafka_shuffle is not None
                for batch in progress:
                    self.spark[task, batch.txid] = batch
                for times in runner.stats.recent_batches.snapshot():
                    self.steps[task, times.txid] = times

    def _new_progress(self, runner: TaskRunner) -> list[SparkBatch]:
        """The runner's batches reported since the last poll, newest first: Spark's recent
        reports read from the newest back to the first batch already taken, so a poll costs a
        few calls into the JVM, not one per report held (``recentProgress`` converts them all)."""
        query = runner.query
        if query is None:
            return []
        reports = query._jsq.recentProgress()
        out = []
        for i in range(len(reports) - 1, -1, -1):
            report = reports[i]
            txid = int(report.batchId())
            if (runner.task.task_id, txid) in self.spark:
                break
            if report.durationMs().containsKey("addBatch"):  # an idle trigger ran no batch
                out.append(spark_batch(json.loads(report.json())))
        return out

    def stop(self) -> None:
        """Stop polling, after a last poll (once)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        self.poll()

    def source_batch(self, partition: int, offset: int) -> tuple[int, int] | None:
        """(source task, txid) of the batch that read ``offset`` of ``partition``."""
        task = self.source_task.get(partition)
        with self._lock:
            for (t, txid), batch in self.spark.items():
                span = batch.offsets.get(partition)
                if t == task and span is not None and span[0] <= offset < span[1]:
                    return t, txid
        return None


PARTS = (
    ("source trigger wait", "produce -> the source batch's trigger starts"),
    ("source Spark start", "offsets, offset log, planning: trigger -> foreachBatch"),
    ("source read+compute", "Kafka read, split, partials (runtime steps spark + state)"),
    ("source shuffle staged", "the shuffle files written and fsynced (step 3)"),
    ("source ZooKeeper commit", "steps 4 + 5"),
    ("source publish", "the shuffle visible downstream (step 6: rename; or the Kafka shuffle transaction)"),
    ("keyed trigger wait", "shuffle published -> the keyed batch's trigger (input wake: every source task published)"),
    ("keyed Spark start", "queue offsets (the round wait), offset log, planning: trigger -> foreachBatch"),
    ("keyed read+compute", "partials read and applied to the state (step 2)"),
    ("keyed sink staged", "the sink batch written and fsynced (step 3)"),
    ("state topic append", "step 4"),
    ("ZooKeeper commit", "step 5"),
    ("publish", "step 6 before the deliveries"),
    ("Kafka txn: produce", "begin, the batch's records produced (-> the output message's create time)"),
    ("Kafka txn: commit", "flush, progress record, commit and its markers"),
    ("consumer read", "Kafka commit returned -> the read_committed consumer has the count"),
)


@dataclass
class Breakdown:
    """Per-probe latency parts in ms (:data:`PARTS`, adding up to ``total``)."""

    parts: dict[str, list[float]] = field(default_factory=lambda: {name: [] for name, _ in PARTS})
    total: list[float] = field(default_factory=list)
    unattributed: collections.Counter[str] = field(default_factory=collections.Counter)
    stage_lines: list[str] = field(default_factory=list)
    shuffle: str = ""


def probe_parts(
    sent_at: float, seen: Seen, src: tuple[SparkBatch, BatchTimes], dst: tuple[SparkBatch, BatchTimes]
) -> list[float]:
    """The consecutive parts of one probe's latency, seconds (:data:`PARTS` order)."""
    (s_spark, s_steps), (k_spark, k_steps) = src, dst
    s_end, k_end = s_steps.ends(), k_steps.ends()
    sm, km = s_steps.steps_ms, k_steps.steps_ms
    kafka_done = k_end["deliver"]
    produced = seen.created_at if seen.created_at is not None else k_end["publish"]
    produced = min(max(produced, k_end["publish"]), kafka_done)
    return [
        s_spark.trigger_at - sent_at,
        s_steps.started_at - s_spark.trigger_at,
        (sm["spark"] + sm["state"]) / 1000.0,
        sm["stage"] / 1000.0,
        (sm["state_topic"] + sm["zookeeper"]) / 1000.0,
        (sm["publish"] + sm["deliver"]) / 1000.0,
        k_spark.trigger_at - s_end["deliver"],
        k_steps.started_at - k_spark.trigger_at,
        (km["spark"] + km["state"]) / 1000.0,
        km["stage"] / 1000.0,
        km["state_topic"] / 1000.0,
        km["zookeeper"] / 1000.0,
        km["publish"] / 1000.0,
        produced - k_end["publish"],
        kafka_done - produced,
        seen.at - kafka_done,
    ]


def breakdown(timelines: TaskTimelines, probes: Sequence[tuple[float, int, int | None, Seen]]) -> Breakdown:
    """Split each probe (sent at, partition, offset, its first output message) into :data:`PARTS`."""
    out = Breakdown()
    for sent_at, partition, offset, seen in probes:
        if offset is None or seen.task is None or seen.txid is None:
            out.unattributed["no offset or output headers"] += 1
            continue
        source = timelines.source_batch(partition, offset)
        if source is None:
            out.unattributed["source batch not in the progress reports"] += 1
            continue
        keyed = (seen.task, seen.txid)
        found = [(timelines.spark.get(b), timelines.steps.get(b)) for b in (source, keyed)]
        if any(spark is None or steps is None or len(steps.steps_ms) < 7 for spark, steps in found):
            out.unattributed["a batch's times were not recorded"] += 1
            continue
        (s_spark, s_steps), (k_spark, k_steps) = found
        assert s_spark is not None and s_steps is not None and k_spark is not None and k_steps is not None
        values = probe_parts(sent_at, seen, (s_spark, s_steps), (k_spark, k_steps))
        for (name, _), value in zip(PARTS, values, strict=True):
            out.parts[name].append(value * 1000.0)
        out.total.append((seen.at - sent_at) * 1000.0)
    return out


def stage_lines(timelines: TaskTimelines, lo: float, hi: float) -> list[str]:
    """Per stage, the batches that started in [lo, hi): how many, Spark's time per batch by
    phase, and the runtime's steps (means, ms)."""
    lines = []
    for kind in ("source", "keyed"):
        tasks = [t for t, k in timelines.kind.items() if k == kind]
        spark = [b for (t, _), b in timelines.spark.items() if t in tasks and lo <= b.trigger_at < hi]
        steps = [b for (t, _), b in timelines.steps.items() if t in tasks and lo <= b.started_at < hi]
        if not spark or not steps:
            lines.append(f"{kind} stage: no batches in the probe window")
            continue
        phases = ("latestOffset", "walCommit", "queryPlanning", "addBatch", "commitOffsets", "triggerExecution")
        spark_means = ", ".join(f"{k} {_mean([b.durations_ms.get(k, 0.0) for b in spark]):.0f}" for k in phases)
        step_means = ", ".join(f"{k} {_mean([b.steps_ms.get(k, 0.0) for b in steps]):.1f}" for k in steps[0].steps_ms)
        rows = _mean([float(b.rows_in) for b in steps])
        per_s = len(spark) / max(len(tasks), 1) / (hi - lo)
        lines.append(
            f"{kind} stage ({len(tasks)} tasks): {per_s:.1f} batches/s per task, {rows:,.0f} rows in per batch; "
            f"Spark per batch (ms, means): {spark_means}; foreachBatch by runtime step (ms, means): {step_means}"
        )
    return lines


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


# --- runs ----------------------------------------------------------------------------------------


@dataclass
class Throughput:
    engine: str
    seconds: float
    sentences: int
    words: int
    output_messages: int
    cpu: CpuUse

    @property
    def words_per_s(self) -> float:
        return self.words / self.seconds


@dataclass
class Latency:
    engine: str
    rate: float
    probes_ms: list[float] = field(default_factory=list)
    lost: int = 0
    breakdown: Breakdown | None = None
    cpu: CpuUse | None = None
    load_s: float = float("nan")
    """Seconds from the end of the warm-up to the last sentence acknowledged (the CPU window)."""
    sentences: int = 0

    def pct(self, q: float) -> float:
        return pct(self.probes_ms, q)


def run_throughput(
    engine: Engine,
    kafka: EmbeddedKafka,
    processes: Processes,
    sentences: Sequence[str],
    expected: dict[str, int],
    tag: str,
    timeout_s: float,
) -> Throughput:
    input_topic, output_topic = f"in-{tag}", f"out-{tag}"
    kafka.create_topic(input_topic, PARTITIONS)
    kafka.create_topic(output_topic, PARTITIONS)
    produce_json(kafka.bootstrap_servers, input_topic, ({"sentence": s} for s in sentences), partitions=PARTITIONS)
    reader = CountsReader(kafka.bootstrap_servers, output_topic)
    try:
        cpu_before, reader_before = processes.sample(), reader.thread_cpu_s
        started = time.monotonic()
        engine.start(input_topic, output_topic)
        if not wait_until(lambda: reader.matches(expected), timeout_s, interval_s=0.05):
            wrong = {w: (reader.latest.get(w), n) for w, n in expected.items() if reader.latest.get(w) != n}
            raise SystemExit(
                f"{engine.name} ({tag}): counts did not reach the ground truth in {timeout_s:.0f} s: {len(wrong)} differ"
            )
        seconds = time.monotonic() - started
        cpu = cpu_use(engine.cpu_parts, cpu_before, processes.sample(), reader.thread_cpu_s - reader_before)
        return Throughput(engine.name, seconds, len(sentences), sum(expected.values()), reader.messages, cpu)
    finally:
        engine.stop()
        reader.close()


def run_latency(
    engine: Engine,
    kafka: EmbeddedKafka,
    processes: Processes,
    vocabulary: Sequence[str],
    tag: str,
    *,
    rate: float,
    probe_rate: float,
    duration_s: float,
    warmup_s: float,
    timeout_s: float,
) -> Latency:
    input_topic, output_topic = f"in-{tag}", f"out-{tag}"
    kafka.create_topic(input_topic, PARTITIONS)
    kafka.create_topic(output_topic, PARTITIONS)
    reader = CountsReader(kafka.bootstrap_servers, output_topic)
    producer = Producer(client_config(kafka.bootstrap_servers, **{"linger.ms": 1}))
    rng = random.Random(7)
    result = Latency(engine.name, rate)
    timelines = TaskTimelines(engine.runners) if engine.runners is not None else None
    offsets: dict[str, int] = {}

    def delivered(error: Any, message: Any) -> None:
        if error is None:
            offsets[json.loads(message.value())["sentence"]] = message.offset()

    try:
        engine.start(input_topic, output_topic)
        if timelines is not None:
            timelines.start()
        # the first records start the tasks; the load begins when the first count comes out
        producer.produce(input_topic, json.dumps({"sentence": "start"}).encode(), partition=0)
        producer.produce(input_topic, json.dumps({"sentence": "start"}).encode(), partition=1)
        producer.flush(10)
        if not wait_until(lambda: reader.arrival("start") is not None, timeout_s, interval_s=0.05):
            raise SystemExit(f"{engine.name} ({tag}): no output within {timeout_s:.0f} s of the start")
        sent: dict[str, tuple[float, int]] = {}
        began = time.time()
        tick = 0.01
        next_probe = began
        n = 0
        cpu_window: tuple[Any, float, float, float, float, int] | None = None
        while (now := time.time()) < began + warmup_s + duration_s:
            if cpu_window is None and now >= began + warmup_s:
                # the CPU window is the counted part: every engine's JIT and caches warmed at the same rate
                timelines_before = timelines.thread_cpu_s if timelines is not None else 0.0
                cpu_window = (processes.sample(), time.thread_time(), reader.thread_cpu_s, timelines_before, now, n + len(sent))
            due = int((now - began) * rate) - n
            for _ in range(max(0, due)):
                sentence = " ".join(rng.choice(vocabulary) for _ in range(6))
                producer.produce(input_topic, json.dumps({"sentence": sentence}).encode(), partition=n % PARTITIONS)
                n += 1
            if now >= next_probe:
                word, partition = f"probe{len(sent):06d}", len(sent) % PARTITIONS
                value = json.dumps({"sentence": word}).encode()
                producer.produce(input_topic, value, partition=partition, on_delivery=delivered)
                sent[word] = (time.time(), partition)
                producer.poll(0)
                next_probe += 1.0 / probe_rate
            producer.poll(0)
            time.sleep(tick)
        producer.flush(30)
        assert cpu_window is not None
        cpu_before, main_before, reader_before, timelines_before, window_start, sent_before = cpu_window
        result.load_s, result.sentences = time.time() - window_start, n + len(sent) - sent_before
        harness_s = time.thread_time() - main_before + reader.thread_cpu_s - reader_before
        if timelines is not None:
            harness_s += timelines.thread_cpu_s - timelines_before
        result.cpu = cpu_use(engine.cpu_parts, cpu_before, processes.sample(), harness_s)
        wait_until(lambda: all(reader.arrival(w) is not None for w in sent), timeout_s, interval_s=0.1)
        counted: list[tuple[float, int, int | None, Seen]] = []
        for word, (at, partition) in sent.items():
            if at - began < warmup_s:
                continue
            arrived = reader.arrival(word)
            if arrived is None:
                result.lost += 1
            else:
                result.probes_ms.append((arrived.at - at) * 1000.0)
                counted.append((at, partition, offsets.get(word), arrived))
        if timelines is not None:
            timelines.stop()
            result.breakdown = breakdown(timelines, counted)
            result.breakdown.stage_lines = stage_lines(timelines, began + warmup_s, began + warmup_s + duration_s)
            result.breakdown.shuffle = "Kafka (repartition topic)" if timelines.kafka_shuffle else "files (Parquet partials)"
        return result
    finally:
        if timelines is not None:
            timelines.stop()
        engine.stop()
        reader.close()


# --- report ---------------------------------------------------------------------------------------


def report(
    spark: SparkSession, args: argparse.Namespace, throughput: list[Throughput], latency: list[Latency], loads: list[Any]
) -> None:
    names = ", ".join(r.engine for r in (throughput or latency))
    print()
    print(f"== Kafka -> word count -> Kafka: {names} ==")
    print_kafka_machine(spark, PARTITIONS, loads)
    print(
        f"settings: {SPARK_MASTER}, trigger processingTime {args.trigger:g} s (Spark engines), stream_ops opaque state; "
        f"Kafka Streams {KAFKA_VERSION} exactly_once_v2, commit.interval.ms {args.trigger * 1000:g}, "
        f"{args.kstreams_threads} stream threads, default record cache"
    )
    if throughput:
        print()
        plain = next((r for r in throughput if r.engine == "plain Spark"), None)
        print(
            f"{'throughput':<14}{'seconds':>9}{'words/s':>11}{'vs plain':>9}{'out msgs':>10}"
            f"{'CPU s':>8}{'CPU us/sent':>12}{'broker s':>9}{'ZK s':>6}{'harness s':>10}{'process s':>10}"
        )
        for t in throughput:
            ratio = f"{t.words_per_s / plain.words_per_s:.2f}x" if plain else "-"
            print(
                f"{t.engine:<14}{t.seconds:>9.2f}{t.words_per_s:>11,.0f}{ratio:>9}{t.output_messages:>10,}"
                f"{t.cpu.engine_s:>8.1f}{t.cpu.engine_s / t.sentences * 1e6:>12.0f}{t.cpu.broker_s:>9.1f}"
                f"{t.cpu.zookeeper_s:>6.1f}{t.cpu.harness_s:>10.1f}{t.cpu.process_s:>10.1f}"
            )
        print(
            f"  {args.sentences:,} sentences ({throughput[0].words:,} words) in the input topic before the start; timed "
            "from start()/submit until a read_committed consumer saw every final count; CPU over the same span"
        )
    if latency:
        print()
        print(
            f"{'latency':<14}{'rate/s':>8}{'probes':>8}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'lost':>6}"
            f"{'CPU s':>8}{'cores':>7}{'CPU us/sent':>12}{'broker':>8}{'ZK':>6}{'harness':>8}{'process':>8}"
        )
        for r in latency:
            worst = max(r.probes_ms) if r.probes_ms else float("nan")
            cpu = r.cpu or CpuUse(*[float("nan")] * 5)
            print(
                f"{r.engine:<14}{r.rate:>8,.0f}{len(r.probes_ms):>8}{r.pct(0.5):>9.0f}{r.pct(0.99):>9.0f}{worst:>9.0f}"
                f"{r.lost:>6}{cpu.engine_s:>8.1f}{cpu.engine_s / r.load_s:>7.2f}"
                f"{cpu.engine_s / max(r.sentences, 1) * 1e6:>12.0f}{cpu.broker_s / r.load_s:>8.2f}{cpu.zookeeper_s / r.load_s:>6.2f}"
                f"{cpu.harness_s / r.load_s:>8.2f}{cpu.process_s / r.load_s:>8.2f}"
            )
        print(
            f"  probe sentence (one new word) every {1 / args.probe_rate:g} s under {args.rate:g} sentences/s; latency = "
            f"produce -> its count read from the output topic; the first {args.warmup:g} s of probes not counted; "
            "CPU over the counted load (after the warm-up), cores = CPU s per second of it (broker, ZK, harness, process likewise)"
        )
    if throughput or latency:
        print(
            "  CPU s = the engine's processes, user + system, all threads, from /proc: plain Spark and stream_ops run "
            "in this process and its SparkSession, so theirs is this process's threads + the Spark JVM + the Python "
            "workers it starts, less the harness's Python threads (output reader loop, load loop, breakdown poller: "
            "'harness'); the harness's librdkafka threads (one read_committed consumer, the load producer) stay in: "
            "'process' in the Kafka Streams row (this process's threads less 'harness' while Kafka Streams runs: those "
            "threads and the idle rig) is the most that adds. Kafka Streams: its JVM only. The broker (all engines) and "
            "ZooKeeper (stream_ops' coordination) are apart; stream_ops' state topic and shuffle, and Kafka Streams' "
            "changelog and repartition topics, load the broker."
        )
    for r in latency:
        if r.breakdown is not None:
            report_breakdown(r)


def report_breakdown(r: Latency) -> None:
    """Where the probes' time went (:data:`PARTS`)."""
    b = r.breakdown
    assert b is not None
    missing = ", ".join(f"{n} {why}" for why, n in b.unattributed.items()) or "none"
    print()
    print(f"where the time goes, {r.engine} ({len(b.total)} probes followed; not followed: {missing}; shuffle: {b.shuffle})")
    print(f"{'part':<26}{'p50 ms':>8}{'p99 ms':>8}{'mean ms':>9}{'share':>7}  what")
    total_mean = _mean(b.total)
    for name, what in PARTS:
        values = b.parts[name]
        mean = _mean(values)
        print(f"{name:<26}{pct(values, 0.5):>8.0f}{pct(values, 0.99):>8.0f}{mean:>9.1f}{mean / total_mean:>7.0%}  {what}")
    print(f"{'total':<26}{pct(b.total, 0.5):>8.0f}{pct(b.total, 0.99):>8.0f}{total_mean:>9.1f}{1:>7.0%}  produce -> count read")
    print("  p50/p99 per part over the probes, each on its own (they do not add up; the means do)")
    for line in b.stage_lines:
        print(f"  {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20k sentences, 15 s of probes after 3 s (unless given)")
    parser.add_argument("--sentences", type=int, default=None, help="input sentences of the throughput runs (~6 words); 200k")
    parser.add_argument("--vocabulary", type=int, default=1_000, help="distinct words")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--trigger", type=float, default=0.2, help="processingTime trigger in seconds, both engines")
    parser.add_argument("--rate", type=float, default=2_000, help="sentences/s of the latency runs")
    parser.add_argument("--probe-rate", type=float, default=5.0, help="probes/s of the latency runs")
    parser.add_argument("--duration", type=float, default=None, help="seconds of counted probes per engine; 60")
    parser.add_argument(
        "--warmup",
        type=float,
        default=None,
        help="seconds of probes not counted (nor their CPU: the warm-up at the target rate); 60",
    )
    parser.add_argument("--skip", nargs="*", choices=["throughput", "latency"], default=[], help="parts to leave out")
    parser.add_argument(
        "--engines",
        nargs="+",
        choices=list(ENGINE_OPTIONS.values()),
        default=list(ENGINE_OPTIONS.values()),
        help="engines to run (kafka-streams is built with Maven on first use)",
    )
    parser.add_argument("--kstreams-threads", type=int, default=2, help="Kafka Streams' num.stream.threads (local[2]: 2)")
    parser.add_argument("--timeout", type=float, default=600.0, help="per run, seconds")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    classpath: list[Path] | None = None
    if "kafka-streams" in args.engines:
        try:
            classpath = build()
        except PeerBuildError as e:
            print(f"Kafka Streams skipped: {e}", flush=True)
    loads = [os.getloadavg()]
    with (
        BenchRig("kafka", app_name="bench-kafka", keep=args.keep, kafka_connector=True, log_level="ERROR") as rig,
        kafka_broker(rig) as kafka,
    ):
        peer: KafkaStreamsPeer | None = None
        try:
            worker = rig.start_worker(ClusterConfig(root=rig.work / "cluster"), trigger_s=args.trigger, max_files=100)
            processes = kafka_processes(rig, kafka)
            engines = [plain_spark(rig.spark, kafka, rig.work, args.trigger), stream_ops_engine(rig, worker, kafka)]
            if classpath is not None:
                peer = KafkaStreamsPeer(
                    classpath,
                    kafka.bootstrap_servers,
                    threads=args.kstreams_threads,
                    commit_interval_s=args.trigger,
                    work=rig.work / "kafka-streams",
                )
                peer.launch()
                processes.kafka_streams = peer.pid
                engines.append(kafka_streams_engine(peer))
            engines = [e for e in engines if ENGINE_OPTIONS[e.name] in args.engines]
            sentences = make_sentences(args.sentences, args.vocabulary, args.seed)
            expected = dict(collections.Counter(w for s in sentences for w in s.split(" ")))
            warm = make_sentences(2_000, args.vocabulary, args.seed + 1)
            warm_expected = dict(collections.Counter(w for s in warm for w in s.split(" ")))
            throughput: list[Throughput] = []
            latency: list[Latency] = []
            for i, engine in enumerate(engines):
                run_throughput(engine, kafka, processes, warm, warm_expected, f"warm{i}", args.timeout)  # JIT, Python workers
                if "throughput" not in args.skip:
                    result = run_throughput(engine, kafka, processes, sentences, expected, f"tp{i}", args.timeout)
                    print(f"{engine.name}: {result.seconds:.2f} s, {result.cpu.engine_s:.1f} CPU s, counts verified", flush=True)
                    throughput.append(result)
                if "latency" not in args.skip:
                    vocabulary = sorted(warm_expected)
                    lat = run_latency(
                        engine,
                        kafka,
                        processes,
                        vocabulary,
                        f"lat{i}",
                        rate=args.rate,
                        probe_rate=args.probe_rate,
                        duration_s=args.duration,
                        warmup_s=args.warmup,
                        timeout_s=args.timeout,
                    )
                    print(f"{engine.name}: latency p50 {lat.pct(0.5):.0f} ms over {len(lat.probes_ms)} probes", flush=True)
                    latency.append(lat)
            loads.append(os.getloadavg())
            report(rig.spark, args, throughput, latency, loads)
        finally:
            if peer is not None:
                peer.close()


if __name__ == "__main__":
    main()
