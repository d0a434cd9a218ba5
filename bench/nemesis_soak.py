"""Soak the nemesis scenarios of ``tests/e2e/test_nemesis.py`` in a loop, with random timing.

One stack for the whole soak (``tests/e2e/nemesis_helpers.py:nemesis_stack``: an embedded
ZooKeeper, the nimbus monitor in this process, a ``nemesis`` worker behind a TCP proxy with its
RocksDB stores on a small tmpfs and an fsync-slowing ``LD_PRELOAD`` shim, a ``plain`` worker, the
internal topics on another small tmpfs). Each round picks a scenario and its timing from
``--seed`` and runs it on a fresh word count fed continuously:

* ``partition``: cut the nemesis worker from ZooKeeper (silently; its connections kept or
  dropped at the heal) until the takeover, or for a random 0.5-12 s (below the 4 s session
  timeout the session survives, above it expires);
* ``disk``: fill the topics tmpfs, the state-store tmpfs or both in turn, kept full a random
  0-20 s more (past ~15 s a task is quarantined and released as an operator would);
* ``slow``: every fsync of the nemesis worker sleeps 200-1500 ms while it commits and while it
  takes over the tasks of the plain worker, SIGKILLed meanwhile (restarted next round);

after a random 0-5 s of input. A round passes when every count equals the ground truth and the
scenario's own checks hold (see the helpers); it prints one line, the timeline on a failure.
Exit status 1 if any round failed.

Needs root (``mount -t tmpfs``) and gcc (the shim). Run:

    .venv/bin/python bench/nemesis_soak.py --minutes 30 --seed 7
    .venv/bin/python bench/nemesis_soak.py --minutes 10 --scenarios partition,slow --keep
"""

from __future__ import annotations

import argparse
import logging
import random
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "e2e"))

from nemesis_helpers import (
    SESSION_TIMEOUT_S,
    FsyncShim,
    NemesisStack,
    ScenarioResult,
    can_mount_tmpfs,
    nemesis_stack,
    run_disk_full,
    run_partition,
    run_slow_disk,
)

from stream_ops import OpaqueMapState, TransactionalMapState

SCENARIOS = ("partition", "disk", "slow")


def plan_round(rng: random.Random, scenario: str, name: str) -> tuple[str, Callable[[NemesisStack], ScenarioResult]]:
    """The round's parameters (printed) and the call that runs it."""
    state = rng.choice([TransactionalMapState, OpaqueMapState])
    lead_s = round(rng.uniform(0.0, 5.0), 1)
    common: dict[str, Any] = {"name": name, "state": state, "lead_s": lead_s}
    if scenario == "partition":
        hold_s = rng.choice(
            [None, round(rng.uniform(0.5, SESSION_TIMEOUT_S * 0.6), 1), round(rng.uniform(SESSION_TIMEOUT_S * 1.5, 12.0), 1)]
        )
        drop = rng.random() < 0.5
        described = f"hold={'until takeover' if hold_s is None else f'{hold_s} s'} drop_connections={drop}"
        return described, lambda stack: run_partition(stack, hold_s=hold_s, drop_connections=drop, **common)
    if scenario == "disk":
        disks = rng.choice([("topics",), ("local",), ("topics", "local"), ("local", "topics")])
        hold_s = round(rng.uniform(0.0, 20.0), 1)
        return f"disks={','.join(disks)} hold={hold_s} s", lambda stack: run_disk_full(
            stack, disks=disks, hold_s=hold_s, **common
        )
    delay_ms = rng.choice([200, 500, 1000, 1500])
    return f"fsync delay={delay_ms} ms", lambda stack: run_slow_disk(stack, delay_ms=delay_ms, **common)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="How long to keep starting rounds.")
    parser.add_argument("--seed", type=int, default=None, help="Seed of the scenario and timing choices (printed).")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"Comma-separated subset of {','.join(SCENARIOS)}.")
    parser.add_argument("--home", type=Path, default=None, help="Stack home (default: a new temporary directory).")
    parser.add_argument("--keep", action="store_true", help="Keep the home (logs, topics) afterwards.")
    parser.add_argument("--stop-on-failure", action="store_true", help="Stop at the first failed round (home kept).")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = sorted(set(scenarios) - set(SCENARIOS))
    if unknown or not scenarios:
        parser.error(f"unknown scenarios {unknown}; choose from {', '.join(SCENARIOS)}")
    reason = can_mount_tmpfs()
    if reason is None and "slow" in scenarios:
        reason = FsyncShim.missing_compiler()
    if reason is not None:
        print(f"cannot soak here: {reason}", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    rng = random.Random(seed)
    work = args.home or Path(tempfile.mkdtemp(prefix="nemesis-soak-"))
    print(f"nemesis soak: seed {seed}, {args.minutes:g} min, scenarios {','.join(scenarios)}, home {work}", flush=True)

    results: dict[str, list[float]] = {s: [] for s in scenarios}
    failures: list[str] = []
    started = time.monotonic()
    deadline = started + args.minutes * 60.0
    with nemesis_stack(work / "home", with_shim="slow" in scenarios) as stack:
        print(f"stack up in {time.monotonic() - started:.1f} s", flush=True)
        round_no = 0
        while time.monotonic() < deadline:
            round_no += 1
            scenario = rng.choice(scenarios)
            described, run = plan_round(rng, scenario, f"soak{round_no}-{scenario}")
            t0 = time.monotonic()
            try:
                result = run(stack)
            except Exception as e:  # noqa: BLE001 - a failed round is reported and the soak goes on
                failures.append(f"round {round_no} {scenario} ({described}): {e}")
                print(
                    f"round {round_no:3d} {scenario:<9} {described:<45} FAIL after {time.monotonic() - t0:6.1f} s: {e}",
                    flush=True,
                )
                traceback.print_exc()
                if args.stop_on_failure:
                    args.keep = True
                    break
                continue
            results[scenario].append(result.seconds)
            print(f"round {round_no:3d} {scenario:<9} {described:<45} OK   {result.summary()}", flush=True)

    print(f"\nseed {seed}: {sum(len(v) for v in results.values())} rounds exact, {len(failures)} failed", flush=True)
    for scenario, seconds in results.items():
        if seconds:
            print(
                f"  {scenario:<9} {len(seconds):3d} exact, mean {sum(seconds) / len(seconds):5.1f} s, max {max(seconds):5.1f} s"
            )
    for line in failures:
        print(f"  FAILED {line}")
    if args.keep or failures:
        print(f"home kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
