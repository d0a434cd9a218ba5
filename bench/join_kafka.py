"""Kafka impressions + Kafka clicks -> an event-time windowed join -> Kafka: stream_ops' JoinBolt vs
plain Spark's stream-stream join, on a real single-node broker, in one process.

The rig of ``bench/kafka.py``: an embedded Kafka broker (KRaft), an embedded ZooKeeper, one
SparkSession (``local[2]``, Spark's Kafka connector) and, for stream_ops, a Worker on a thread
sharing it. Each engine reads its own copy of the same two input topics (``--partitions`` each,
filled before it starts) and writes the joined rows to its own output topic.

**Data.** ``--impressions`` impressions ``{imp_id, ad, ts}`` and ``--clicks`` clicks
``{click_id, ad, ts}``, ``ad`` drawn uniformly from ``--ads`` ads, event times ``ts`` (seconds
since the epoch, a double) uniform over ``--span`` seconds, each topic written in event-time
order except for a jitter below ``--jitter`` seconds (so below the lag: no record is late in
either engine), round-robin over the partitions. Then on every partition of both topics one
*closing* record whose event time is past the last window's end plus the lag, with an ad of its
own (it joins nothing): it moves stream_ops' watermark, which is the minimum over its upstream
tasks (Flink's rule), past every window.

**Semantics, the same in both engines.** Inner join of a click with every impression of the same
ad in the same tumbling event-time window of ``--window`` seconds, windows aligned to the epoch
(``[k*W, (k+1)*W)``), a lag (Spark: watermark delay) of ``--lag`` seconds on both sides; output
rows ``{ad, click_id, imp_id}`` keyed by ``click_id``:

* stream_ops: two ``KafkaTopic`` sources -> ``topology.join(JoinBolt("impressions", "ad")
  .join("clicks", "ad", "impressions").select("ad, clicks:click_id as click_id,
  impressions:imp_id as imp_id").with_tumbling_window(seconds=W).with_timestamp_field("ts")
  .with_lag(lag))`` -> ``to_kafka(key="click_id")``: the join stage's window buffer is task state
  (exactly once under replay), a window's rows come out when the watermark passes its end, every
  batch one Kafka transaction.
* plain Spark: both sides ``withWatermark("t", "<lag> seconds")`` on ``t =
  timestamp_seconds(ts)``, ``window(t, "<W> seconds")`` on each, ``join`` on ad and window
  equality (the event-time-window join of Spark's guide, its state dropped by the watermarks),
  ``writeStream.format("kafka")`` in append mode, checkpointed. A pair comes out as soon as both
  sides are in (an inner join need not wait for the window's end). At-least-once on the Kafka
  side (no transactions in Spark's Kafka sink).

The output of both is checked row for row (as a multiset: a duplicate fails) against a Python
join of the same records (group by (ad, window), pair every click with every impression).

**Throughput.** From the engine's start (``start()`` / ``submit``) until a ``read_committed``
consumer of the output topic has seen every expected row; events/s = input records / seconds.
**CPU** as in ``bench/kafka.py`` (:class:`harness.Processes`): this process's threads + the Spark
JVM + its Python workers, less the reader's Python thread; the broker and ZooKeeper apart.

**Latency.** Then each engine gets a steady load (``--rate`` impressions/s, a quarter as many
clicks/s, on fresh topics) whose event time is the moment each record is produced, joined in
windows of ``--latency-window`` s with a lag of ``--latency-lag`` s. The two engines emit at
different moments by design: Spark's inner join emits a pair once both records are in (it need
not wait for the window's end), the JoinBolt a window's pairs once the watermark closes it. So
two figures per row: *e2e*, from its later record's produce call to the row read from the
output (what a consumer waits), and *emit*, from the moment the engine's semantics allow the row
(Spark: = e2e; the JoinBolt: the window's end + the lag, on the producer's clock) to the row
read, the engine's own delay. Counted from the engine's first row plus ``--warmup`` s, for
``--duration`` s; the rows of the windows still open at the end (closed by closing records) are
not counted. Every row is checked against the Python join there too.

It prints figures only (no speed asserts).

Run: ``.venv/bin/python bench/join_kafka.py [--quick] [--impressions 100000] [--clicks 25000]
[--rate 400] [--duration 30] [--engines plain stream_ops] [--skip latency]``; ``--quick`` is 20,000
impressions + 5,000 clicks and 15 s of latency load after 3 s (a few minutes).
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import math
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import Message, Producer
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from stream_ops import Topology
from stream_ops.config import ClusterConfig
from stream_ops.errors import KafkaServerError
from stream_ops.kafka.client import client_config
from stream_ops.kafka.embedded import EmbeddedKafka
from stream_ops.kafka.producing import produce_json
from stream_ops.operators import JoinBolt
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

T0 = 1_800_000_000.0
"""Event time of the first record (seconds since the epoch; a multiple of every window length used)."""
QUICK = {"impressions": 20_000, "clicks": 5_000, "span": 200.0, "duration": 15.0, "warmup": 3.0}
FULL = {"impressions": 100_000, "clicks": 25_000, "span": 1_000.0, "duration": 30.0, "warmup": 5.0}
IMPRESSION_SCHEMA = {"imp_id": "string", "ad": "string", "ts": "double"}
CLICK_SCHEMA = {"click_id": "string", "ad": "string", "ts": "double"}

Row = tuple[str, str, str]
"""An output row: (ad, click_id, imp_id)."""


# --- input and ground truth ------------------------------------------------------------------------


@dataclass(frozen=True)
class Inputs:
    """Both topics' records per partition, in the order they are written."""

    impressions: list[list[dict[str, Any]]]
    clicks: list[list[dict[str, Any]]]

    @property
    def records(self) -> int:
        return sum(len(p) for p in self.impressions) + sum(len(p) for p in self.clicks)


