"""The local processes that run a large Arrow-read batch's per-record operations
(``compute/row_processes.py``): real child interpreters, really killed.

They give what the driver's thread gives for a real stage function (dead letters included),
report a function that raises or a process that dies as :class:`RowProcessError` and carry on
with a new process, keep what user functions print out of their protocol, get only the
allow-listed environment (pass-throughs included, no secret), and exit when the process that
started them is SIGKILLed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pyarrow as pa
import pytest

from stream_ops import Count, FileTopic, OpaqueMapState, Topology
from stream_ops.compute import stage_function
from stream_ops.compute.row_processes import RowProcesses
from stream_ops.dsl.build_plan import build_plan
from stream_ops.errors import RowProcessError
from stream_ops.examples.wordcount import split


def _word_count_rows():
    topology = Topology("pool")
    lines = topology.source("lines", FileTopic("/nonexistent/in", 1), schema={"sentence": "string"})
    lines.each(split, out="word", fields=["sentence"]).group_by("word").persistent_aggregate(
        Count(), out="c", state=OpaqueMapState
    )
    stage = build_plan(topology).stage(0)
    return stage_function.stage_rows(stage.operations, stage_function.output_plans(stage), "typed", "long")


def _sentences(n: int) -> list[pa.RecordBatch]:
    sentences = [f"w{i % 7} w{i % 11} w{i % 13}" if i % 97 else None for i in range(n)]  # None: split fails
    return pa.table({"sentence": sentences, "_corrupt_record": pa.nulls(n, pa.string())}).to_batches(max_chunksize=1_000)


def _rows(batches: list[pa.RecordBatch]) -> tuple[dict[tuple, int], list[str], int]:
    """(count per (out, key), dead letters, input rows) of the stage function's output."""
    table = pa.Table.from_batches(batches)
    counts: dict[tuple, int] = {}
    for row in table.to_pylist():
        if row["key"] is not None:
            counts[(row["out"], row["key"])] = counts.get((row["out"], row["key"]), 0) + row["value"]
    letters = sorted(d for d in table.column("dead").to_pylist() if d is not None)
    return counts, letters, sum(n for n in table.column("inputs").to_pylist() if n is not None)


@pytest.fixture
def pool() -> Iterator[RowProcesses]:
    processes = RowProcesses(2)
    try:
        yield processes
    finally:
        processes.shutdown()


def test_the_processes_give_what_the_driver_thread_gives(pool):
    stage_rows = _word_count_rows()
    batches = _sentences(5_000)
    on_thread = _rows(list(stage_rows(iter(batches))))
    in_processes = pool.run(stage_rows, batches, max_records=1_000)
    assert _rows(in_processes) == on_thread
    assert len(in_processes) >= 8, "two processes, four slices each"
    assert on_thread[1] and on_thread[2] == 5_000, "dead letters and every input row"


