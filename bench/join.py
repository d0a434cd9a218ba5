"""Windowed join throughput: stream_ops' JoinBolt (pure Python) vs a Spark DataFrame join.

One count window of ``--orders + --users`` records (default 5,000 + 5,000 = 10,000) from two
streams, interleaved in a seeded random arrival order:

* ``orders``: ``{order_id, user_id, amount}``
* ``users``:  ``{user_id, name, city}``, user ids unique

Inner join: every order's ``user_id`` is drawn from the users' ids, so each order matches
exactly one user (output rows = orders). Left join: the same, except ``--unmatched`` (10 %) of
the orders get a user id no user has, so they come out with nulls for ``name`` and ``city``.

Timed, each several times (best and median reported; rows/s from the median):

* (a) ``JoinBolt.execute(window)`` on the prebuilt window list;
* (b) a new ``WindowBuffer`` of ``Tumbling(Records(N))``, ``add`` of every record (``now`` is a constant; a count
  window ignores it), then ``execute`` of the window it closes, so the buffering is included;
* (c) in the same process, ``local[2]`` (stream_ops' ``create_spark_session`` defaults):
  ``orders.join(users, "user_id"[, "left"]).select(...).collect()`` on DataFrames created once
  from the same record lists, after a warm-up;
* (c+) the same plus both ``createDataFrame`` calls inside the timed region, which is what a
  Spark join of each window would pay.

Spark series stop early after 5 repetitions once ``--spark-budget`` seconds have passed.
Besides wall time, CPU time per repetition is reported (this process; for Spark also its JVM,
from ``/proc``), since wall time on a busy host includes waiting for a CPU.
Every engine's output is checked against a dictionary lookup join before anything is timed.
The Python join runs on one core; Spark may use both (JVM) but its driver shares them with
the Python process.

Run: ``.venv/bin/python bench/join.py [--orders N] [--users N] [--reps N] [--spark-reps N]``
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import re
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyspark
from pyspark.sql import DataFrame, SparkSession

from stream_ops.operators.join_bolt import JoinBolt
from stream_ops.operators.window_buffer import WindowBuffer
from stream_ops.spark.session import create_spark_session
from stream_ops.topology.windows import Records, Tumbling, WindowDef

SPARK_MASTER = "local[2]"
SELECT = "order_id, user_id, amount, name, city"
OUTPUT = [f.strip() for f in SELECT.split(",")]
ORDERS_SCHEMA = "order_id long, user_id long, amount double"
USERS_SCHEMA = "user_id long, name string, city string"
CITIES = ["Berlin", "Lisbon", "Osaka", "Lima", "Oslo", "Austin", "Porto", "Quito", "Hanoi", "Accra"]

Window = list[tuple[str, Mapping[str, Any]]]
Row = tuple[Any, ...]


# --- input -------------------------------------------------------------------------------


@dataclass
class Data:
    how: str
    orders: list[dict[str, Any]]
    users: list[dict[str, Any]]
    window: Window
    expected: list[Row]
    """The join result in JoinBolt's order (orders in window order), from a dict lookup."""

    @property
    def records(self) -> int:
        return len(self.window)


def make_data(how: str, n_orders: int, n_users: int, unmatched: float, seed: int) -> Data:
    """Seeded orders/users; ``unmatched`` of the orders (left join only) have a user id no user has."""
    rng = random.Random(seed)
    user_ids = rng.sample(range(1, 10 * (n_users + n_orders) + 1), n_users)
    users = [{"user_id": uid, "name": f"user-{uid}", "city": rng.choice(CITIES)} for uid in user_ids]
    known = set(user_ids)
    n_missing = round(unmatched * n_orders) if how == "left" else 0
    missing_at = set(rng.sample(range(n_orders), n_missing))
    next_missing = 10 * (n_users + n_orders) + 1  # above every user id: matches nothing
    orders = []
    for i in range(n_orders):
        if i in missing_at:
            uid = next_missing
            next_missing += 1
        else:
            uid = rng.choice(user_ids)
        orders.append({"order_id": 1_000_000 + i, "user_id": uid, "amount": round(rng.uniform(1.0, 500.0), 2)})
    window: Window = [("orders", o) for o in orders] + [("users", u) for u in users]
    rng.shuffle(window)

    by_id = {u["user_id"]: u for u in users}
    expected: list[Row] = []
    for stream, rec in window:
        if stream != "orders":
            continue
        user = by_id.get(rec["user_id"])
        if user is None:
            assert rec["user_id"] not in known
            if how == "left":
                expected.append((rec["order_id"], rec["user_id"], rec["amount"], None, None))
            continue
        expected.append((rec["order_id"], rec["user_id"], rec["amount"], user["name"], user["city"]))
    assert len(expected) == n_orders
    assert sum(1 for r in expected if r[3] is None) == n_missing
    return Data(how, orders, users, window, expected)