def _in_jittered_order(records: list[dict[str, Any]], jitter_s: float, rng: random.Random) -> list[dict[str, Any]]:
    """``records`` in event-time order, each moved by less than ``jitter_s`` of event time."""
    keyed = [(r["ts"] + rng.uniform(0.0, jitter_s), i, r) for i, r in enumerate(records)]
    return [r for _, _, r in sorted(keyed, key=lambda k: (k[0], k[1]))]


def make_inputs(args: argparse.Namespace) -> Inputs:
    """The records of the module doc, closing records included."""
    rng = random.Random(args.seed)
    ads = [f"ad{i:05d}" for i in range(args.ads)]

    def events(kind: str, count: int) -> list[dict[str, Any]]:
        out = [
            {f"{kind}_id": f"{kind[0]}{i:07d}", "ad": rng.choice(ads), "ts": round(T0 + rng.uniform(0, args.span), 3)}
            for i in range(count)
        ]
        return _in_jittered_order(out, args.jitter, rng)

    closing_ts = T0 + math.ceil(args.span / args.window + 1) * args.window + args.lag + 1.0
    topics = []
    for kind, count in (("imp", args.impressions), ("click", args.clicks)):
        records = events(kind, count)
        partitions = [records[p :: args.partitions] for p in range(args.partitions)]
        for p, records_p in enumerate(partitions):
            records_p.append({f"{kind}_id": f"close-{kind}-{p}", "ad": f"close-{kind}-{p}", "ts": closing_ts})
        topics.append(partitions)
    return Inputs(impressions=topics[0], clicks=topics[1])


def window_of(ts: float, window_s: float) -> int:
    """The index of the tumbling window ``[k*W, (k+1)*W)`` holding ``ts``."""
    return math.floor(ts / window_s)


def expected_rows(inputs: Inputs, window_s: float) -> collections.Counter[Row]:
    """The inner join of the module doc, from a dictionary of impressions by (ad, window)."""
    impressions: dict[tuple[str, int], list[str]] = collections.defaultdict(list)
    for partition in inputs.impressions:
        for r in partition:
            impressions[r["ad"], window_of(r["ts"], window_s)].append(r["imp_id"])
    rows: collections.Counter[Row] = collections.Counter()
    for partition in inputs.clicks:
        for c in partition:
            for imp_id in impressions.get((c["ad"], window_of(c["ts"], window_s)), []):
                rows[c["ad"], c["click_id"], imp_id] += 1
    return rows


# --- reading the output ------------------------------------------------------------------------


