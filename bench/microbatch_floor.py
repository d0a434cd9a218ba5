"""What a Spark micro-batch costs when it does nothing: the CPU floor of Spark's trigger loop
under the Kafka benchmark's load.

Spark Structured Streaming runs each query's micro-batches on a trigger; every batch asks the
source for its latest offsets, writes the offsets log, plans the batch (analysis, optimization,
physical planning of the query's plan), posts its SQL execution and progress events, runs the
sink and writes the commit log, whether or not the batch has work to do. ``bench/kafka.py``
compares CPU per record with Kafka Streams; this benchmark measures how much of that is the
trigger loop alone, so the comparison can be read: ``n`` queries on Spark's Kafka source (query
``i`` reads partition ``i mod 2`` of a topic under ``--rate`` sentences/s, as the Kafka
benchmark's input), each with a sink that does nothing with the batch:

* ``noop``: Spark's ``noop`` sink (the batch is planned and run in the JVM, rows dropped);
* ``foreachBatch``: a Python function that returns at once (the batch is planned, not run);
* ``stream_ops``: stream_ops' own sink (``io.streamops.spark.CallbackSink``, which stream_ops'
  tasks use) with a Python callback that returns at once.

CPU: the Spark JVM (with its Python workers) plus this process's threads, less the load
producer's Python thread (measured with ``time.thread_time``), from ``/proc``, over
``--duration`` s after ``--warmup`` s; the broker apart. Printed: cores, micro-batches per
second, CPU ms per micro-batch, and the same less the base (``0`` queries: the idle JVM, this
process and the load producer's client threads) per query. A stream_ops Kafka topology of S stages with P tasks each runs
S x P such queries (the Kafka benchmark's word count: 2 x 2).

It prints figures only.

Run: ``.venv/bin/python bench/microbatch_floor.py [--queries 1 4] [--sinks noop foreachBatch
stream_ops] [--rate 2000] [--trigger 0.2] [--warmup 10] [--duration 20]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Producer
from harness import BenchRig, Processes, kafka_broker, kafka_processes, print_kafka_machine
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from stream_ops.kafka.client import client_config
from stream_ops.spark.callback_sink import start_with_callback

PARTITIONS = 2
SINKS = ("noop", "foreachBatch", "stream_ops")


class Load:
    """``rate`` sentences/s of six random words into ``topic``'s partitions in turn, on a thread
    whose own CPU is measured (so it can be taken out of this process's)."""

    def __init__(self, bootstrap: str, topic: str, rate: float) -> None:
        self._producer = Producer(client_config(bootstrap, **{"linger.ms": 1}))
        self._topic = topic
        self._rate = rate
        self._stop = threading.Event()
        self.thread_cpu_s = 0.0
        self._thread = threading.Thread(target=self._run, name="load", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        started, rng, n = time.thread_time(), random.Random(7), 0
        words = [f"w{i:04d}" for i in range(1_000)]
        began = time.time()
        while not self._stop.is_set():
            due = int((time.time() - began) * self._rate) - n
            for _ in range(max(0, due)):
                value = json.dumps({"sentence": " ".join(rng.choice(words) for _ in range(6))}).encode()
                self._producer.produce(self._topic, value, partition=n % PARTITIONS)
                n += 1
            self._producer.poll(0)
            self.thread_cpu_s = time.thread_time() - started
            time.sleep(0.01)
        self._producer.flush(10)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


@dataclass
class Floor:
    sink: str
    queries: int
    seconds: float
    batches: int
    cpu_s: float

    @property
    def cores(self) -> float:
        return self.cpu_s / self.seconds

    @property
    def batches_per_s(self) -> float:
        return self.batches / self.seconds

    @property
    def ms_per_batch(self) -> float:
        return self.cpu_s / self.batches * 1000.0 if self.batches else float("nan")


def _source(spark: SparkSession, bootstrap: str, topic: str, partition: int) -> DataFrame:
    return (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("assign", json.dumps({topic: [partition]}))
        .option("startingOffsets", "latest")
        .load()
    )


def _start(spark: SparkSession, sink: str, frame: DataFrame, checkpoint: Path, trigger_s: float) -> StreamingQuery:
    writer = frame.writeStream.option("checkpointLocation", str(checkpoint)).trigger(processingTime=f"{trigger_s} seconds")
    if sink == "noop":
        return writer.format("noop").start()
    if sink == "foreachBatch":
        return writer.foreachBatch(lambda df, batch_id: None).start()
    return start_with_callback(spark, writer, lambda df, batch_id: None)


def _batch_id(query: StreamingQuery) -> int:
    progress = query.lastProgress
    return int(progress["batchId"]) if progress else -1


def run_floor(
    spark: SparkSession,
    processes: Processes,
    load: Load,
    bootstrap: str,
    topic: str,
    work: Path,
    *,
    sink: str,
    queries: int,
    trigger_s: float,
    warmup_s: float,
    duration_s: float,
) -> Floor:
    started = [
        _start(spark, sink, _source(spark, bootstrap, topic, i % PARTITIONS), work / f"{sink}-{queries}-{i}", trigger_s)
        for i in range(queries)
    ]
    try:
        time.sleep(warmup_s)
        before, load_before, ids_before = processes.sample(), load.thread_cpu_s, [_batch_id(q) for q in started]
        t0 = time.time()
        time.sleep(duration_s)
        after, load_after, ids_after = processes.sample(), load.thread_cpu_s, [_batch_id(q) for q in started]
        seconds = time.time() - t0
    finally:
        for q in started:
            q.stop()
    cpu_s = after["bench"] - before["bench"] - (load_after - load_before) + after["spark"] - before["spark"]
    return Floor(sink, queries, seconds, sum(a - b for a, b in zip(ids_after, ids_before, strict=True)), cpu_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, nargs="+", default=[0, 1, 4], help="queries running together (0: none, the base)")
    parser.add_argument("--sinks", nargs="+", choices=SINKS, default=list(SINKS))
    parser.add_argument("--rate", type=float, default=2_000, help="sentences/s into the topic")
    parser.add_argument("--trigger", type=float, default=0.2, help="processingTime trigger, seconds")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds before the CPU is counted")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds counted")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()

    with (
        BenchRig("floor", app_name="bench-microbatch-floor", keep=args.keep, kafka_connector=True) as rig,
        kafka_broker(rig) as kafka,
    ):
        processes = kafka_processes(rig, kafka)
        kafka.create_topic("floor-in", PARTITIONS)
        load = Load(kafka.bootstrap_servers, "floor-in", args.rate)
        load.start()
        loads = [os.getloadavg()]
        results: list[Floor] = []
        try:
            # one throwaway round: the JIT and the Python callback server warm up before any counts
            run_floor(rig.spark, processes, load, kafka.bootstrap_servers, "floor-in", rig.work, sink=args.sinks[0],
                      queries=1, trigger_s=args.trigger, warmup_s=args.warmup, duration_s=1.0)  # fmt: skip
            if 0 in args.queries:  # the rig under the load with no query: what every other row carries
                results.append(run_floor(rig.spark, processes, load, kafka.bootstrap_servers, "floor-in", rig.work,
                    sink="(none)", queries=0, trigger_s=args.trigger, warmup_s=args.warmup, duration_s=args.duration))  # fmt: skip
            for sink in args.sinks:
                for n in (n for n in args.queries if n > 0):
                    result = run_floor(
                        rig.spark,
                        processes,
                        load,
                        kafka.bootstrap_servers,
                        "floor-in",
                        rig.work,
                        sink=sink,
                        queries=n,
                        trigger_s=args.trigger,
                        warmup_s=args.warmup,
                        duration_s=args.duration,
                    )
                    print(f"{sink} x{n}: {result.cores:.2f} cores", flush=True)
                    results.append(result)
        finally:
            load.stop()
        loads.append(os.getloadavg())
        print()
        print("== Spark micro-batches that do nothing: the trigger loop's CPU ==")
        print_kafka_machine(rig.spark, PARTITIONS, loads)
        print(
            f"settings: trigger processingTime {args.trigger:g} s, Spark's Kafka source (one partition per query, "
            f"{args.rate:g} sentences/s into the topic), stream_ops' session defaults"
        )
        base = next((r.cores for r in results if r.queries == 0), 0.0)
        print(f"{'sink':<14}{'queries':>8}{'batches/s':>11}{'cores':>8}{'CPU ms/batch':>14}{'above base ms/batch':>21}")
        for r in results:
            above = (r.cores - base) * 1000.0 / r.batches_per_s if r.batches else float("nan")
            print(f"{r.sink:<14}{r.queries:>8}{r.batches_per_s:>11.1f}{r.cores:>8.2f}{r.ms_per_batch:>14.1f}{above:>21.1f}")
        print(
            f"  CPU over {args.duration:g} s after {args.warmup:g} s: the Spark JVM + this process, less the load "
            "producer's thread; the broker not counted"
        )


if __name__ == "__main__":
    main()
