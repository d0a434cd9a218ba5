"""Kafka -> word count -> Kafka: plain Spark Structured Streaming vs a stream_ops topology, on a
real single-node broker, in one process.

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

**Throughput.** From the engine's start (``start()`` / ``submit``) until a consumer of the
output topic (``read_committed``) has seen, for every word, its final count. Both outputs are
checked against ``collections.Counter`` over the sentences.

**Latency.** Then each engine gets a steady load (``--rate`` sentences/s on a fresh input
topic) with a probe sentence of one unique word every ``1/--probe-rate`` s; a probe's latency is
the time from its produce call until its word's count 1 is read from the output topic (the
same clock: producer and consumer run in this process). p50/p99 over the probes. The first
``--warmup`` s of probes are not counted.

It prints figures only (no speed asserts).

Run: ``.venv/bin/python bench/kafka.py [--sentences 200000] [--rate 2000] [--duration 30]``
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import platform
import random
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyspark
from confluent_kafka import Consumer, Producer, TopicPartition
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from stream_ops import Count, OpaqueMapState, Topology
from stream_ops.config import ClusterConfig
from stream_ops.kafka.client import client_config
from stream_ops.kafka.embedded import EmbeddedKafka
from stream_ops.kafka.producing import produce_json
from stream_ops.nimbus import kill, submit
from stream_ops.sources import KafkaTopic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import SPARK_MASTER, BenchRig, WorkerThread, wait_until  # the benchmarks' shared rig
from wordcount import make_sentences  # the word count's input

PARTITIONS = 2


# --- reading the output ------------------------------------------------------------------------


class CountsReader:
    """Reads an output topic (``read_committed``) on a thread: the latest count per word, and
    when each word was first seen (the probes' arrival times)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.latest: dict[str, int] = {}
        self.first_seen: dict[str, float] = {}
        self.messages = 0
        settings = {"group.id": f"bench-{topic}", "isolation.level": "read_committed", "enable.auto.commit": False}
        self._consumer = Consumer(client_config(bootstrap, **settings, **{"fetch.wait.max.ms": 10}))
        self._consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"read-{topic}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for message in self._consumer.consume(10_000, timeout=0.05):
                if message.error() is not None or message.key() is None:
                    continue
                now = time.monotonic()
                word = message.key().decode("utf-8")
                count = _count_of(message.value())
                with self._lock:
                    self.messages += 1
                    self.latest[word] = count
                    self.first_seen.setdefault(word, now)

    def matches(self, expected: dict[str, int]) -> bool:
        with self._lock:
            return len(self.latest) >= len(expected) and all(self.latest.get(w) == n for w, n in expected.items())

    def arrival(self, word: str) -> float | None:
        with self._lock:
            return self.first_seen.get(word)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()


def _count_of(value: bytes) -> int:
    """The count in an output value: ``{"count": n}`` (stream_ops) or ``n`` (plain Spark)."""
    decoded = json.loads(value)
    return int(decoded["count"]) if isinstance(decoded, dict) else int(decoded)


# --- the two engines ---------------------------------------------------------------------------


@dataclass
class Engine:
    """Starting and stopping one engine on an input topic, writing to an output topic."""

    name: str
    start: Callable[[str, str], None]
    stop: Callable[[], None]


def plain_spark(spark: SparkSession, kafka: EmbeddedKafka, work: Path, trigger_s: float) -> Engine:
    """Plain Structured Streaming: Kafka in, count by word, Kafka out."""
    queries: list[Any] = []

    def start(input_topic: str, output_topic: str) -> None:
        sentences = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
            .option("subscribe", input_topic)
            .option("startingOffsets", "earliest")
            .load()
            .select(F.from_json(F.col("value").cast("string"), "sentence STRING").alias("v"))
        )
        counts = sentences.select(F.explode(F.split("v.sentence", " ")).alias("word")).groupBy("word").count()
        out = counts.select(F.col("word").alias("key"), F.col("count").cast("string").alias("value"))
        query = (
            out.writeStream.format("kafka")
            .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
            .option("topic", output_topic)
            .option("checkpointLocation", str(work / "plain-checkpoints" / output_topic))
            .outputMode("update")
            .trigger(processingTime=f"{trigger_s} seconds")
            .start()
        )
        queries.append(query)

    def stop() -> None:
        for query in queries:
            query.stop()
        queries.clear()

    return Engine("plain Spark", start, stop)


