"""Benchmark of restoring keyed state: full state-topic replay vs. compacted snapshot + tail.

For each state size it writes a state-topic queue (Arrow IPC batch files,
``StateTopicQueue.append``) of ``--files`` batch files (txids 1..F, one owner epoch, opaque
word-count values; each batch adds new words, updates earlier ones and deletes a few) plus
``--tail`` later batches touching a small share of the keys, then times:

  (a0) the generic restore path: ``StateTopicQueue.replay`` (``entries()`` +
       ``replay_state_topic``) then ``RocksDBBackingMap.restore`` (``--generic``);
  (a)  a full replay into a fresh RocksDB store (``rebuild_store`` without snapshots: the
       counted files' key/value columns, the last row per key kept with Arrow, loaded in key
       order as SST files by ``RocksDBBackingMap.restore_sorted``);
  (b)  the first compaction into a Parquet snapshot at txid F (reads every file);
  (c)  a rebuild from the snapshot at txid F + the tail into a fresh RocksDB store (the SST
       written beside the snapshot is ingested whole and the tail applied on top; a snapshot
       without one is read row by row, its columns being the stored bytes);
  (b') the next, incremental compaction at F + tail (reads the snapshot and the tail files
       only), deleting the covered files.

(a) and (c) restore the same state at the same txid; the benchmark checks they agree, and that
every store holds byte-for-byte the same RocksDB contents (marker included).
Each line shows wall time and keys/s, the CPU seconds of the process (all threads) with keys
per CPU second, which is the steadier figure on a shared machine, and the load average.
Last, the commit's state-topic append (``StateLog.append_batch``: encode the file, write,
fsync, rename, fsync the directory) of 1k and 100k keys, median of a few runs.

Run: ``.venv/bin/python bench/restore.py [--sizes 10000,1000000] [--files 100] [--tail 5] [--generic]``
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from itertools import zip_longest
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from importlib.metadata import version

import pyarrow
from rocksdict import Options, Rdict

from stream_ops.state import (
    FileStateLog,
    OpaqueValue,
    RocksDBBackingMap,
    StateTopicQueue,
    compact_queue,
    rebuild_store,
    write_snapshot,
)
from stream_ops.state.state_topic import encode_items
from stream_ops.topics.file_topic import FileTopic

T = TypeVar("T")

_SYLLABLES = [
    "ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "be", "da", "fo", "gu", "ha", "ji", "ke", "la",
    "mo", "nu", "pa", "qi", "re", "si", "tu", "wa", "xo", "ye", "zu", "bra", "cle", "dro", "fla", "gri",
]  # fmt: skip


def word(i: int) -> str:
    """A unique pronounceable word for ``i`` (two or more syllables)."""
    parts = []
    n = i + len(_SYLLABLES)  # at least two syllables
    while n:
        n, digit = divmod(n, len(_SYLLABLES))
        parts.append(_SYLLABLES[digit])
    return "".join(parts)


CPU_SECONDS: list[float] = []
"""CPU seconds (all threads of this process) of each timed() call, in order."""


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    """Wall seconds and result of ``fn()``; its CPU seconds are appended to CPU_SECONDS."""
    cpu = time.process_time()
    started = time.perf_counter()
    result = fn()
    CPU_SECONDS.append(time.process_time() - cpu)
    return time.perf_counter() - started, result


def dir_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def mib(n: int) -> str:
    return f"{n / 2**20:8.1f} MiB"


def build_queue(queue: StateTopicQueue, keys: int, files: int, tail: int, rng: random.Random) -> tuple[int, int]:
    """Write ``files`` batches creating ``keys`` words (plus updates and deletes), then ``tail`` small ones.

    Returns:
        (entries written to the queue, the last txid).
    """
    words = [word(i) for i in range(keys)]
    order = list(range(keys))
    rng.shuffle(order)
    counts: dict[int, int] = {}
    per_file = -(-keys // files)
    entries = 0
    for f in range(files):
        txid = f + 1
        new = order[f * per_file : (f + 1) * per_file]
        seen = min(f * per_file, keys)
        updated = [order[j] for j in rng.sample(range(seen), min(seen, per_file // 2))]
        deleted = set(rng.sample(updated, len(updated) // 50))  # about 1% of a batch
        items: list[tuple[tuple[str], Any]] = []
        for i in new + updated:
            if i in deleted:
                counts.pop(i, None)
                items.append(((words[i],), None))
            else:
                prev = counts.get(i)
                counts[i] = (prev or 0) + rng.randrange(1, 20)
                items.append(((words[i],), OpaqueValue(txid, counts[i], prev)))
        queue.append_encoded(7, txid, 1, encode_items(items))
        entries += len(items)
    live = list(counts)
    for t in range(tail):
        txid = files + 1 + t
        touched = rng.sample(live, max(1, len(live) // 500))  # 0.2% of the keys per batch
        items = []
        for i in touched:
            prev = counts.get(i)
            counts[i] = (prev or 0) + 1
            items.append(((words[i],), OpaqueValue(txid, counts[i], prev)))
        items.append(((f"fresh-{txid}",), OpaqueValue(txid, 1, None)))
        queue.append_encoded(7, txid, 1, encode_items(items))
        entries += len(items)
    return entries, files + tail


def generic_restore(store: RocksDBBackingMap, queue: StateTopicQueue, txid: int, epoch: int) -> int:
    """The generic restore path: entries() -> replay_state_topic -> from_json_obj -> restore."""
    return store.restore(queue.replay(txid).items(), txid, epoch)


def load() -> str:
    return "load " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def report(label: str, count: int, seconds: float, note: str = "") -> None:
    """One result line: keys, wall time and keys/s, CPU time and keys per CPU second, load average."""
    cpu = CPU_SECONDS[-1]
    print(
        f"{label:<30} {count:>10,} keys {seconds:7.2f}s {count / seconds:>10,.0f} keys/s"
        f"   cpu {cpu:6.2f}s {count / cpu if cpu > 0 else float('inf'):>10,.0f} keys/cpu-s   {load()}   {note}",
        flush=True,
    )


def run(size: int, files: int, tail: int, root: Path, generic: bool) -> None:
    rng = random.Random(size)
    work = root / f"keys-{size}"
    queue = StateTopicQueue(FileTopic(work / "arrow", queues=1), 0)
    print(f"\n== {size:,} keys: {files} batch files, then a tail of {tail} ==")

    seconds, (entries, last_txid) = timed(lambda: build_queue(queue, size, files, tail, rng))
    head_txid = files
    print(f"state topic: {entries:,} entries written in {seconds:.2f}s")
    head_bytes = sum(p.stat().st_size for fid, p in queue.batch_files() if fid.txid <= head_txid)
    tail_bytes = sum(p.stat().st_size for fid, p in queue.batch_files() if fid.txid > head_txid)
    print(f"-- {mib(head_bytes).strip()} in {files} files + {mib(tail_bytes).strip()} in {tail} tail files")
    check_same_bytes(run_format("arrow", queue, work, entries, head_txid, last_txid, tail, generic=generic))
    shutil.rmtree(work, ignore_errors=True)


def run_format(
    name: str, queue: StateTopicQueue, work: Path, entries: int, head_txid: int, last_txid: int, tail: int, *, generic: bool
) -> list[Path]:
    """Time (a0), (a), (b), (c) and (b') on one queue; returns the stores it left for the byte check."""
    snaps = work / f"snapshots-{name}"

    def restore_into(db: str, fn: Callable[[RocksDBBackingMap], int]) -> tuple[float, int, int]:
        path = work / db
        with RocksDBBackingMap(path) as store:
            seconds, count = timed(lambda: fn(store))
        return seconds, count, dir_bytes(path)

    stores = []
    if generic:
        seconds, count, _ = restore_into("db-generic", lambda s: generic_restore(s, queue, last_txid, 1))
        report(f"(a0) full replay, generic, {name}", count, seconds, f"{entries:,} entries; replay() + restore()")
        stores.append(work / "db-generic")

    seconds, full_count, db_bytes = restore_into(f"db-full-{name}", lambda s: rebuild_store(s, queue, last_txid, 1))
    report(f"(a)  full replay, {name}", full_count, seconds, f"{entries:,} entries; RocksDB {mib(db_bytes).strip()}")

    seconds, info = timed(lambda: write_snapshot(queue, snaps, head_txid))
    report(f"(b)  first compaction, {name}", info.keys, seconds, f"all files -> snapshot {mib(info.bytes).strip()}")

    seconds, count, _ = restore_into(f"db-snap-{name}", lambda s: rebuild_store(s, queue, last_txid, 1, snapshot_dir=snaps))
    report(f"(c)  snapshot + tail, {name}", count, seconds, f"snapshot at txid {head_txid} + {tail} tail files")
    if count != full_count:
        raise SystemExit(f"MISMATCH: full replay restored {full_count} keys, snapshot + tail {count}")
    check_same_state(
        work / f"db-full-{name}", work / f"db-snap-{name}", random.Random(1), sample=2_000 if count > 100_000 else None
    )

    seconds, result = timed(lambda: compact_queue(queue, snaps, last_txid, delete_covered=True))
    report(
        f"(b') incremental compaction, {name}",
        result.snapshot.keys,
        seconds,
        f"snapshot + {tail} tail files -> snapshot {mib(result.snapshot.bytes).strip()}; "
        f"deleted {result.deleted_files} covered files ({mib(result.deleted_bytes).strip()})",
    )
    return [*stores, work / f"db-full-{name}", work / f"db-snap-{name}"]


def bench_append(root: Path, sizes: tuple[int, ...] = (1_000, 100_000), runs: int = 9) -> None:
    """The commit's state-topic append of ``sizes`` keys: median ms of ``runs`` (durable, fsynced)."""
    print("\n== commit: state-topic append (StateLog.append_batch; durable: fsync file + directory) ==")
    for size in sizes:
        encoded = encode_items([((word(i),), OpaqueValue(9, i, i - 1)) for i in range(size)])
        log = FileStateLog(StateTopicQueue(FileTopic(root / f"append-arrow-{size}", queues=1), 0))
        ms: list[float] = []
        for txid in range(runs):
            started = time.perf_counter()
            log.append_batch(7, txid, 1, encoded)
            ms.append((time.perf_counter() - started) * 1000)
        print(f"append {size:>7,} keys  median {sorted(ms)[runs // 2]:7.2f} ms  (min {min(ms):.2f})   {load()}")


def check_same_state(a: Path, b: Path, rng: random.Random, sample: int | None) -> None:
    """Both stores hold the same items (all of them, or a random sample of keys)."""
    with RocksDBBackingMap(a) as left, RocksDBBackingMap(b) as right:
        if sample is None:
            same = list(left.items()) == list(right.items())
        else:
            keys = [key for key, _ in left.items()]
            picked = rng.sample(keys, min(sample, len(keys)))
            same = left.multi_get(picked, include_pending=False) == right.multi_get(picked, include_pending=False)
        if not same or left.applied_marker() != right.applied_marker():
            raise SystemExit(f"MISMATCH between {a} and {b}")
    checked = "all keys" if sample is None else f"{sample:,} sampled keys"
    print(f"     check: full replay and snapshot + tail agree ({checked})")


def check_same_bytes(paths: list[Path]) -> None:
    """All stores hold exactly the same raw keys and values, marker included (a streaming compare)."""
    stores = [Rdict(str(path), Options(raw_mode=True)) for path in paths]
    try:
        rows = 0
        for rows, items in enumerate(zip_longest(*(store.items() for store in stores)), 1):  # noqa: B007 - the count is used after the loop
            if any(item != items[0] for item in items[1:]):
                raise SystemExit(f"MISMATCH in the raw contents of {', '.join(str(p) for p in paths)}")
    finally:
        for store in stores:
            store.close()
    print(f"     check: {', '.join(p.name for p in paths)} hold the same bytes ({rows:,} rows incl. the marker)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,1000000", help="comma-separated key counts")
    parser.add_argument("--files", type=int, default=100, help="batch files before the snapshot")
    parser.add_argument("--tail", type=int, default=5, help="batch files after the snapshot")
    parser.add_argument("--generic", action="store_true", help="also time the generic replay path")
    parser.add_argument("--no-append", dest="append", action="store_false", help="skip the commit-append figures")
    parser.add_argument("--workdir", type=Path, default=None, help="where to write (default: a temp directory)")
    args = parser.parse_args()

    print(
        f"machine: {platform.platform()}, {platform.machine()}, {os.cpu_count()} cpus, "
        f"Python {platform.python_version()}, "
        f"pyarrow {pyarrow.__version__}, rocksdict {version('rocksdict')}, "
        f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    root = Path(tempfile.mkdtemp(prefix="stream-ops-restore-", dir=args.workdir))
    try:
        started = time.perf_counter()
        for size in (int(s) for s in args.sizes.split(",")):
            run(size, args.files, args.tail, root, args.generic)
        if args.append:
            bench_append(root)
        print(f"\ntotal {time.perf_counter() - started:.1f}s")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
