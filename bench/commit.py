"""The keyed commit path alone: milliseconds per batch at 1k and 100k keys, by step, no Spark.

One keyed task of the word count (``OpaqueMapState``) on an embedded ZooKeeper, driven the way
``TaskRunner.process_batch`` drives it after Spark's part: Spark's checkpoint entries of the batch
are read on the task's I/O thread during a simulated Spark job of ``--gap`` s, then
``TaskRunner._commit_batch`` applies ``--keys`` combined partials (keys drawn from twice as many,
so about half are new each batch) under the commit lock. Per batch the runner's own counters give:

- ``state``: step 2 on the driver (multi-get, the opaque txid rules, the new values);
- ``state topic``: step 4 (encode, write, fsync the state-topic file);
- ``zookeeper``: step 5 (staged sizes, the checkpoint entries, the commit multi-op);
- ``publish``: step 6 on the batch thread;
- ``commit``: the sum of the three above, what the batch waits for;
- ``rocksdb``: the synced write batch on the I/O thread, after the commit (off the batch's path
  unless the next batch comes before it is done: ``waited`` is that wait).

Run: ``.venv/bin/python bench/commit.py [--keys 1000 100000] [--batches N] [--gap S]``
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stream_ops.config import ClusterConfig, ZooKeeperConfig
from stream_ops.coordination.cluster_state import read_storm
from stream_ops.coordination.embedded import EmbeddedZooKeeper
from stream_ops.coordination.store import ZkStore
from stream_ops.examples.wordcount import build_wordcount
from stream_ops.hashing import encode_key
from stream_ops.nimbus.dist_store import load_submission
from stream_ops.nimbus.submission import submit
from stream_ops.runtime.computed_batch import ComputedBatch
from stream_ops.runtime.task_runner import RunnerSettings, TaskRunner
from stream_ops.runtime.task_stats import COMMIT_STEPS
from stream_ops.state.auto_snapshot import SnapshotPolicy
from stream_ops.topology.layout import TopologyLayout

STEPS = ("state", "state topic", "zookeeper", "publish", "commit", "rocksdb", "waited")


def keyed_runner(store: ZkStore, cluster: ClusterConfig, work: Path) -> TaskRunner:
    """The runner of the word count's keyed task, prepared (it owns the task)."""
    topology_id = submit(store, cluster, build_wordcount(work / "in", queues=1), workers=1)
    plan = load_submission(cluster.resolved_dist_dir(), read_storm(store, topology_id)).plan
    connected = threading.Event()
    connected.set()
    runner = TaskRunner(
        zk=store,
        spark=None,  # type: ignore[arg-type]  # the commit path never calls Spark
        layout=TopologyLayout(cluster, topology_id),
        plan=plan,
        task=plan.task_for(1, 0),
        worker_id="bench:1",
        # no automatic snapshot: its compaction thread would compete with the batches measured
        settings=RunnerSettings(snapshot_policy=SnapshotPolicy(after_entries=0, after_bytes=0)),
        connected=connected,
    )
    runner.prepare()
    return runner


def log_checkpoint_entries(checkpoint: Path, txid: int, files: int) -> None:
    """Spark's offset-log and file-source-log entries of batch ``txid``, as Spark writes them."""
    for name in ("offsets", "sources/0"):
        (checkpoint / name).mkdir(parents=True, exist_ok=True)
    offsets = '{"batchWatermarkMs":0,"batchTimestampMs":0,"conf":{}}'
    (checkpoint / "offsets" / str(txid)).write_text(f'v1\n{offsets}\n{{"logOffset":{txid}}}\n')
    lines = [f'{{"path":"file:///in/queue-00000/f{txid}-{i}.jsonl","timestamp":{txid},"batchId":{txid}}}' for i in range(files)]
    (checkpoint / "sources" / "0" / str(txid)).write_text("v1\n" + "\n".join(lines) + "\n")


def run(runner: TaskRunner, keys: int, batches: int, gap_s: float, first_txid: int) -> dict[str, list[float]]:
    """Commit ``batches`` batches of ``keys`` keys; returns ms per batch by step."""
    rng = random.Random(keys)
    universe = [encode_key([f"word-{i}"]) for i in range(2 * keys)]
    checkpoint = runner.layout.checkpoint_dir(runner.task.task_id)
    figures: dict[str, list[float]] = {step: [] for step in STEPS}
    for txid in range(first_txid, first_txid + batches):
        partials = [(key, rng.randint(1, 9)) for key in rng.sample(universe, keys)]
        log_checkpoint_entries(checkpoint, txid, files=20)
        before = dict(runner.stats.commit_steps_ms)
        state_before = runner.stats.state_ms_total
        # what process_batch does while Spark runs the batch's jobs
        runner._input.read_entries_ahead(txid, runner._io)
        time.sleep(gap_s)
        started = time.perf_counter()
        runner._store_writes.await_write()
        figures["waited"].append((time.perf_counter() - started) * 1000.0)
        with runner._state_section(txid):
            runner._commit_batch(ComputedBatch(rows_in=keys, partials=partials), txid)
        runner._store_writes.await_write()  # the previous write is done: its time is counted
        steps = {step: runner.stats.commit_steps_ms[step] - before[step] for step in COMMIT_STEPS}
        figures["state"].append(runner.stats.state_ms_total - state_before)
        figures["state topic"].append(steps["state_topic"])
        figures["zookeeper"].append(steps["zookeeper"])
        figures["publish"].append(steps["publish"])
        figures["commit"].append(steps["state_topic"] + steps["zookeeper"] + steps["publish"])
        figures["rocksdb"].append(steps["rocksdb"])
    return figures


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, nargs="+", default=[1_000, 100_000], help="keys per batch")
    parser.add_argument("--batches", type=int, default=20, help="batches per size (the first is not counted)")
    parser.add_argument("--gap", type=float, default=0.2, help="seconds between batches (Spark's part of a batch)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="stream_ops_bench_commit_"))
    zk = EmbeddedZooKeeper(work / "zookeeper", tick_time_ms=500)
    try:
        zk.start(timeout_s=60)
        config = ZooKeeperConfig(hosts=zk.hosts, chroot="/bench", session_timeout_s=6.0, insecure=True)
        with ZkStore.connect(config) as store:
            runner = keyed_runner(store, ClusterConfig(root=work / "cluster"), work)
            try:
                print(f"keyed commit, opaque state, fsync on; {args.batches - 1} batches per size after one warm-up")
                print(f"{'keys':>8}  " + "  ".join(f"{step:>11}" for step in STEPS) + "   (ms per batch, median / p90)")
                txid = 0
                for keys in args.keys:
                    figures = run(runner, keys, args.batches, args.gap, txid)
                    txid += args.batches
                    cells = []
                    for step in STEPS:
                        values = sorted(figures[step][1:])
                        p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
                        cells.append(f"{statistics.median(values):5.1f}/{p90:5.1f}")
                    print(f"{keys:>8,}  " + "  ".join(f"{cell:>11}" for cell in cells) + f"   load {load()}")
            finally:
                runner.stop()
    finally:
        zk.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