def make_bolt(how: str) -> JoinBolt:
    bolt = JoinBolt("orders", "user_id")
    bolt = bolt.join("users", "user_id", "orders") if how == "inner" else bolt.left_join("users", "user_id", "orders")
    return bolt.select(SELECT)


# --- timing ------------------------------------------------------------------------------


@dataclass
class Timing:
    label: str
    rows: int
    records: int
    seconds: list[float]
    cpu_seconds: float
    """CPU time of the whole timed series (see :class:`CpuClock`)."""

    @property
    def cpu_per_rep(self) -> float:
        return self.cpu_seconds / len(self.seconds)

    @property
    def rows_per_cpu_s(self) -> float:
        return self.rows / self.cpu_per_rep if self.cpu_seconds > 0 else float("nan")

    @property
    def best(self) -> float:
        return min(self.seconds)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.median

    @property
    def best_rows_per_s(self) -> float:
        return self.rows / self.best


class CpuClock:
    """CPU seconds used so far by this Python process, plus (if given) Spark's JVM process.

    Wall time on a shared host includes waiting for the CPU; CPU time does not, so rows per
    CPU-second stays comparable when other processes load the machine. The JVM's share is read
    from ``/proc/<pid>/stat`` (clock ticks, usually 10 ms; summed over a whole series).
    """

    def __init__(self, jvm_pid: int | None = None) -> None:
        self.jvm_pid = jvm_pid
        self.tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def jvm(self) -> float:
        if self.jvm_pid is None:
            return 0.0
        try:
            fields = Path(f"/proc/{self.jvm_pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / self.tick  # utime + stime

    def __call__(self) -> float:
        return time.process_time() + self.jvm()


PYTHON_CPU = CpuClock()
MIN_REPS = 5


def timed(
    fn: Callable[[], Any], reps: int, warmup: int, budget_s: float | None = None, cpu: CpuClock = PYTHON_CPU
) -> tuple[list[float], float, Any]:
    """Run ``fn`` ``warmup`` times untimed, then up to ``reps`` times timed.

    Returns the wall time of each timed run, the CPU time (``cpu``) of the whole timed series
    and the last result.

    With ``budget_s``, the timed series stops early once it has run that long and has at least
    ``MIN_REPS`` repetitions (keeps the whole run short when Spark is slow, e.g. on a busy host).
    """
    result = None
    for _ in range(warmup):
        result = fn()
    seconds: list[float] = []
    started = time.perf_counter()
    cpu_started = cpu()
    for _ in range(reps):
        t = time.perf_counter()
        result = fn()
        seconds.append(time.perf_counter() - t)
        if budget_s is not None and len(seconds) >= MIN_REPS and time.perf_counter() - started > budget_s:
            break
    return seconds, cpu() - cpu_started, result


def check(label: str, got: Sequence[Sequence[Any]], expected: list[Row], *, ordered: bool) -> None:
    rows = [tuple(r) for r in got]
    if not ordered:
        rows, expected = sorted(rows, key=repr), sorted(expected, key=repr)
    if rows != expected:
        diff = next((i for i, (a, b) in enumerate(zip(rows, expected)) if a != b), min(len(rows), len(expected)))
        raise SystemExit(
            f"{label}: result differs from the reference join ({len(rows)} rows vs {len(expected)}); "
            f"first difference at {diff}: {rows[diff : diff + 1]} vs {expected[diff : diff + 1]}"
        )


# --- stream_ops --------------------------------------------------------------------------


def bench_execute(data: Data, reps: int, warmup: int) -> Timing:
    bolt = make_bolt(data.how)
    check(f"JoinBolt.execute ({data.how})", bolt.execute(data.window), data.expected, ordered=True)
    seconds, cpu_s, out = timed(lambda: bolt.execute(data.window), reps, warmup)
    return Timing("(a) JoinBolt.execute(window)", len(out), data.records, seconds, cpu_s)


def bench_tumbling(data: Data, reps: int, warmup: int) -> Timing:
    bolt = make_bolt(data.how)
    count = data.records

    def run() -> list[list[Any]]:
        buffer = WindowBuffer(WindowDef.build(Tumbling(Records(count))), now=0.0)
        rows: list[list[Any]] = []
        windows = 0
        for stream, record in data.window:
            for closed in buffer.add([(stream, record)], 0.0).windows:
                rows.extend(bolt.execute(closed))
                windows += 1
        if windows != 1 or buffer.pending:
            raise SystemExit(
                f"a tumbling window of {count} records closed {windows} windows, {buffer.pending} pending; expected 1 and 0"
            )
        return rows

    check(f"WindowBuffer + execute ({data.how})", run(), data.expected, ordered=True)
    seconds, cpu_s, out = timed(run, reps, warmup)
    return Timing(f"(b) WindowBuffer(Tumbling(Records({count}))).add + execute", len(out), data.records, seconds, cpu_s)


# --- Spark -------------------------------------------------------------------------------


def spark_join(orders: DataFrame, users: DataFrame, how: str) -> DataFrame:
    return orders.join(users, "user_id", how).select(*OUTPUT)


def _joins(plan: str) -> str:
    found = sorted(set(re.findall(r"\b(\w*Join)\b", plan)))
    return "+".join(found) if found else "?"


def join_strategy(df: DataFrame) -> str:
    """The physical join of an executed DataFrame; with AQE, "initial -> final"."""
    plan = df._jdf.queryExecution().executedPlan().toString()  # type: ignore[union-attr]
    if "== Final Plan ==" in plan and "== Initial Plan ==" in plan:
        final, _, initial = plan.partition("== Final Plan ==")[2].partition("== Initial Plan ==")
        return f"{_joins(initial)} -> (AQE) {_joins(final)}"
    return _joins(plan)


def bench_spark(
    spark: SparkSession, data: Data, reps: int, create_reps: int, warmup: int, budget_s: float
) -> tuple[Timing, Timing, dict[str, Any]]:
    info: dict[str, Any] = {}
    cpu = CpuClock(spark.sparkContext._gateway.proc.pid)  # type: ignore[union-attr]  # spark-submit execs java
    t = time.perf_counter()
    orders = spark.createDataFrame(data.orders, ORDERS_SCHEMA)
    users = spark.createDataFrame(data.users, USERS_SCHEMA)
    info["create_once_s"] = time.perf_counter() - t

    t = time.perf_counter()
    first = spark_join(orders, users, data.how).collect()
    info["first_collect_s"] = time.perf_counter() - t
    check(f"Spark join ({data.how})", first, data.expected, ordered=False)

    seconds, cpu_s, out = timed(lambda: spark_join(orders, users, data.how).collect(), reps, warmup, budget_s, cpu)
    warm = Timing("(c) Spark join+select+collect", len(out), data.records, seconds, cpu_s)
    df = spark_join(orders, users, data.how)
    df.collect()
    info["strategy"] = join_strategy(df)

    def with_create() -> list[Any]:
        o = spark.createDataFrame(data.orders, ORDERS_SCHEMA)
        u = spark.createDataFrame(data.users, USERS_SCHEMA)
        return spark_join(o, u, data.how).collect()

    check(f"Spark createDataFrame + join ({data.how})", with_create(), data.expected, ordered=False)
    seconds, cpu_s, out = timed(with_create, create_reps, 1, budget_s, cpu)
    cold = Timing("(c+) Spark createDataFrame x2 + join+select+collect", len(out), data.records, seconds, cpu_s)
    # createDataFrame alone, to split (c+) into its parts
    create_s, _, _ = timed(
        lambda: (spark.createDataFrame(data.orders, ORDERS_SCHEMA), spark.createDataFrame(data.users, USERS_SCHEMA)),
        create_reps,
        1,
        budget_s,
    )
    info["create_median_s"] = statistics.median(create_s)
    return warm, cold, info


# --- report ------------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def load_line() -> str:
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "load average n/a"
    return f"load average {one:.2f} / {five:.2f} / {fifteen:.2f} (1/5/15 min)"


def print_machine(spark: SparkSession) -> None:
    java = spark.sparkContext._jvm.System.getProperty("java.version")  # type: ignore[union-attr]
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"machine:  {platform.platform()}, {platform.machine()}, {cpu_model()}")
    print(
        f"          cpu count {os.cpu_count()} (usable {usable}), Python {platform.python_version()} "
        f"({platform.python_implementation()}), pyspark {pyspark.__version__}, Java {java}"
    )
    conf = spark.conf
    print(
        f"spark:    {SPARK_MASTER}, shuffle partitions {conf.get('spark.sql.shuffle.partitions')}, "
        f"AQE {conf.get('spark.sql.adaptive.enabled')}, "
        f"autoBroadcastJoinThreshold {conf.get('spark.sql.autoBroadcastJoinThreshold')}, "
        f"arrow {conf.get('spark.sql.execution.arrow.pyspark.enabled')}"
    )


