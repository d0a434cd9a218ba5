"""One JoinBolt task of ``bench/join_kafka.py`` without Spark or Kafka: where its driver time goes.

The join task's processor (``JoinProcessor``, the one the worker runs) on a real RocksDB store,
fed the rows its queue receives in ``bench/join_kafka.py``'s throughput run: the same
impressions and clicks (``join_kafka.make_inputs``, same arguments and seed), routed to the
join stage's queues by ``ad`` as the shuffle routes them, one batch of every upstream task's
next slice of records plus its progress report (largest event time sent), as the shuffle
delivers them. Per batch, timed apart:

* ``process``: the processor's whole batch (buffering, closing windows, the join, staging the
  state change), and inside it, by profiling hooks, the buffer's ``add`` (buffering and closing
  windows) and the bolt's ``execute`` (the join);
* ``state``: what the commit does with the staged state change on the driver: encoding it for
  the state topic (``state_topic.encode_changes``) and writing it to RocksDB (``flush``).

The joined rows are checked against ``join_kafka.expected_rows`` restricted to the queue. It
also reports the entries and bytes the state change carried per batch. It prints figures only.

Run: ``.venv/bin/python bench/join_task.py [--quick] [--batches 1] [--queue 0]``; ``--batches
1`` is the throughput run's shape (the topics are filled before the engine starts, so the
first batch holds them all), more batches spread the same records.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from join_kafka import FULL, QUICK, Row, Shape, expected_rows, join_bolt, make_inputs

from stream_ops import FileTopic, Topology
from stream_ops.dsl.build_plan import build_plan
from stream_ops.hashing import encode_key, partition_for
from stream_ops.operators.join_bolt import JoinBolt
from stream_ops.operators.window_buffer import WindowBuffer
from stream_ops.runtime.stage_processors import PROGRESS_STREAM, make_processor
from stream_ops.state.rocksdb_backing import RocksDBBackingMap
from stream_ops.state.state_topic import encode_changes
from stream_ops.topology.plan import StageSpec

JOIN_QUEUES = 2


def join_stage(shape: Shape, partitions: int, work: Path) -> StageSpec:
    """The join stage of ``bench/join_kafka.py``'s topology (file sources stand in for Kafka)."""
    t = Topology("join-task")
    schema = {"id": "string", "ad": "string", "ts": "double"}
    impressions = t.source("impressions", FileTopic(work / "impressions", partitions), schema=schema)
    clicks = t.source("clicks", FileTopic(work / "clicks", partitions), schema=schema)
    t.join(join_bolt(shape), impressions=impressions, clicks=clicks, name="ad-clicks", queues=JOIN_QUEUES).to_parquet(
        work / "out", name="out"
    )
    plan = build_plan(t)
    return next(s for s in plan.stages if s.join is not None)


def batches_of(inputs: Any, queue: int, batches: int) -> list[list[tuple[str, str | None, dict[str, Any]]]]:
    """The rows ``queue`` receives, in ``batches`` batches: per batch each upstream task's next
    slice of its partition, the records routed here plus its progress report."""
    upstream = [("impressions", 0, inputs.impressions), ("clicks", 1, inputs.clicks)]
    out: list[list[tuple[str, str | None, dict[str, Any]]]] = [[] for _ in range(batches)]
    for stream, stage, partitions in upstream:
        for p, records in enumerate(partitions):
            size = -(-len(records) // batches)
            for b in range(batches):
                part = records[b * size : (b + 1) * size]
                if not part:
                    continue
                for r in part:
                    if partition_for([r["ad"]], JOIN_QUEUES) == queue:
                        out[b].append((stream, encode_key([r["ad"]]), r))
                channel = {"channel": f"{stage}/{p}", "max_event": max(r["ts"] for r in part)}
                out[b].append((PROGRESS_STREAM, None, channel))
    return out


class Stopwatch:
    """Seconds spent in wrapped callables, by name."""

    def __init__(self) -> None:
        self.seconds: collections.Counter[str] = collections.Counter()

    def wrap(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - started

        return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="bench/join_kafka.py --quick's records")
    parser.add_argument("--batches", type=int, default=1, help="batches the task's records arrive in")
    parser.add_argument("--queue", type=int, default=0, help=f"the join task (queue) of {JOIN_QUEUES}")
    parser.add_argument("--ads", type=int, default=500)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--lag", type=float, default=2.0)
    parser.add_argument("--jitter", type=float, default=1.0)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    for name, value in (QUICK if args.quick else FULL).items():
        setattr(args, name, value)
    shape = Shape(args.window, args.lag)
    inputs = make_inputs(args)
    rows_in = batches_of(inputs, args.queue, args.batches)
    records = sum(1 for batch in rows_in for stream, _, _ in batch if stream != PROGRESS_STREAM)
    expected = collections.Counter(
        {row: n for row, n in expected_rows(inputs, args.window).items() if partition_for([row[0]], JOIN_QUEUES) == args.queue}
    )
    print(
        f"queue {args.queue} of {JOIN_QUEUES}: {records:,} records in {args.batches} batches, {expected.total():,} expected rows"
    )
    print(f"load before: {os.getloadavg()}")

    watch = Stopwatch()
    WindowBuffer.add = watch.wrap("buffer add + close", WindowBuffer.add)  # type: ignore[method-assign]
    JoinBolt.execute = watch.wrap("join (execute)", JoinBolt.execute)  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory(prefix="join-task-") as work:
        stage = join_stage(shape, args.partitions, Path(work))
        store = RocksDBBackingMap(Path(work) / "store")
        processor = make_processor(stage, store, 0.0)
        assert processor is not None
        seen: collections.Counter[Row] = collections.Counter()
        entries = size = 0
        cpu_started = time.process_time()
        for txid, batch in enumerate(rows_in):
            started = time.perf_counter()
            output = processor.process(batch, float(txid))
            watch.seconds["process"] += time.perf_counter() - started
            started = time.perf_counter()
            keys, values = store.pending_columns()
            encoded = encode_changes(keys, values, where="bench")
            store.flush(txid, 0, encoded=encoded)
            watch.seconds["state (encode + RocksDB)"] += time.perf_counter() - started
            entries += len(encoded)
            size += encoded.keys.nbytes + encoded.values.nbytes
            seen.update((r["ad"], r["click_id"], r["imp_id"]) for r in output.records)
        cpu = time.process_time() - cpu_started
        store.close()
    if seen != expected:
        raise SystemExit(
            f"joined rows differ from the expected join: {sum((seen - expected).values())} extra, {sum((expected - seen).values())} missing"
        )
    print(f"rows: {seen.total():,}, all as expected")
    for name in ("process", "buffer add + close", "join (execute)", "state (encode + RocksDB)"):
        print(f"  {name:<26} {watch.seconds[name]:8.3f} s")
    print(f"  {'CPU (process)':<26} {cpu:8.3f} s, {cpu / records * 1e6:.1f} us/record")
    print(
        f"state change: {entries:,} entries, {size / 1e6:.2f} MB over {args.batches} batches ({size / args.batches / 1e3:.1f} kB/batch)"
    )
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