class RowsReader(OutputReader[Row]):
    """Reads an output topic (``read_committed``) on a thread: every row, as a multiset."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.rows: collections.Counter[Row] = collections.Counter()
        self.first_seen: dict[Row, float] = {}
        """Wall-clock time each row was first read."""
        super().__init__(bootstrap, topic, partitions)

    def _decode(self, message: Message) -> Row | None:
        value = message.value()
        if value is None:
            return None
        decoded = json.loads(value)
        return (str(decoded["ad"]), str(decoded["click_id"]), str(decoded["imp_id"]))

    def _take(self, decoded: Row, message: Message, now: float) -> None:
        self.rows[decoded] += 1
        self.first_seen.setdefault(decoded, now)

    def has_all(self, expected: collections.Counter[Row]) -> bool:
        with self._lock:
            return self.messages >= expected.total() and all(self.rows[r] >= n for r, n in expected.items())

    def arrival(self, row: Row) -> float | None:
        with self._lock:
            return self.first_seen.get(row)

    def snapshot(self) -> collections.Counter[Row]:
        with self._lock:
            return collections.Counter(self.rows)


# --- the two engines ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """The join's window and lag (Spark: watermark delay), seconds."""

    window_s: float
    lag_s: float


@dataclass
class Engine:
    """Starting and stopping one engine on (impressions, clicks, output) topics; ``cpu_parts``
    names its processes in :meth:`harness.Processes.sample`."""

    name: str
    start: Callable[[str, str, str, Shape], None]
    stop: Callable[[], None]
    cpu_parts: tuple[str, ...] = IN_PROCESS


def plain_spark(spark: SparkSession, kafka: EmbeddedKafka, work: Path, args: argparse.Namespace) -> Engine:
    """Plain Structured Streaming: both topics watermarked, windowed, joined on ad and window."""
    queries = SparkKafkaQueries(spark, kafka.bootstrap_servers, work / "plain-checkpoints", args.trigger)

    def side(topic: str, schema: dict[str, str], lag_s: float) -> DataFrame:
        ddl = ", ".join(f"{k} {v.upper()}" for k, v in schema.items())
        return (
            queries.read(topic)
            .select(F.from_json(F.col("value").cast("string"), ddl).alias("v"))
            .select("v.*")
            .withColumn("t", F.timestamp_seconds("ts"))
            .withWatermark("t", f"{lag_s:g} seconds")
        )

    def start(impressions_topic: str, clicks_topic: str, output_topic: str, shape: Shape) -> None:
        window = f"{shape.window_s:g} seconds"
        impressions = side(impressions_topic, IMPRESSION_SCHEMA, shape.lag_s).select(
            F.col("ad").alias("imp_ad"), "imp_id", F.window("t", window).alias("imp_window")
        )
        clicks = side(clicks_topic, CLICK_SCHEMA, shape.lag_s).select(
            "ad", "click_id", F.window("t", window).alias("click_window")
        )
        joined = clicks.join(
            impressions, (F.col("ad") == F.col("imp_ad")) & (F.col("click_window") == F.col("imp_window")), "inner"
        )
        out = joined.select(F.col("click_id").alias("key"), F.to_json(F.struct("ad", "click_id", "imp_id")).alias("value"))
        queries.write(out, output_topic, output_mode="append")

    return Engine("plain Spark", start, queries.stop)


def join_bolt(shape: Shape) -> JoinBolt:
    """The JoinBolt of the module doc."""
    return (
        JoinBolt("impressions", "ad")
        .join("clicks", "ad", "impressions")
        .select("ad, clicks:click_id as click_id, impressions:imp_id as imp_id")
        .with_tumbling_window(seconds=shape.window_s)
        .with_timestamp_field("ts")
        .with_lag(shape.lag_s)
    )


def stream_ops_engine(rig: BenchRig, worker: WorkerThread, kafka: EmbeddedKafka, args: argparse.Namespace) -> Engine:
    """The stream_ops topology: two KafkaTopic sources -> JoinBolt -> to_kafka."""
    topologies = Topologies(rig, worker)

    def start(impressions_topic: str, clicks_topic: str, output_topic: str, shape: Shape) -> None:
        t = Topology(f"join-{output_topic}")
        impressions = t.source(
            "impressions",
            KafkaTopic(kafka.bootstrap_servers, impressions_topic, partitions=args.partitions),
            schema=IMPRESSION_SCHEMA,
        )
        clicks = t.source(
            "clicks", KafkaTopic(kafka.bootstrap_servers, clicks_topic, partitions=args.partitions), schema=CLICK_SCHEMA
        )
        t.join(join_bolt(shape), impressions=impressions, clicks=clicks, name="ad-clicks").to_kafka(
            kafka.bootstrap_servers, output_topic, key="click_id"
        )
        topologies.submit(t)

    return Engine("stream_ops", start, topologies.kill_all)