def print_block(data: Data, results: list[Timing], info: dict[str, Any], n_missing: int) -> None:
    print()
    unmatched = f", {n_missing} orders unmatched" if data.how == "left" else ""
    print(
        f"== {data.how} join: window of {data.records:,} records ({len(data.orders):,} orders + {len(data.users):,} users"
        f"{unmatched}) -> {len(data.expected):,} joined rows; Spark plan: {info['strategy']}"
    )
    header = (
        f"{'method':<52} {'reps':>4} {'best ms':>8} {'median ms':>9} {'rows/s (median)':>16} {'rows/s (best)':>14} "
        f"{'records/s (median)':>18} {'CPU ms/rep':>10} {'rows/CPU-s':>11}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r.label:<52} {len(r.seconds):>4} {r.best * 1e3:>8.1f} {r.median * 1e3:>9.1f} {r.rows_per_s:>16,.0f} "
            f"{r.best_rows_per_s:>14,.0f} {r.records / r.median:>18,.0f} {r.cpu_per_rep * 1e3:>10.1f} {r.rows_per_cpu_s:>11,.0f}"
        )
    print(
        f"Spark extras: createDataFrame x2 once {info['create_once_s'] * 1e3:.0f} ms, first join+collect "
        f"{info['first_collect_s'] * 1e3:.0f} ms (untimed above), createDataFrame x2 median "
        f"{info['create_median_s'] * 1e3:.1f} ms"
    )
    a, b, c, cplus = results
    print("ratio stream_ops / Spark (>1 = stream_ops faster): rows/s median, best, per CPU-second")
    for s in (a, b):
        tag = s.label.split(" ", 1)[0]
        for spark_run in (c, cplus):
            other = spark_run.label.split(" ", 1)[0]
            print(
                f"  {tag} vs {other:<5} {s.rows_per_s / spark_run.rows_per_s:7.1f}x median  "
                f"{s.best_rows_per_s / spark_run.best_rows_per_s:7.1f}x best  "
                f"{s.rows_per_cpu_s / spark_run.rows_per_cpu_s:7.1f}x per CPU-s"
            )