def stream_ops_engine(rig: BenchRig, worker: WorkerThread, kafka: EmbeddedKafka) -> Engine:
    """The stream_ops topology: KafkaTopic -> split -> persistent count -> new_values -> to_kafka."""
    running: list[str] = []

    def start(input_topic: str, output_topic: str) -> None:
        name = f"kwc-{output_topic}"
        t = Topology(name)
        source = KafkaTopic(kafka.bootstrap_servers, input_topic, partitions=PARTITIONS)
        words = t.source("sentences", source, schema={"sentence": "string"}).select_expr("explode(split(sentence, ' ')) AS word")
        counts = words.group_by("word").persistent_aggregate(Count(), out="count", state=OpaqueMapState)
        counts.new_values().to_kafka(kafka.bootstrap_servers, output_topic, key="word")
        submit(rig.store, worker.cluster, t, workers=1)
        running.append(name)

    def stop() -> None:
        for name in running:
            kill(rig.store, name, wait_s=1.0, sleep=lambda _: wait_until(lambda: not worker.worker.running_tasks, 60))
        running.clear()

    return Engine("stream_ops", start, stop)


# --- runs ----------------------------------------------------------------------------------------


@dataclass
class Throughput:
    engine: str
    seconds: float
    words: int
    output_messages: int

    @property
    def words_per_s(self) -> float:
        return self.words / self.seconds