# --- runs ----------------------------------------------------------------------------------------


@dataclass
class Throughput:
    engine: str
    seconds: float
    records: int
    rows: int
    cpu: CpuUse

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds


def dealt_round_robin(partitions: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The records of ``partitions`` in the order that deals record ``i`` to partition ``i %
    len(partitions)`` (as :func:`produce_json` does) so that each partition gets its own, in
    order: partition ``p`` holds the records ``p, p + n, p + 2n, ...`` of a round-robin deal, as
    :func:`make_inputs` splits them (its closing records, one a partition, included).

    Raises:
        ValueError: the partitions' lengths are not those of a round-robin deal.
    """
    n, total = len(partitions), sum(len(p) for p in partitions)
    if [len(p) for p in partitions] != [len(range(p, total, n)) for p in range(n)]:
        raise ValueError(f"partitions of {[len(p) for p in partitions]} records are not a round-robin deal")
    return [partitions[i % n][i // n] for i in range(total)]


def _produce(kafka: EmbeddedKafka, topic: str, partitions: list[list[dict[str, Any]]], timeout_s: float = 60.0) -> None:
    """Each partition's records, in order, to that partition of a new topic."""
    kafka.create_topic(topic, len(partitions))
    records = dealt_round_robin(partitions)
    try:
        produce_json(kafka.bootstrap_servers, topic, records, partitions=len(partitions), timeout_s=timeout_s)
    except KafkaServerError as e:
        raise SystemExit(str(e)) from e


def differences(seen: collections.Counter[Row], expected: collections.Counter[Row]) -> str:
    """What differs between the output and the ground truth, in words ("" when nothing)."""
    missing, extra = expected - seen, seen - expected
    if not missing and not extra:
        return ""
    return f"{missing.total()} rows missing (e.g. {list(missing)[:3]}), {extra.total()} extra (e.g. {list(extra)[:3]})"


def run_throughput(
    engine: Engine,
    kafka: EmbeddedKafka,
    processes: Processes,
    inputs: Inputs,
    expected: collections.Counter[Row],
    tag: str,
    *,
    shape: Shape,
    partitions: int,
    timeout_s: float,
    settle_s: float,
) -> Throughput:
    impressions_topic, clicks_topic, output_topic = f"imp-{tag}", f"click-{tag}", f"out-{tag}"
    _produce(kafka, impressions_topic, inputs.impressions)
    _produce(kafka, clicks_topic, inputs.clicks)
    kafka.create_topic(output_topic, partitions)
    reader = RowsReader(kafka.bootstrap_servers, output_topic, partitions)
    try:
        cpu_before, reader_before = processes.sample(), reader.thread_cpu_s
        started = time.monotonic()
        engine.start(impressions_topic, clicks_topic, output_topic, shape)
        done = wait_until(lambda: reader.has_all(expected), timeout_s, interval_s=0.05)
        seconds = time.monotonic() - started
        cpu = cpu_use(engine.cpu_parts, cpu_before, processes.sample(), reader.thread_cpu_s - reader_before)
        if done:
            time.sleep(settle_s)  # a duplicate or an extra row written after the last expected one
        wrong = differences(reader.snapshot(), expected)
        if wrong:
            raise SystemExit(f"{engine.name} ({tag}): the output is not the ground truth after {seconds:.0f} s: {wrong}")
        return Throughput(engine.name, seconds, inputs.records, expected.total(), cpu)
    finally:
        engine.stop()
        reader.close()


@dataclass
class Latency:
    """Per row of the latency run (rows whose later record was produced in the counted span)."""

    engine: str
    rate: float
    shape: Shape
    end_to_end_ms: list[float] = field(default_factory=list)
    """Its later record produced -> the row read."""
    emit_ms: list[float] = field(default_factory=list)
    """The moment the engine's semantics let it emit the row -> the row read: plain Spark's inner
    join when both records are in (= ``end_to_end_ms``); the JoinBolt when its window closes,
    at the window's end + the lag (event time = the producer's clock)."""
    cpu: CpuUse | None = None
    load_s: float = float("nan")
    records: int = 0


def run_latency(
    engine: Engine,
    kafka: EmbeddedKafka,
    processes: Processes,
    tag: str,
    *,
    shape: Shape,
    rate: float,
    ads: int,
    partitions: int,
    duration_s: float,
    warmup_s: float,
    timeout_s: float,
) -> Latency:
    """A steady load of ``rate`` impressions/s and ``rate / 4`` clicks/s whose event time is the
    time they are produced (this process's clock, as the reader's), for ``warmup_s +
    duration_s`` after the engine's first row; then closing records, and every row awaited and
    checked against the Python join."""
    impressions_topic, clicks_topic, output_topic = f"imp-{tag}", f"click-{tag}", f"out-{tag}"
    for topic in (impressions_topic, clicks_topic, output_topic):
        kafka.create_topic(topic, partitions)
    reader = RowsReader(kafka.bootstrap_servers, output_topic, partitions)
    producer = Producer(client_config(kafka.bootstrap_servers, **{"linger.ms": 1}))
    rng = random.Random(11)
    names = [f"ad{i:05d}" for i in range(ads)]
    sent: dict[str, list[list[dict[str, Any]]]] = {
        "imp": [[] for _ in range(partitions)],
        "click": [[] for _ in range(partitions)],
    }
    topics = {"imp": impressions_topic, "click": clicks_topic}
    result = Latency(engine.name, rate, shape)

    def send(kind: str, ad: str, partition: int, ts: float | None = None) -> None:
        number = sum(len(p) for p in sent[kind])
        record = {f"{kind}_id": f"{kind[0]}{number:07d}", "ad": ad, "ts": round(time.time(), 3) if ts is None else ts}
        producer.produce(topics[kind], json.dumps(record).encode(), partition=partition)
        sent[kind][partition].append(record)

    try:
        engine.start(impressions_topic, clicks_topic, output_topic, shape)
        send("imp", "start", 0)
        send("click", "start", 0)
        first = ("start", "c0000000", "i0000000")
        loaded = {"imp": 0, "click": 0}
        cpu_before: dict[str, float] | None = None
        main_before = reader_before = 0.0
        began = end = math.inf
        started = time.time()
        while time.time() < end:
            now = time.time()
            if cpu_before is None and reader.arrival(first) is not None:  # the engine is up: the clock starts
                cpu_before, main_before, reader_before = processes.sample(), time.thread_time(), reader.thread_cpu_s
                began, end = now, now + warmup_s + duration_s
            if now - started > timeout_s:
                raise SystemExit(f"{engine.name} ({tag}): no output within {timeout_s:.0f} s of the start")
            for kind, per_s in (("imp", rate), ("click", rate / 4)):
                for _ in range(max(0, int((now - started) * per_s) - loaded[kind])):
                    send(kind, rng.choice(names), loaded[kind] % partitions)
                    loaded[kind] += 1
            producer.poll(0)
            time.sleep(0.01)
        producer.flush(30)
        assert cpu_before is not None
        result.load_s = time.time() - began
        harness_s = time.thread_time() - main_before + reader.thread_cpu_s - reader_before
        result.cpu = cpu_use(engine.cpu_parts, cpu_before, processes.sample(), harness_s)
        closing = round(time.time(), 3) + shape.window_s + shape.lag_s + 1.0
        for kind in ("imp", "click"):
            for p in range(partitions):
                send(kind, f"close-{kind}-{p}", p, closing)
        producer.flush(30)
        inputs = Inputs(impressions=sent["imp"], clicks=sent["click"])
        result.records = inputs.records
        expected = expected_rows(inputs, shape.window_s)
        if not wait_until(lambda: reader.has_all(expected), timeout_s, interval_s=0.1):
            raise SystemExit(f"{engine.name} ({tag}): rows missing: {differences(reader.snapshot(), expected)}")
        wrong = differences(reader.snapshot(), expected)
        if wrong:
            raise SystemExit(f"{engine.name} ({tag}): the output is not the ground truth: {wrong}")
        times = {r[f"{kind}_id"]: r["ts"] for kind in ("imp", "click") for p in sent[kind] for r in p}
        for row in expected:
            later = max(times[row[1]], times[row[2]])
            window_close = (window_of(times[row[1]], shape.window_s) + 1) * shape.window_s + shape.lag_s
            if later < began + warmup_s or window_close > end:  # warm-up; windows the closing records closed
                continue
            seen = reader.arrival(row)
            assert seen is not None
            result.end_to_end_ms.append((seen - later) * 1000.0)
            emit_at = later if engine.name == "plain Spark" else window_close
            result.emit_ms.append((seen - emit_at) * 1000.0)
        return result
    finally:
        engine.stop()
        reader.close()


# --- report ---------------------------------------------------------------------------------------


def report(
    spark: SparkSession,
    args: argparse.Namespace,
    inputs: Inputs,
    results: list[Throughput],
    latency: list[Latency],
    loads: list[Any],
) -> None:
    print()
    print("== Kafka impressions + clicks -> event-time windowed join -> Kafka: plain Spark vs stream_ops' JoinBolt ==")
    print_kafka_machine(spark, args.partitions, loads)
    print(f"settings: {SPARK_MASTER}, trigger processingTime {args.trigger:g} s (both engines), inner join on ad")
    if results:
        report_throughput(args, inputs, results)
    if latency:
        report_latency(args, latency)
    print(
        "  CPU s = the engine's processes (user + system, /proc): this process's threads + the Spark JVM + its Python "
        "workers, less the harness's Python threads (output reader, load loop); the librdkafka threads of its consumer "
        "and load producer stay in. Broker and ZooKeeper apart."
    )


def report_throughput(args: argparse.Namespace, inputs: Inputs, results: list[Throughput]) -> None:
    plain = next((r for r in results if r.engine == "plain Spark"), None)
    print()
    print(
        f"{'throughput':<14}{'seconds':>9}{'events/s':>11}{'vs plain':>9}{'rows':>9}{'CPU s':>8}{'CPU us/ev':>11}"
        f"{'broker s':>9}{'ZK s':>6}"
    )
    for r in results:
        ratio = f"{r.records_per_s / plain.records_per_s:.2f}x" if plain else "-"
        print(
            f"{r.engine:<14}{r.seconds:>9.2f}{r.records_per_s:>11,.0f}{ratio:>9}{r.rows:>9,}{r.cpu.engine_s:>8.1f}"
            f"{r.cpu.engine_s / r.records * 1e6:>11.0f}{r.cpu.broker_s:>9.1f}{r.cpu.zookeeper_s:>6.1f}"
        )
    print(
        f"  tumbling event-time window {args.window:g} s, lag / watermark delay {args.lag:g} s; {inputs.records:,} input "
        f"records ({args.impressions:,} impressions + {args.clicks:,} clicks over {args.span:g} s of event time, "
        f"{args.ads:,} ads, jitter < {args.jitter:g} s, + {2 * args.partitions} closing records) in the topics before the "
        "start; timed from start()/submit until a read_committed consumer saw every expected row; every output equal to "
        "the Python join, row for row"
    )


def report_latency(args: argparse.Namespace, latency: list[Latency]) -> None:
    print()
    print(
        f"{'latency':<14}{'window':>7}{'lag':>5}{'events/s':>9}{'rows':>7}{'e2e p50':>9}{'e2e p99':>9}"
        f"{'emit p50':>9}{'emit p99':>9}{'cores':>7}{'broker':>7}{'ZK':>6}"
    )
    for r in latency:
        cpu = r.cpu or CpuUse(*[float("nan")] * 5)
        print(
            f"{r.engine:<14}{r.shape.window_s:>7g}{r.shape.lag_s:>5g}{r.rate * 1.25:>9,.0f}{len(r.end_to_end_ms):>7,}"
            f"{pct(r.end_to_end_ms, 0.5):>9.0f}{pct(r.end_to_end_ms, 0.99):>9.0f}{pct(r.emit_ms, 0.5):>9.0f}"
            f"{pct(r.emit_ms, 0.99):>9.0f}{cpu.engine_s / r.load_s:>7.2f}{cpu.broker_s / r.load_s:>7.2f}"
            f"{cpu.zookeeper_s / r.load_s:>6.2f}"
        )
    print(
        f"  ms; {args.rate:g} impressions/s + {args.rate / 4:g} clicks/s over {args.ads:,} ads, event time = produce time, "
        f"{args.duration:g} s counted after {args.warmup:g} s (from the engine's first row); e2e = the row's later "
        "record produced -> the row read; emit = from the moment the engine's semantics allow the row (Spark's inner "
        "join: both records in, so = e2e; the JoinBolt: its window closed, end + lag) -> read; every row checked "
        "against the Python join; cores = CPU s per second of the load"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20,000 impressions + 5,000 clicks over 200 s (unless given)")
    parser.add_argument("--impressions", type=int, default=None, help="impressions; 100,000")
    parser.add_argument("--clicks", type=int, default=None, help="clicks; 25,000")
    parser.add_argument("--span", type=float, default=None, help="seconds of event time the records cover; 1,000")
    parser.add_argument("--ads", type=int, default=500, help="distinct ads (the join key)")
    parser.add_argument("--window", type=float, default=10.0, help="tumbling event-time window, seconds")
    parser.add_argument("--lag", type=float, default=2.0, help="lag (JoinBolt) / watermark delay (Spark), seconds")
    parser.add_argument("--jitter", type=float, default=1.0, help="how far out of event-time order a record is written, < lag")
    parser.add_argument("--partitions", type=int, default=2, help="partitions of each topic")
    parser.add_argument("--trigger", type=float, default=0.2, help="processingTime trigger in seconds, both engines")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--engines", nargs="+", choices=["plain", "stream_ops"], default=["plain", "stream_ops"])
    parser.add_argument("--skip", nargs="*", choices=["throughput", "latency"], default=[], help="parts to leave out")
    parser.add_argument("--rate", type=float, default=400.0, help="impressions/s of the latency runs (clicks: a quarter)")
    parser.add_argument("--duration", type=float, default=None, help="seconds of counted latency load per engine; 30")
    parser.add_argument("--warmup", type=float, default=None, help="seconds of latency load not counted; 5")
    parser.add_argument("--latency-window", type=float, default=2.0, help="the latency runs' window, seconds")
    parser.add_argument("--latency-lag", type=float, default=0.5, help="the latency runs' lag / watermark delay, seconds")
    parser.add_argument("--timeout", type=float, default=600.0, help="per run, seconds")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds to wait for stray rows after the last expected one")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if not 0 <= args.jitter < args.lag:
        parser.error("--jitter must be below --lag (no record may be late)")

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    inputs = make_inputs(args)
    expected = expected_rows(inputs, args.window)
    warm_args = argparse.Namespace(**{**vars(args), "impressions": 2_000, "clicks": 500, "span": 40.0, "seed": args.seed + 1})
    warm = make_inputs(warm_args)
    warm_expected = expected_rows(warm, args.window)
    print(f"{inputs.records:,} input records, {expected.total():,} expected rows", flush=True)
    loads = [os.getloadavg()]
    with (
        BenchRig("join_kafka", app_name="bench-join-kafka", keep=args.keep, kafka_connector=True, log_level="ERROR") as rig,
        kafka_broker(rig) as kafka,
    ):
        worker = rig.start_worker(ClusterConfig(root=rig.work / "cluster"), trigger_s=args.trigger, max_files=100)
        processes = kafka_processes(rig, kafka)
        engines = [plain_spark(rig.spark, kafka, rig.work, args), stream_ops_engine(rig, worker, kafka, args)]
        engines = [e for e in engines if {"plain Spark": "plain", "stream_ops": "stream_ops"}[e.name] in args.engines]
        results: list[Throughput] = []
        latency: list[Latency] = []
        shape = Shape(args.window, args.lag)
        for i, engine in enumerate(engines):
            options = {"shape": shape, "partitions": args.partitions, "timeout_s": args.timeout, "settle_s": args.settle}
            run_throughput(engine, kafka, processes, warm, warm_expected, f"warm{i}", **options)  # JIT, Python workers
            if "throughput" not in args.skip:
                result = run_throughput(engine, kafka, processes, inputs, expected, f"tp{i}", **options)
                print(f"{engine.name}: {result.seconds:.2f} s, {result.cpu.engine_s:.1f} CPU s, rows verified", flush=True)
                results.append(result)
            if "latency" not in args.skip:
                lat = run_latency(
                    engine,
                    kafka,
                    processes,
                    f"lat{i}",
                    shape=Shape(args.latency_window, args.latency_lag),
                    rate=args.rate,
                    ads=args.ads,
                    partitions=args.partitions,
                    duration_s=args.duration,
                    warmup_s=args.warmup,
                    timeout_s=args.timeout,
                )
                print(f"{engine.name}: latency e2e p50 {pct(lat.end_to_end_ms, 0.5):.0f} ms, rows verified", flush=True)
                latency.append(lat)
        loads.append(os.getloadavg())
        report(rig.spark, args, inputs, results, latency, loads)


if __name__ == "__main__":
    main()