# --- main --------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=5_000)
    parser.add_argument("--users", type=int, default=5_000)
    parser.add_argument("--unmatched", type=float, default=0.10, help="share of orders without a user (left join)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--reps", type=int, default=30, help="timed repetitions of (a) and (b)")
    parser.add_argument("--spark-reps", type=int, default=20, help="timed repetitions of (c)")
    parser.add_argument("--spark-create-reps", type=int, default=10, help="timed repetitions of (c+)")
    parser.add_argument(
        "--spark-budget",
        type=float,
        default=8.0,
        help=f"seconds per timed Spark series; stops early after >= {MIN_REPS} reps once exceeded",
    )
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs before each timed series")
    parser.add_argument("--joins", nargs="+", choices=["inner", "left"], default=["inner", "left"])
    args = parser.parse_args()

    started = time.perf_counter()
    t = time.perf_counter()
    spark = create_spark_session(master=SPARK_MASTER, app_name="bench-join")
    spark.sparkContext.setLogLevel("ERROR")
    session_s = time.perf_counter() - t
    try:
        print_machine(spark)
        print(
            f"host:     {load_line()} at start (the Python join uses one core; >{os.cpu_count()} means other "
            "processes compete for the CPUs and every number below is pessimistic)"
        )
        print(
            f"SparkSession ready in {session_s:.1f} s; seed {args.seed}; reps (a)/(b) {args.reps}, (c) {args.spark_reps}, "
            f"(c+) {args.spark_create_reps}, {args.warmup} warm-up runs each"
        )
        for how in args.joins:
            data = make_data(how, args.orders, args.users, args.unmatched, args.seed)
            n_missing = sum(1 for r in data.expected if r[3] is None)
            results = [bench_execute(data, args.reps, args.warmup), bench_tumbling(data, args.reps, args.warmup)]
            warm, cold, info = bench_spark(spark, data, args.spark_reps, args.spark_create_reps, args.warmup, args.spark_budget)
            results += [warm, cold]
            print_block(data, results, info, n_missing)
        print()
        print(f"all results verified against a dict-lookup join; total {time.perf_counter() - started:.1f} s; {load_line()}")
    finally:
        spark.sparkContext.setLogLevel("OFF")
        spark.stop()


if __name__ == "__main__":
    main()