def raising(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    raise ValueError("a bug in the stage function")
    yield from batches


def exiting(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    os._exit(3)
    yield from batches


def printing(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        print("a user function prints", batch.num_rows)
        yield batch


def test_a_raising_function_or_a_dying_process_fails_the_batch_and_the_next_one_runs(pool):
    batches = _sentences(100)
    with pytest.raises(RowProcessError, match="ValueError: a bug in the stage function"):
        pool.run(raising, batches, max_records=1_000)
    with pytest.raises(RowProcessError, match="died"):
        pool.run(exiting, batches, max_records=1_000)
    assert pa.Table.from_batches(pool.run(printing, batches, max_records=1_000)).equals(pa.Table.from_batches(batches))


def slow(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    time.sleep(0.5)
    yield from batches


def test_a_batch_waiting_for_a_pool_that_is_shut_down_fails():
    pool = RowProcesses(1)
    pool.run(printing, _sentences(10), max_records=1_000)  # its process is up
    failures: list[BaseException] = []

    def run() -> None:
        try:
            pool.run(slow, _sentences(100), max_records=1_000)
        except RowProcessError as e:
            failures.append(e)

    runner = threading.Thread(target=run)
    runner.start()
    time.sleep(0.2)  # the first of its four slices is running, three wait
    pool.shutdown()
    runner.join(10)
    assert len(failures) == 1 and "shut down" in str(failures[0])


def stamped(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Each slice takes 0.1 s and says when it ended (CLOCK_MONOTONIC is one clock for every process)."""
    rows = sum(batch.num_rows for batch in batches)
    time.sleep(0.1)
    yield pa.record_batch({"rows": [rows], "ended": [time.monotonic()]})


def test_batches_that_need_the_processes_at_once_take_turns():
    pool = RowProcesses(1)
    try:
        pool.run(printing, _sentences(10), max_records=1_000)  # its process is up
        ended: dict[str, list[float]] = {}

        def run(name: str) -> None:
            out = pa.Table.from_batches(pool.run(stamped, _sentences(400), max_records=1_000))
            ended[name] = out.column("ended").to_pylist()

        large = threading.Thread(target=run, args=("large",))
        large.start()
        time.sleep(0.05)  # the large batch's first slice runs, three wait
        run("small")
        large.join(10)
    finally:
        pool.shutdown()
    assert len(ended["large"]) == len(ended["small"]) == 4
    # in turn: the small batch's slices ran between the large one's, not after them
    assert min(ended["small"]) < max(ended["large"]) and max(ended["small"]) > min(ended["large"])
    order = "".join(name[0] for _, name in sorted((t, name) for name, times in ended.items() for t in times))
    assert order.startswith(("lsl", "llsl")), order  # first in, first out would be "llllssss"


_SEEN_NAMES = ("STREAM_OPS_QUERY_TOKEN", "STREAM_OPS_ZK_AUTH", "DAGSTER_PG_PASSWORD", "OTHER_SETTING", "PASSED_SETTING", "PATH")


def environment(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for _ in batches:
        with open("/proc/self/environ", "rb") as f:
            started_with = {entry.partition(b"=")[0].decode() for entry in f.read().split(b"\0")}
        yield pa.record_batch(
            {
                "name": list(_SEEN_NAMES),
                "value": [os.environ.get(n) for n in _SEEN_NAMES],
                "started_with": [n in started_with for n in _SEEN_NAMES],
            }
        )


def test_the_processes_get_the_allow_listed_environment_and_pass_throughs_only(monkeypatch):
    for name in _SEEN_NAMES[:-1]:
        monkeypatch.setenv(name, f"{name.lower()}-value")
    monkeypatch.setenv("STREAM_OPS_WORKER_PASS_ENV", "PASSED_SETTING")
    pool = RowProcesses(1)
    try:
        seen = pa.Table.from_batches(pool.run(environment, _sentences(10), max_records=1_000)).to_pylist()
    finally:
        pool.shutdown()
    values = {row["name"]: row["value"] for row in seen}
    assert values == {
        "STREAM_OPS_QUERY_TOKEN": None,
        "STREAM_OPS_ZK_AUTH": None,
        "DAGSTER_PG_PASSWORD": None,
        "OTHER_SETTING": None,  # not allow-listed, not passed through
        "PASSED_SETTING": "passed_setting-value",
        "PATH": os.environ["PATH"],
    }
    assert {row["name"]: row["started_with"] for row in seen} == {name: values[name] is not None for name in _SEEN_NAMES}


_PARENT = textwrap.dedent(
    """
    import os, sys, time
    import pyarrow as pa
    from stream_ops.compute.row_processes import RowProcesses
    from test_row_processes import printing
    pool = RowProcesses(2)
    pool.run(printing, [pa.record_batch({"x": list(range(100))})], max_records=10)
    children = pool.pids
    print(" ".join(map(str, children)), flush=True)
    time.sleep(600)
    """
)


def test_the_processes_exit_when_their_parent_is_killed():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), *sys.path])}
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    try:
        assert parent.stdout is not None
        children = [int(pid) for pid in parent.stdout.readline().split()]
        assert len(children) == 2
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in children):
            assert time.monotonic() < deadline, "the processes outlived their parent"
            time.sleep(0.1)
    finally:
        parent.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False
