"""Benchmark of ``stream_ops.scheduler.assign`` at cluster scale.

Places 100,000 tasks on 10,000 slots (1,000 hosts x 10 ports, ``num_workers`` = 10,000):
once fresh, then again with the previous assignment after 10% of the slots died, and
reports how many tasks moved (the minimum is the tasks of the dead slots).

Run: ``.venv/bin/python bench/scheduler.py [--tasks N] [--hosts H] [--ports P] [--workers W] [--repeat R]``
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stream_ops.scheduler import Slot, assign, moved_tasks, sort_slots


def _best_of(repeat: int, fn):  # type: ignore[no-untyped-def]
    best = float("inf")
    result = None
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - started)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--hosts", type=int, default=1_000)
    parser.add_argument("--ports", type=int, default=10)
    parser.add_argument("--workers", type=int, default=None, help="num_workers (default: all slots)")
    parser.add_argument("--dead", type=float, default=0.10, help="fraction of slots that die")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure; the best is shown")
    args = parser.parse_args()

    slots = [Slot(f"host{h:04d}", 6700 + p) for h in range(args.hosts) for p in range(args.ports)]
    tasks = list(range(args.tasks))
    workers = args.workers or len(slots)

    print(f"machine: {platform.platform()}, {platform.machine()}, {os.cpu_count()} cpus, Python {platform.python_version()}")
    print(
        f"input:   {len(tasks):,} tasks, {len(slots):,} slots "
        f"({args.hosts:,} hosts x {args.ports} ports), num_workers={workers:,}"
    )

    t_sort, _ = _best_of(args.repeat, lambda: sort_slots(slots))
    print(f"sort_slots:                         {t_sort * 1000:8.1f} ms")

    t_fresh, fresh = _best_of(args.repeat, lambda: assign(tasks, slots, workers))
    loads = Counter(fresh.values())
    print(
        f"assign fresh:                       {t_fresh * 1000:8.1f} ms  "
        f"({len(loads):,} slots used, {min(loads.values())}-{max(loads.values())} tasks each)"
    )

    t_same, same = _best_of(args.repeat, lambda: assign(tasks, slots, workers, previous=fresh))
    print(f"assign again, nothing changed:      {t_same * 1000:8.1f} ms  ({len(moved_tasks(fresh, same)):,} tasks moved)")

    rng = random.Random(42)
    dead = set(rng.sample(slots, int(len(slots) * args.dead)))
    alive = [s for s in slots if s not in dead]
    t_dead, after = _best_of(args.repeat, lambda: assign(tasks, alive, workers, previous=fresh))
    moved = moved_tasks(fresh, after)
    orphaned = sum(1 for s in fresh.values() if s in dead)
    loads = Counter(after.values())
    print(
        f"assign after {len(dead):,} slots died ({args.dead:.0%}): {t_dead * 1000:8.1f} ms  "
        f"({len(moved):,} tasks moved; {orphaned:,} were on dead slots; "
        f"{len(loads):,} slots used, {min(loads.values())}-{max(loads.values())} tasks each)"
    )


if __name__ == "__main__":
    main()
