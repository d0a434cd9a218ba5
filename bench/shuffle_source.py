"""A shuffle stage's per-batch cost as it ages: Spark's file source against the queue source.

A keyed stage reads the Parquet files its upstream tasks publish into its queue. Before, it
read them with Spark's file source, which lists the whole directory every trigger and keeps
every file it ever read in its metadata log (rewritten in full every ten batches); consumed
files could not be deleted. Now it reads with ``ShuffleQueueSource`` (offsets per upstream
task) and deletes what its committed batches read (:mod:`stream_ops.spark.shuffle_queue`).

Both run here on one SparkSession (``local[2]``), each on its own queue: two "upstream tasks"
publish one partials file each per round (as source tasks do after their commits), the query
runs the batch (its callback finds the batch's files as the task's does; the queue source's
also deletes the files batches before it read, as the task's I/O thread does), and
``processAllAvailable`` returns. Printed per window of rounds: Spark's time per batch
(``triggerExecution``, median) and its parts (``latestOffset``, ``walCommit``, ``addBatch``),
and at the end the files in the queue and the bytes of the checkpoint's source log.

``--durable`` fsyncs the published files and the consumed record as a cluster with ``fsync``
does (off by default, to time Spark's part alone). ``--gaps`` publishes into a two-queue
topic where each upstream task has rows for the read queue only every other txid (the other
txids write only the other queue), as a source task of small batches does: the reader then
proves each skipped txid empty from the file after it. ``--sources queue`` runs only the
queue source. Also printed: the callback's own time per batch (finding the batch's files and
retiring what batches before it read), median per ``--window`` batches (a round may run as two
batches when the query plans between the two upstream tasks' files). ``--sources callback``
times that callback alone, without Spark: each round's offsets are logged as Spark logs them,
then the callback runs (many rounds in seconds, so the file work of a batch is measured apart
from Spark's noise).

Run: ``.venv/bin/python bench/shuffle_source.py [--rounds 1000] [--window 200] [--durable] [--gaps] [--sources queue|callback]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyspark.sql import DataFrame, SparkSession

from stream_ops.hashing import encode_key
from stream_ops.helpers.spark_ddl import schema_ddl
from stream_ops.spark.checkpoint import batch_input_files
from stream_ops.spark.session import create_spark_session
from stream_ops.spark.shuffle_queue import batch_files, read_before, read_queue_stream, retire_read
from stream_ops.topics.file_topic import FileTopic
from stream_ops.topics.shuffle_files import PartialsShuffle

FIELDS = {"key": "string", "value": "bigint"}
UPSTREAM_TASKS = (0, 1)
KEYS = 50
STEPS = ("triggerExecution", "latestOffset", "walCommit", "addBatch")
CALLBACK_MS: list[float] = []
"""The queue source callback's own time per batch (files found, consumed files retired)."""


def publish_round(shuffle: PartialsShuffle, txid: int, *, gaps: bool = False) -> bool:
    """Each upstream task's partials for ``txid`` (``KEYS`` keys), staged then published: into
    queue 0, or with ``gaps`` into queue 1 on odd txids. Returns whether queue 0 got files."""
    keys = [encode_key([f"w{i}"]) for i in range(KEYS)]
    queue = 1 if gaps and txid % 2 else 0
    for task in UPSTREAM_TASKS:
        shuffle.stage_batch(queue, task, txid, 1, keys, [txid + 1] * KEYS)
        shuffle.publish_batch(task, txid, 1, shuffle.staged_sizes(task, txid, 1))
    return queue == 0


def file_source(spark: SparkSession, queue: Path, checkpoint: Path, topic: FileTopic) -> tuple[DataFrame, Callable[..., None]]:
    """The stream as the keyed stage read it before: Spark's file source over the Parquet files."""
    df = (
        spark.readStream.option("maxFilesPerTrigger", 100)
        .option("maxFileAge", "7d")
        .schema(schema_ddl(FIELDS))
        .option("pathGlobFilter", "*.parquet")
        .parquet(str(queue))
    )

    def on_batch(batch: DataFrame, batch_id: int) -> None:
        files = batch_input_files(checkpoint, batch_id)
        assert files, f"batch {batch_id} has no files"

    return df, on_batch


def queue_source(spark: SparkSession, queue: Path, checkpoint: Path, topic: FileTopic) -> tuple[DataFrame, Callable[..., None]]:
    """The stream as the keyed stage reads it now, with its files deleted once consumed."""
    df = read_queue_stream(spark, queue, FIELDS, suffix=".parquet", max_files_per_trigger=100)

    def on_batch(batch: DataFrame, batch_id: int) -> None:
        started = time.perf_counter()
        assert batch_files(checkpoint, batch_id, queue, ".parquet"), f"batch {batch_id} has no files"
        read = read_before(checkpoint, batch_id)
        if read:
            retire_read(topic, 0, read)
        CALLBACK_MS.append((time.perf_counter() - started) * 1000.0)

    return df, on_batch


def run_callback_only(work: Path, rounds: int, *, durable: bool = False, gaps: bool = False) -> list[float]:
    """The queue source's callback per batch without Spark: the offsets of each round's batch
    logged as Spark logs them (``offsets/<batch>``), then the batch's files found and what
    the batches before it read retired. Returns the callback's time per batch, in ms."""
    topic = FileTopic(work / "callback" / "shuffle", queues=2 if gaps else 1, durable=durable)
    topic.create()
    shuffle = PartialsShuffle(topic, "long")
    checkpoint = work / "callback" / "checkpoint"
    (checkpoint / "offsets").mkdir(parents=True)
    times: list[float] = []
    batch = 0
    for txid in range(rounds):
        if not publish_round(shuffle, txid, gaps=gaps):
            continue
        entry = json.dumps({"queueTxids": {str(task): txid for task in UPSTREAM_TASKS}})
        (checkpoint / "offsets" / str(batch)).write_text(f"v1\n{{}}\n{entry}\n")
        started = time.perf_counter()
        assert batch_files(checkpoint, batch, topic.queue_path(0), ".parquet"), f"batch {batch} has no files"
        read = read_before(checkpoint, batch)
        if read:
            retire_read(topic, 0, read)
        times.append((time.perf_counter() - started) * 1000.0)
        batch += 1
    return times


