"""One engine's start-up, run in a fresh Python process by ``bench/wordcount.py --startup``.

``python bench/startup_child.py plain|stream_ops --input DIR --expected FILE --work DIR ...`` runs
one word count from this process's start to the first exact result and prints, as its last
line, one JSON object: ``{"events": [[unix_time, where, what], ...]}``. The parent takes the
time just before it started this process as zero and builds the breakdown from the events.

Only the standard library is imported before the first event, so the engine's imports are timed
(``imports``), and nothing either engine does not need is imported at all.

* ``plain``: plain Spark as a user writes it: a SparkSession (``local[2]``, the settings
  ``create_spark_session`` gives stream_ops: one shuffle partition, no UI), a file-source query
  over the input's queue directories, ``split`` + ``explode`` + ``groupBy(word).count()`` in
  update mode, ``foreachBatch`` collecting the counts to the driver; done when the collected
  counts equal the ground truth.
* ``stream_ops``: what ``stream-ops demo`` runs, with one worker: a :class:`LocalStack`
  (embedded ZooKeeper, one ``stream-ops worker`` process, the nimbus), ``submit`` of the word
  count (``build_wordcount``, split by Spark SQL, opaque state) on the input, then the state
  query until it answers the ground truth for every word (``wait_for_counts``, the demo's
  wait). The worker's own log lines (its SparkSession, registration, each task's start) and
  the first commit of each task (a ZooKeeper watch on its transactional node) are events too.
"""

from __future__ import annotations

import time

STARTED = time.time()  # the first thing this process does after the interpreter starts

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

EVENTS: list[tuple[float, str, str]] = [(STARTED, "bench", "interpreter up")]
_LOCK = threading.Lock()


def event(what: str, where: str = "bench", at: float | None = None) -> None:
    with _LOCK:
        EVENTS.append((time.time() if at is None else at, where, what))


class _Recorder(logging.Handler):
    """Every INFO record of stream_ops in this process becomes an event."""

    def emit(self, record: logging.LogRecord) -> None:
        event(record.getMessage(), "stack", record.created)


def run_plain(args: argparse.Namespace, expected: dict[str, int]) -> None:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import functions as F

    event("imports done (pyspark)")
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("startup-plain")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    event("SparkSession ready")
    counts: dict[str, int] = {}
    done = threading.Event()

    def collect(batch: DataFrame, batch_id: int) -> None:
        for row in batch.collect():
            counts[row["word"]] = int(row["count"])
        event(f"batch {batch_id} collected")
        if counts == expected:
            done.set()

    sentences = spark.readStream.option("maxFilesPerTrigger", 100).schema("sentence string").json(f"{args.input}/queue-*")
    words = sentences.select(F.explode(F.split("sentence", " ")).alias("word")).groupBy("word").count()
    query = (
        words.writeStream.outputMode("update")
        .foreachBatch(collect)
        .option("checkpointLocation", str(Path(args.work) / "checkpoint"))
        .trigger(processingTime=f"{args.trigger} seconds")
        .start()
    )
    event("query started")
    if not done.wait(args.timeout):
        raise SystemExit(f"plain Spark did not reach the ground truth in {args.timeout} s")
    event("first exact result")
    query.stop()
    spark.stop()


def _log_events(log: Path) -> None:
    """The worker's log lines as events (``%(asctime)s`` is local time, to the millisecond)."""
    for line in log.read_text(errors="replace").splitlines():
        try:
            stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            continue
        event(line[24:].split(": ", 1)[-1], "worker", stamp)


def run_stream_ops(args: argparse.Namespace, expected: dict[str, int]) -> None:
    from stream_ops.coordination.cluster_state import read_storm
    from stream_ops.coordination.paths import ZkPaths
    from stream_ops.coordination.store import ZkStore
    from stream_ops.examples.wordcount import build_wordcount
    from stream_ops.local_stack import LocalStack, wait_for_counts
    from stream_ops.nimbus import submit

    event("imports done (stream_ops)")
    recorder = _Recorder(logging.INFO)
    for name in ("stream_ops", "__main__"):
        logging.getLogger(name).addHandler(recorder)
        logging.getLogger(name).setLevel(logging.INFO)
    home = Path(args.work) / "home"
    worker_args = ["--trigger-seconds", str(args.trigger), "--spark-master", "local[2]"]
    with LocalStack(home=home, workers=1, worker_args=worker_args) as stack:
        event("local stack up (ZooKeeper, worker registered, nimbus)")
        worker = stack.worker_processes[0]
        with ZkStore.connect(stack.zk_config) as store:
            topology = build_wordcount(args.input, name="wc-startup", split_with="sql")
            topology_id = submit(store, stack.cluster, topology, workers=1)
            event("submitted")
            for task_id in range(read_storm(store, topology_id).num_tasks):
                _watch_first_commit(store, ZkPaths.transactional_task(topology_id, task_id), task_id)
            wait_for_counts(store, topology.name, "words", expected, timeout_s=args.timeout)
            event("first exact result")
        _log_events(worker.log)


def _watch_first_commit(store: Any, path: str, task_id: int) -> None:
    seen = threading.Event()

    def on_change(data: bytes | None, stat: Any) -> bool | None:
        if data is not None and json.loads(data).get("committed_txid", -1) >= 0 and not seen.is_set():
            seen.set()
            event(f"task {task_id} first commit", "zookeeper")
            return False
        return None

    store.client.DataWatch(path, on_change)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("engine", choices=["plain", "stream_ops"])
    parser.add_argument("--input", required=True)
    parser.add_argument("--expected", required=True, help="JSON file of the ground-truth counts")
    parser.add_argument("--work", required=True)
    parser.add_argument("--trigger", type=float, default=0.2)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    expected = json.loads(Path(args.expected).read_text())
    (run_plain if args.engine == "plain" else run_stream_ops)(args, expected)
    print(json.dumps({"events": sorted(EVENTS)}))


if __name__ == "__main__":
    main()