@dataclass
class Latency:
    engine: str
    rate: float
    probes_ms: list[float] = field(default_factory=list)
    lost: int = 0

    def pct(self, q: float) -> float:
        ordered = sorted(self.probes_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def run_throughput(
    engine: Engine, kafka: EmbeddedKafka, sentences: Sequence[str], expected: dict[str, int], tag: str, timeout_s: float
) -> Throughput:
    input_topic, output_topic = f"in-{tag}", f"out-{tag}"
    kafka.create_topic(input_topic, PARTITIONS)
    kafka.create_topic(output_topic, PARTITIONS)
    produce_json(kafka.bootstrap_servers, input_topic, ({"sentence": s} for s in sentences), partitions=PARTITIONS)
    reader = CountsReader(kafka.bootstrap_servers, output_topic)
    try:
        started = time.monotonic()
        engine.start(input_topic, output_topic)
        if not wait_until(lambda: reader.matches(expected), timeout_s, interval_s=0.05):
            wrong = {w: (reader.latest.get(w), n) for w, n in expected.items() if reader.latest.get(w) != n}
            raise SystemExit(
                f"{engine.name} ({tag}): counts did not reach the ground truth in {timeout_s:.0f} s: {len(wrong)} differ"
            )
        seconds = time.monotonic() - started
        return Throughput(engine.name, seconds, sum(expected.values()), reader.messages)
    finally:
        engine.stop()
        reader.close()


def run_latency(
    engine: Engine,
    kafka: EmbeddedKafka,
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
    try:
        engine.start(input_topic, output_topic)
        # the first records start the tasks; the load begins when the first count comes out
        producer.produce(input_topic, json.dumps({"sentence": "start"}).encode(), partition=0)
        producer.produce(input_topic, json.dumps({"sentence": "start"}).encode(), partition=1)
        producer.flush(10)
        if not wait_until(lambda: reader.arrival("start") is not None, timeout_s, interval_s=0.05):
            raise SystemExit(f"{engine.name} ({tag}): no output within {timeout_s:.0f} s of the start")
        sent: dict[str, float] = {}
        began = time.monotonic()
        tick = 0.01
        next_probe = began
        n = 0
        while (now := time.monotonic()) < began + warmup_s + duration_s:
            due = int((now - began) * rate) - n
            for _ in range(max(0, due)):
                sentence = " ".join(rng.choice(vocabulary) for _ in range(6))
                producer.produce(input_topic, json.dumps({"sentence": sentence}).encode(), partition=n % PARTITIONS)
                n += 1
            if now >= next_probe:
                word = f"probe{len(sent):06d}"
                producer.produce(input_topic, json.dumps({"sentence": word}).encode(), partition=len(sent) % PARTITIONS)
                producer.poll(0)
                sent[word] = time.monotonic()
                next_probe += 1.0 / probe_rate
            producer.poll(0)
            time.sleep(tick)
        producer.flush(30)
        wait_until(lambda: all(reader.arrival(w) is not None for w in sent), timeout_s, interval_s=0.1)
        for word, at in sent.items():
            if at - began < warmup_s:
                continue
            arrived = reader.arrival(word)
            if arrived is None:
                result.lost += 1
            else:
                result.probes_ms.append((arrived - at) * 1000.0)
        return result
    finally:
        engine.stop()
        reader.close()


# --- report ---------------------------------------------------------------------------------------


def _loads(values: Sequence[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def report(
    spark: SparkSession, args: argparse.Namespace, throughput: list[Throughput], latency: list[Latency], loads: list[Any]
) -> None:
    java = spark.sparkContext._jvm.System.getProperty("java.version")  # type: ignore[union-attr]
    print()
    print("== Kafka -> word count -> Kafka: plain Spark Structured Streaming vs stream_ops ==")
    print(
        f"machine:  {os.cpu_count()} cpus, {platform.platform()}, Python {platform.python_version()}, pyspark "
        f"{pyspark.__version__}, Java {java}; Kafka broker embedded (KRaft, 1 node), {PARTITIONS} partitions per topic"
    )
    print(f"load:     1/5/15-min load average {_loads(loads[0])} at the start, {_loads(loads[-1])} at the end")
    print(f"settings: {SPARK_MASTER}, trigger processingTime {args.trigger:g} s (both engines), stream_ops opaque state")
    print()
    plain = next((r for r in throughput if r.engine == "plain Spark"), None)
    print(f"{'throughput':<14}{'seconds':>9}{'words/s':>12}{'vs plain':>10}{'out msgs':>10}")
    for r in throughput:
        ratio = f"{r.words_per_s / plain.words_per_s:.2f}x" if plain else "-"
        print(f"{r.engine:<14}{r.seconds:>9.2f}{r.words_per_s:>12,.0f}{ratio:>10}{r.output_messages:>10,}")
    print(
        f"  {args.sentences:,} sentences ({throughput[0].words:,} words) in the input topic before the start; timed "
        "from start()/submit until a read_committed consumer saw every final count"
    )
    print()
    print(f"{'latency':<14}{'rate/s':>8}{'probes':>8}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'lost':>6}")
    for r in latency:
        worst = max(r.probes_ms) if r.probes_ms else float("nan")
        print(f"{r.engine:<14}{r.rate:>8,.0f}{len(r.probes_ms):>8}{r.pct(0.5):>9.0f}{r.pct(0.99):>9.0f}{worst:>9.0f}{r.lost:>6}")
    print(
        f"  probe sentence (one new word) every {1 / args.probe_rate:g} s under {args.rate:g} sentences/s; latency = "
        f"produce -> its count read from the output topic; the first {args.warmup:g} s of probes not counted"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=200_000, help="input sentences of the throughput runs (~6 words)")
    parser.add_argument("--vocabulary", type=int, default=1_000, help="distinct words")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--trigger", type=float, default=0.2, help="processingTime trigger in seconds, both engines")
    parser.add_argument("--rate", type=float, default=2_000, help="sentences/s of the latency runs")
    parser.add_argument("--probe-rate", type=float, default=5.0, help="probes/s of the latency runs")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of counted probes per engine")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds of probes not counted")
    parser.add_argument("--skip", nargs="*", choices=["throughput", "latency"], default=[], help="parts to leave out")
    parser.add_argument("--timeout", type=float, default=600.0, help="per run, seconds")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    loads = [os.getloadavg()]
    with BenchRig("kafka", app_name="bench-kafka", keep=args.keep, kafka_connector=True, log_level="ERROR") as rig:
        kafka = EmbeddedKafka(rig.work / "kafka")
        kafka.start()
        try:
            print(f"Kafka ready on {kafka.bootstrap_servers} in {kafka.started_in_s:.1f} s", flush=True)
            worker = rig.start_worker(ClusterConfig(root=rig.work / "cluster"), trigger_s=args.trigger, max_files=100)
            engines = [plain_spark(rig.spark, kafka, rig.work, args.trigger), stream_ops_engine(rig, worker, kafka)]
            sentences = make_sentences(args.sentences, args.vocabulary, args.seed)
            expected = dict(collections.Counter(w for s in sentences for w in s.split(" ")))
            warm = make_sentences(2_000, args.vocabulary, args.seed + 1)
            warm_expected = dict(collections.Counter(w for s in warm for w in s.split(" ")))
            throughput: list[Throughput] = []
            latency: list[Latency] = []
            for i, engine in enumerate(engines):
                run_throughput(engine, kafka, warm, warm_expected, f"warm{i}", args.timeout)  # JIT, Python workers
                if "throughput" not in args.skip:
                    result = run_throughput(engine, kafka, sentences, expected, f"tp{i}", args.timeout)
                    print(f"{engine.name}: {result.seconds:.2f} s, counts verified", flush=True)
                    throughput.append(result)
                if "latency" not in args.skip:
                    vocabulary = sorted(warm_expected)
                    lat = run_latency(
                        engine,
                        kafka,
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
            kafka.stop()


if __name__ == "__main__":
    main()