def run(
    spark: SparkSession,
    work: Path,
    name: str,
    make: Callable[..., Any],
    rounds: int,
    *,
    durable: bool = False,
    gaps: bool = False,
) -> list[dict[str, float]]:
    """Publish ``rounds`` rounds into a fresh queue read by ``make``'s stream; Spark's step times per batch."""
    topic = FileTopic(work / name / "shuffle", queues=2 if gaps else 1, durable=durable)
    topic.create()
    shuffle = PartialsShuffle(topic, "long")
    checkpoint = work / name / "checkpoint"
    df, on_batch = make(spark, topic.queue_path(0), checkpoint, topic)
    query = df.writeStream.queryName(f"bench-{name}").foreachBatch(on_batch).option("checkpointLocation", str(checkpoint)).start()
    steps: list[dict[str, float]] = []
    try:
        for txid in range(rounds):
            if not publish_round(shuffle, txid, gaps=gaps):
                continue  # nothing new in the read queue: no batch
            query.processAllAvailable()
            progress = query.lastProgress
            if progress and "addBatch" in (progress.get("durationMs") or {}):
                steps.append({step: float(progress["durationMs"].get(step, 0)) for step in STEPS})
    finally:
        query.stop()
    log = checkpoint / "sources" / "0"
    log_bytes = sum(p.stat().st_size for p in log.iterdir()) if log.is_dir() else 0
    newest = (
        max((p for p in log.iterdir() if p.name.endswith(".compact")), key=lambda p: p.stat().st_mtime, default=None)
        if log.is_dir()
        else None
    )
    print(
        f"{name}: {len(topic.files(0))} files left in the queue, source log {log_bytes / 1024:.0f} KiB"
        + (f" (newest compact file {newest.name}: {newest.stat().st_size / 1024:.0f} KiB)" if newest else "")
    )
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=1000, help="rounds of two published files each")
    parser.add_argument("--window", type=int, default=200, help="rounds per printed median")
    parser.add_argument("--durable", action="store_true", help="fsync published files and the consumed record")
    parser.add_argument("--gaps", action="store_true", help="upstream txids alternate between two queues")
    parser.add_argument("--sources", nargs="+", choices=["file", "queue", "callback"], default=["file", "queue"])
    args = parser.parse_args()
    options = {"durable": args.durable, "gaps": args.gaps}
    if args.sources == ["callback"]:
        work = Path(tempfile.mkdtemp(prefix="bench-shuffle-callback-"))
        try:
            times = run_callback_only(work, args.rounds, **options)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        quartiles = statistics.quantiles(times, n=4)
        print(
            f"callback alone, {args.rounds} rounds, {len(times)} batches, {options}: median {statistics.median(times):.3f} ms, "
            f"quartiles {quartiles[0]:.3f} / {quartiles[2]:.3f} ms; load average {os.getloadavg()}"
        )
        return
    work = Path(tempfile.mkdtemp(prefix="bench-shuffle-source-"))
    spark = create_spark_session(master="local[2]", app_name="bench-shuffle-source")
    spark.sparkContext.setLogLevel("ERROR")
    try:
        print(
            f"{args.rounds} rounds of {len(UPSTREAM_TASKS)} Parquet files ({KEYS} keys each), {options}; "
            f"load average {os.getloadavg()}"
        )
        chosen = [
            (n, m) for n, m in (("file source", file_source), ("queue source", queue_source)) if n.split()[0] in args.sources
        ]
        for name, make in chosen:
            run(spark, work, f"warm-up-{name.split()[0]}", make, 50, **options)
        CALLBACK_MS.clear()
        results = {}
        for name, make in chosen:
            started = time.perf_counter()
            results[name] = run(spark, work, name.replace(" ", "-"), make, args.rounds, **options)
            print(f"{name}: {args.rounds} rounds in {time.perf_counter() - started:.1f} s, {len(results[name])} batches")
        print(f"load average after: {os.getloadavg()}")
        print("\nSpark's time per batch, median ms (triggerExecution: latestOffset / walCommit / addBatch), per window of rounds")
        print(f"| rounds | {' | '.join(results)} |")
        print(f"|---|{'---|' * len(results)}")
        for start in range(0, args.rounds, args.window):
            cells = []
            for steps in results.values():
                window = steps[start : start + args.window]
                if not window:
                    cells.append("-")
                    continue
                med = {s: statistics.median(b[s] for b in window) for s in STEPS}
                cells.append(
                    f"{med['triggerExecution']:.0f} ({med['latestOffset']:.0f} / {med['walCommit']:.0f} / {med['addBatch']:.0f})"
                )
            print(f"| {start + 1}-{min(start + args.window, args.rounds)} | {' | '.join(cells)} |")
        if CALLBACK_MS:
            windows = [CALLBACK_MS[i : i + args.window] for i in range(0, len(CALLBACK_MS), args.window)]
            print(f"\nqueue source callback, median ms per {args.window} batches (files found + consumed retired): ", end="")
            print(" -> ".join(f"{statistics.median(w):.2f}" for w in windows if w))
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
