"""Failover time of a keyed task after a worker is SIGKILLed (or SIGTERMed), split into phases, per state size.

``--signals kill,standby,term,term-standby`` runs each size four times: after a SIGKILL detection waits
for the dead worker's session to expire and the new owner rebuilds the state (snapshot + tail,
or the whole state topic); ``standby`` is a SIGKILL of a topology submitted with
``standby_replicas=1``, so the other worker kept a warm copy of the keyed task's store and the
new owner applies only the state-topic tail since its last sync; after a SIGTERM the worker
releases its tasks as it stops, so the failover is bounded by the new owner's start
(``term-standby``: the same with a standby replica, so the new owner does not rebuild, and the
stopping worker moves the task onto the standby itself instead of waiting for the nimbus;
the report notes which of the two moved it).
Note that "first commit" needs new input: right after a SIGTERM the new owner's first batch
waits for the trickle's next file to pass the source stage (its trigger) and its own trigger.

For each state size (``--sizes``, default 10k and 1M keys) a fresh local stack runs: an
embedded ZooKeeper, two ``stream-ops worker`` processes and the leader-elected nimbus monitor
(in this process). A word count with ``queues=1`` is submitted (1 source task + 1 keyed task,
one per worker), and its keyed state is built by feeding unique words (``w0000000 ...``,
``--words-per-line`` words per sentence line, ``--lines-per-file`` lines per file) until every
word is counted and the committed txids stop moving. Then a trickle of new sentences starts,
the worker that owns the keyed task is SIGKILLed (its whole process group, JVM included), and
ZooKeeper watches (plus the new owner's log) time each moved task through:

  1. detection    SIGKILL -> the assignment no longer names the dead worker (the monitor saw
                  its ``/workers`` node vanish, ~session timeout after the kill);
  2. new owner    reassignment -> the task's ``/owners`` node held by a live worker under a
                  higher epoch (includes the wait for the dead owner's ephemeral node);
  3. state replay the new owner's rebuild of the task's RocksDB from the state topic (from
                  its log line "state rebuilt from the state topic, K keys in S s");
  4. first commit new owner acquired -> the task's ``committed_txid`` passes its value at
                  kill time (includes 3, then the Spark query start and the first batch).

Times come from the records themselves where they carry one (the assignment's start time of
the moved task, the owner node's ``since``, the commit's ``committed_at``: all written by
processes on this machine) and from watch arrival times otherwise. After the measurement the
trickle stops and the benchmark checks that a sample of the built keys and every trickle word
count exactly 1 on the new owner (the rebuilt state is right, nothing was lost or doubled).

It prints figures only (no speed asserts).

Run: ``.venv/bin/python bench/failover.py [--sizes 10000,1000000] [--max-files-per-trigger 4]``
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyspark

from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.dsl.build_plan import build_plan
from stream_ops.errors import QueryError, StreamOpsError
from stream_ops.examples.wordcount import build_wordcount
from stream_ops.local_stack import LocalStack, WorkerProcess
from stream_ops.nimbus import describe_topology, submit
from stream_ops.runtime.query_client import query_state
from stream_ops.topics.file_topic import FileTopic
from stream_ops.topics.producer import produce
from stream_ops.topology.layout import TopologyLayout

REBUILT_RE = re.compile(r"task (\S+)/(\d+): state rebuilt from the state topic, (\d+) keys in ([\d.]+) s")
TAIL_RE = re.compile(
    r"task (\S+)/(\d+): kept the local state store \(no rebuild\), applied the state-topic tail only: (\d+) changed keys in ([\d.]+) s"
)
RUNNING_RE = re.compile(r"task (\S+)/(\d+) running on (\S+) \(epoch (\d+)\)")
OWNS_RE = re.compile(r"owns task (\S+)/(\d+), epoch")
STORE_RE = re.compile(r"(rebuilding state store|rebuilt state store) \S*/([^/\s]+)/task-(\d+)")
LOG_TIME_RE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")


def log(msg: str) -> None:
    """Progress (stderr, so that stdout holds the report)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- watching ZooKeeper ----------------------------------------------------------------------


class Recorder:
    """Every change of a few znodes, with the time this process saw it (kazoo watches)."""

    def __init__(self, store: ZkStore) -> None:
        self.store = store
        self.lock = threading.Lock()
        self.events: list[tuple[float, str, Any]] = []
        self.changed = threading.Condition(self.lock)

    def watch_data(self, path: str) -> None:
        def on_data(data: bytes | None, stat: Any) -> None:
            value = None if data is None else json.loads(data.decode("utf-8"))
            self._add(path, value)

        self.store.client.DataWatch(path, on_data)

    def watch_children(self, path: str) -> None:
        def on_children(children: list[str]) -> None:
            self._add(path, sorted(children))

        self.store.client.ChildrenWatch(path, on_children)

    def _add(self, path: str, value: Any) -> None:
        with self.changed:
            self.events.append((time.time(), path, value))
            self.changed.notify_all()

    def history(self, path: str, since: float = 0.0) -> list[tuple[float, Any]]:
        with self.lock:
            return [(t, v) for t, p, v in self.events if p == path and t >= since]

    def wait(self, timeout_s: float) -> None:
        with self.changed:
            self.changed.wait(timeout_s)


class NimbusLog(logging.Handler):
    """Keeps the in-process monitor's warnings and reassignment messages."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if record.levelno >= logging.WARNING or "reassigned" in msg:
            self.records.append((record.created, f"{record.levelname} {msg}"))


# --- input -----------------------------------------------------------------------------------


def word(i: int) -> str:
    return f"w{i:07d}"


def feed_keys(topic: FileTopic, keys: int, words_per_line: int, lines_per_file: int, *, start: int = 0) -> int:
    """Write the unique words ``start .. keys-1`` as sentences; returns the number of files written."""
    lines = (
        {"sentence": " ".join(word(i) for i in range(first, min(first + words_per_line, keys)))}
        for first in range(start, keys, words_per_line)
    )
    n_lines = (keys - start + words_per_line - 1) // words_per_line
    if n_lines <= 0:
        return 0
    produce(topic, lines, records_per_file=lines_per_file)
    return (n_lines + lines_per_file - 1) // lines_per_file


class Trickle(threading.Thread):
    """A small file of new unique words (``t000000 ...``) every ``interval_s``."""

    def __init__(self, topic: FileTopic, interval_s: float, words_per_file: int) -> None:
        super().__init__(name="trickle", daemon=True)
        self.topic = topic
        self.interval_s = interval_s
        self.words_per_file = words_per_file
        self.stop_event = threading.Event()
        self.words: list[str] = []

    def run(self) -> None:
        n = 0
        while not self.stop_event.is_set():
            batch = [f"t{n + i:06d}" for i in range(self.words_per_file)]
            n += self.words_per_file
            produce(self.topic, [{"sentence": " ".join(batch)}])
            self.words.extend(batch)
            self.stop_event.wait(self.interval_s)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(10)


# --- waiting ---------------------------------------------------------------------------------


def wait_drained(
    store: ZkStore,
    topology_id: str,
    name: str,
    check_words: list[str],
    *,
    quiet_s: float,
    timeout_s: float,
    label: str,
) -> dict[str, Any]:
    """Wait until, for ``quiet_s`` without a break, every task is owned by its assigned worker,
    has no unread input file and no batch in flight (heartbeats) and no committed txid moved;
    then until every check word counts 1. Returns the last status seen.

    A quiet committed txid alone is not enough: a keyed batch of 400k keys runs for 20+ s, and
    its keys are readable (flushed to RocksDB) a moment before its ZooKeeper commit."""
    started = time.monotonic()
    deadline = started + timeout_s
    last_txids: tuple[int, ...] | None = None
    stable_since = time.monotonic()
    next_report = started + 10
    while True:
        status = describe_topology(store, topology_id)
        txids = tuple(t.committed_txid for t in status.tasks)
        now = time.monotonic()
        settled = all(
            t.owner is not None and t.owner == t.assigned_to and t.lag_files == 0 and t.txid_in_flight is None
            for t in status.tasks
        )
        if txids != last_txids or not settled:
            last_txids, stable_since = txids, now
        if settled and now - stable_since >= quiet_s:
            try:
                got = query_state(store, name, "words", [[w] for w in check_words], timeout_s=30)
            except QueryError as e:
                got = {"error": str(e)}
            if all(got.get(w) == 1 for w in check_words):
                return {"status": status, "seconds": now - started}
        if now > deadline:
            raise StreamOpsError(f"{label}: not drained after {timeout_s:.0f} s: {status}")
        if now >= next_report:
            log(
                f"{label}: +{now - started:.0f}s "
                + "  ".join(
                    f"task {t.task_id}: txid {t.committed_txid} in flight {t.txid_in_flight} lag {t.lag_files} "
                    f"keys~{t.state_keys}"
                    for t in status.tasks
                )
            )
            next_report = now + 10
        time.sleep(0.25)


def check_counts(store: ZkStore, name: str, words: list[str], chunk: int = 200) -> list[str]:
    """Words whose count is not exactly 1 (queried in chunks: keys travel in a URL)."""
    wrong = []
    for i in range(0, len(words), chunk):
        part = words[i : i + chunk]
        got = query_state(store, name, "words", [[w] for w in part], timeout_s=30)
        wrong.extend(w for w in part if got.get(w) != 1)
    return wrong


# --- worker log ------------------------------------------------------------------------------


def log_time(line: str) -> float | None:
    m = LOG_TIME_RE.match(line)
    if not m:
        return None
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp() + int(m.group(2)) / 1000.0


def parse_worker_log(path: Path, topology_id: str, since: float) -> dict[int, dict[str, Any]]:
    """Per task: the rebuild (keys, seconds, log time) and 'running' (epoch, log time) after ``since``."""
    found: dict[int, dict[str, Any]] = {}
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return found
    for line in text.splitlines():
        t = log_time(line)
        if t is None or t < since - 0.001:
            continue
        m = REBUILT_RE.search(line)
        if m and m.group(1) == topology_id:
            found.setdefault(int(m.group(2)), {}).update(rebuilt_keys=int(m.group(3)), rebuilt_s=float(m.group(4)), rebuilt_at=t)
            continue
        m = TAIL_RE.search(line)
        if m and m.group(1) == topology_id:
            found.setdefault(int(m.group(2)), {}).update(
                rebuilt_keys=int(m.group(3)), rebuilt_s=float(m.group(4)), rebuilt_at=t, tail_only=True
            )
            continue
        m = RUNNING_RE.search(line)
        if m and m.group(1) == topology_id:
            found.setdefault(int(m.group(2)), {}).update(running_epoch=int(m.group(4)), running_at=t)
            continue
        m = OWNS_RE.search(line)
        if m and m.group(1) == topology_id:
            found.setdefault(int(m.group(2)), {}).setdefault("owns_at", t)
            continue
        # the rebuild's own progress lines (stream_ops.state.state_topic), matched by task directory
        m = STORE_RE.search(line)
        if m and m.group(2) == topology_id:
            key = "read_done_at" if m.group(1) == "rebuilding state store" else "restored_at"
            found.setdefault(int(m.group(3)), {}).setdefault(key, t)
    return found


def log_lines_after(path: Path, since: float, pattern: str, limit: int = 20) -> list[str]:
    out = []
    try:
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            t = log_time(line)
            if t is not None and t >= since and re.search(pattern, line):
                out.append(line)
    except OSError:
        pass
    return out[-limit:]


# --- one run ---------------------------------------------------------------------------------


@dataclass
class TaskFailover:
    task_id: int
    stage: str
    new_worker: str | None = None
    old_epoch: int | None = None
    new_epoch: int | None = None
    kill_txid: int | None = None
    first_txid: int | None = None
    worker_gone: float | None = None  # seconds after the kill, for all rows the same
    reassigned: float | None = None
    acquired: float | None = None
    running: float | None = None
    committed: float | None = None
    rebuilt_keys: int | None = None
    rebuilt_s: float | None = None
    tail_only: bool = False  # the new owner kept a standby's store and applied the tail
    read_s: float | None = None  # owner acquired -> state-topic files read and decoded (new owner's log)
    restore_s: float | None = None  # -> keys written to RocksDB

    @property
    def detection(self) -> float | None:
        return self.reassigned

    @property
    def new_owner(self) -> float | None:
        return None if self.acquired is None or self.reassigned is None else self.acquired - self.reassigned

    @property
    def first_commit(self) -> float | None:
        return None if self.committed is None or self.acquired is None else self.committed - self.acquired


@dataclass
class RunResult:
    keys: int
    signal: str = "kill"
    files: int = 0
    warmup_s: float = 0.0
    fed_keys: int = 0
    build_produce_s: float = 0.0
    build_source_done_s: float | None = None
    build_keyed_done_s: float | None = None
    build_drained_s: float = 0.0
    source_batches: int = 0
    keyed_batches: int = 0
    keyed_batch_s: list[float] = field(default_factory=list)
    source_batch_s: list[float] = field(default_factory=list)
    load: list[str] = field(default_factory=list)
    state_files: int = 0
    state_bytes: int = 0
    killed: str = ""
    survivor: str = ""
    tasks: list[TaskFailover] = field(default_factory=list)
    verify: str = ""
    events: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def commits(recorder: Recorder, path: str, since: float = 0.0) -> list[dict[str, Any]]:
    """Distinct commits seen on a /transactional node (committed_txid, committed_at, rows)."""
    seen: dict[int, dict[str, Any]] = {}
    for _, value in recorder.history(path, since):
        if value and value.get("committed_txid", -1) >= 0 and value.get("committed_at"):
            seen.setdefault(value["committed_txid"], value)
    return [seen[k] for k in sorted(seen)]


def dir_size(path: Path) -> tuple[int, int]:
    files = size = 0
    for p in path.rglob("*"):
        if p.is_file():
            files += 1
            size += p.stat().st_size
    return files, size


def wait_standby_current(store: ZkStore, topology_id: str, task_id: int, timeout_s: float) -> str:
    """Wait until a standby of ``task_id`` has applied the task's committed txid; says how it went."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        tx = store.get_json(ZkPaths.transactional_task(topology_id, task_id))
        committed = tx[0]["committed_txid"] if tx else -1
        for name in store.children(ZkPaths.standbys(topology_id)):
            parsed = ZkPaths.parse_standby(name)
            if parsed is None or parsed[0] != task_id:
                continue
            worker = parsed[1]
            found = store.get_json(ZkPaths.standby(topology_id, task_id, worker))
            if found and found[0]["applied_txid"] >= committed >= 0:
                return f"standby on {worker} at txid {found[0]['applied_txid']} (committed {committed}, {found[0]['keys']} keys)"
        time.sleep(0.2)
    return f"no standby of task {task_id} caught up within {timeout_s:.0f} s"


def run_size(keys: int, args: argparse.Namespace, nimbus_log: NimbusLog, signal_name: str = "kill") -> RunResult:
    result = RunResult(keys=keys, signal=signal_name)
    standby = signal_name in ("standby", "term-standby")
    signal_name = "term" if signal_name.startswith("term") else "kill"
    result.load.append(loadavg())
    home = Path(tempfile.mkdtemp(prefix=f"failover-{keys}-", dir=args.tmp))
    worker_args = [
        "--trigger-seconds",
        str(args.trigger_seconds),
        "--max-files-per-trigger",
        str(args.max_files_per_trigger),
        "--heartbeat-interval",
        str(args.heartbeat_interval),
        "--spark-master",
        args.spark_master,
        *[arg for item in args.spark_conf for arg in ("--spark-conf", item)],
    ]
    name = f"fo{keys}"
    nimbus_log.records.clear()
    try:
        log(f"{keys} keys: starting ZooKeeper, 2 workers and the nimbus monitor under {home}")
        with (
            LocalStack(
                home=home,
                workers=2,
                worker_args=worker_args,
                session_timeout_s=args.session_timeout,
                task_timeout_s=args.task_timeout,
                launch_grace_s=args.launch_grace,
            ) as stack,
            ZkStore.connect(stack.zk_config) as store,
        ):
            topology = build_wordcount(home / "input" / "sentences", name=name, queues=1)
            plan = build_plan(topology)
            keyed_tasks = {t.task_id for t in plan.tasks if plan.stage(t.stage).kind == "keyed"}
            topic: FileTopic = topology.chains[0].source.topic
            topology_id = submit(store, stack.cluster, topology, workers=2, standby_replicas=1 if standby else 0)
            task_ids = [t.task_id for t in plan.tasks]
            recorder = Recorder(store)
            recorder.watch_data(ZkPaths.assignment(topology_id))
            recorder.watch_children(ZkPaths.WORKERS)
            for task_id in task_ids:
                recorder.watch_data(ZkPaths.owner(topology_id, task_id))
                recorder.watch_data(ZkPaths.transactional_task(topology_id, task_id))

            # --- warm up: the first line of words through both tasks (queries started, JIT) ---
            first = min(args.words_per_line, keys)
            warm_started = time.time()
            produce(topic, [{"sentence": " ".join(word(i) for i in range(first))}])
            wait_drained(
                store,
                topology_id,
                name,
                [word(first - 1)],
                quiet_s=args.quiet,
                timeout_s=args.build_timeout,
                label=f"{keys} keys warm-up",
            )
            result.warmup_s = time.time() - warm_started
            result.fed_keys = keys - first

            # --- build the state -----------------------------------------------------------
            build_started = time.time()
            result.files = feed_keys(topic, keys, args.words_per_line, args.lines_per_file, start=first)
            result.build_produce_s = time.time() - build_started
            log(f"{keys} keys: produced {result.files} files in {result.build_produce_s:.2f} s; waiting for the state")
            rng = random.Random(keys)
            sample = sorted({word(rng.randrange(keys)) for _ in range(args.sample)} | {word(0), word(keys - 1)})
            drained = wait_drained(
                store,
                topology_id,
                name,
                [word(keys - 1), word(0)],
                quiet_s=args.quiet,
                timeout_s=args.build_timeout,
                label=f"{keys} keys build",
            )
            result.build_drained_s = time.time() - build_started
            for task_id in task_ids:
                done = [
                    c
                    for c in commits(recorder, ZkPaths.transactional_task(topology_id, task_id), build_started)
                    if c.get("rows", 0) > 0
                ]
                last = max((c["committed_at"] for c in done), default=None)
                elapsed = None if last is None else last - build_started
                if task_id in keyed_tasks:
                    result.keyed_batches, result.build_keyed_done_s = len(done), elapsed
                    times = [build_started] + [c["committed_at"] for c in done]
                    result.keyed_batch_s = [b - a for a, b in zip(times, times[1:])]
                else:
                    result.source_batches, result.build_source_done_s = len(done), elapsed
                    times = [build_started] + [c["committed_at"] for c in done]
                    result.source_batch_s = [b - a for a, b in zip(times, times[1:])]
            layout = TopologyLayout(stack.cluster, topology_id)
            for stage in plan.stages:
                if stage.kind == "keyed":
                    result.state_files, result.state_bytes = dir_size(layout.state_topic(stage).root)
            wrong = check_counts(store, name, sample)
            if wrong:
                result.notes.append(f"before the kill, {len(wrong)} sample words do not count 1: {wrong[:5]}")

            # --- kill the owner of the keyed task ------------------------------------------
            status = drained["status"]
            by_task = {t.task_id: t for t in status.tasks}
            keyed_owner = by_task[min(keyed_tasks)].owner
            victim: WorkerProcess = next(w for w in stack.worker_processes if w.worker_id == keyed_owner)
            survivor = next(w for w in stack.worker_processes if w is not victim)
            result.killed, result.survivor = victim.worker_id, survivor.worker_id
            moved = [t for t in status.tasks if t.assigned_to == victim.worker_id]
            if standby:
                result.notes.append(wait_standby_current(store, topology_id, min(keyed_tasks), args.build_timeout))
            trickle = Trickle(topic, args.trickle_interval, args.trickle_words)
            trickle.start()
            time.sleep(args.trickle_lead)
            kill_txids = {}
            for t in moved:
                tx = store.get_json(ZkPaths.transactional_task(topology_id, t.task_id))
                kill_txids[t.task_id] = tx[0]["committed_txid"] if tx else -1
            log(
                f"{keys} keys: SIG{signal_name.upper()} {victim.worker_id} (owns tasks {[t.task_id for t in moved]}); "
                f"survivor {survivor.worker_id}"
            )
            t_kill = time.time()
            if signal_name == "term":
                victim.proc.send_signal(signal.SIGTERM)
                victim.proc.wait(120)
                stack.worker_processes.remove(victim)
                result.notes.append(f"the SIGTERMed worker exited {time.time() - t_kill:.2f} s after the signal")
            else:
                stack.kill_worker(victim)
            # a commit may have landed between our read and the kill
            for t in moved:
                before = [
                    c
                    for c in commits(recorder, ZkPaths.transactional_task(topology_id, t.task_id))
                    if c["committed_at"] <= t_kill
                ]
                if before:
                    kill_txids[t.task_id] = max(kill_txids[t.task_id], before[-1]["committed_txid"])

            rows = {
                t.task_id: TaskFailover(
                    task_id=t.task_id, stage=t.stage_name, old_epoch=t.owner_epoch, kill_txid=kill_txids[t.task_id]
                )
                for t in moved
            }
            deadline = time.monotonic() + args.failover_timeout
            while time.monotonic() < deadline:
                gone = [ts for ts, children in recorder.history(ZkPaths.WORKERS, t_kill) if victim.worker_id not in children]
                for task_id, row in rows.items():
                    row.worker_gone = gone[0] - t_kill if gone else None
                    if row.reassigned is None:
                        for ts, value in recorder.history(ZkPaths.assignment(topology_id), t_kill):
                            worker = (value or {}).get("tasks", {}).get(str(task_id))
                            if worker and worker != victim.worker_id:
                                start = (value.get("start_times") or {}).get(str(task_id))
                                row.reassigned = (start if start and start >= t_kill else ts) - t_kill
                                row.new_worker = worker
                                break
                    if row.acquired is None:
                        for ts, value in recorder.history(ZkPaths.owner(topology_id, task_id), t_kill):
                            if value and value["worker_id"] != victim.worker_id and value["epoch"] > (row.old_epoch or 0):
                                row.acquired = max(value.get("since", ts), t_kill) - t_kill
                                row.new_epoch = value["epoch"]
                                break
                    if row.committed is None:
                        for c in commits(recorder, ZkPaths.transactional_task(topology_id, task_id), t_kill):
                            if (
                                c["committed_txid"] > (row.kill_txid if row.kill_txid is not None else -1)
                                and c.get("committed_epoch") == row.new_epoch
                            ):
                                row.committed = c["committed_at"] - t_kill
                                row.first_txid = c["committed_txid"]
                                break
                if all(r.committed is not None for r in rows.values()):
                    break
                recorder.wait(0.5)
            parsed = parse_worker_log(survivor.log, topology_id, t_kill)
            for task_id, row in rows.items():
                info = parsed.get(task_id, {})
                if info.get("running_epoch") == row.new_epoch or row.new_epoch is None:
                    row.running = info["running_at"] - t_kill if "running_at" in info else None
                if task_id in keyed_tasks:
                    row.rebuilt_keys = info.get("rebuilt_keys")
                    row.rebuilt_s = info.get("rebuilt_s")
                    row.tail_only = bool(info.get("tail_only"))
                    if "owns_at" in info and "read_done_at" in info:
                        row.read_s = info["read_done_at"] - info["owns_at"]
                        if "restored_at" in info:
                            row.restore_s = info["restored_at"] - info["read_done_at"]
                if row.committed is None:
                    result.notes.append(f"task {task_id}: no commit by the new owner within {args.failover_timeout:.0f} s")
            result.tasks = sorted(rows.values(), key=lambda r: r.task_id)
            # keep the trickle going a little, so that commits continue after the first one
            time.sleep(args.trickle_tail)
            trickle.stop()

            # --- verify: the rebuilt state and the trickle words count exactly 1 ------------
            log(f"{keys} keys: failover measured; verifying {len(sample)} sample keys + {len(trickle.words)} trickle words")
            try:
                wait_drained(
                    store,
                    topology_id,
                    name,
                    trickle.words[-1:] or [word(0)],
                    quiet_s=args.quiet,
                    timeout_s=args.build_timeout,
                    label=f"{keys} keys after failover",
                )
                wrong = check_counts(store, name, sample + trickle.words)
                result.verify = (
                    "ok" if not wrong else f"{len(wrong)} WRONG, e.g. {wrong[:5]}"
                ) + f" ({len(sample)} sample keys, {len(trickle.words)} trickle words)"
            except StreamOpsError as e:
                result.verify = f"not verified: {e}"[:300]
            final = describe_topology(store, topology_id)
            keyed_final = [t for t in final.tasks if t.task_id in keyed_tasks]
            if keyed_final:
                result.notes.append(
                    f"keyed task after failover: owner {keyed_final[0].owner}, state_keys~{keyed_final[0].state_keys}"
                )
            events = [(ts, f"+{ts - t_kill:6.2f}s nimbus: {msg[:220]}") for ts, msg in nimbus_log.records if ts >= t_kill]
            pattern = (
                r"owns task|opened state store|state-topic files|rebuilding state store|rebuilt state store|"
                r"state rebuilt|state-topic tail|running on|WARNING|ERROR|waiting for its owner"
            )
            for line in log_lines_after(survivor.log, t_kill, pattern, 20):
                t = log_time(line)
                text = line[24:].replace(str(home), "$HOME")
                events.append((t or t_kill, f"+{(t or t_kill) - t_kill:6.2f}s survivor: {text[:240]}"))
            # the stopped worker's own handover to the standby (SIGTERM), or why it did not hand over
            for line in log_lines_after(victim.log, t_kill, r"handed its tasks over|not hand|stopped on|signal", 10):
                t = log_time(line)
                events.append((t or t_kill, f"+{(t or t_kill) - t_kill:6.2f}s stopped: {line[24:][:240]}"))
            handovers = log_lines_after(victim.log, t_kill, r"handed its tasks over to their standbys", 5)
            if signal_name == "term":
                result.notes.append(
                    "assignment moved by the stopping worker's own handover to the standby (not the nimbus)"
                    if handovers
                    else "assignment moved by the nimbus (no handover by the stopping worker)"
                )
            result.events = [text for _, text in sorted(events, key=lambda e: e[0])]
    finally:
        result.load.append(loadavg())
        if not args.keep:
            shutil.rmtree(home, ignore_errors=True)
    return result


# --- report ----------------------------------------------------------------------------------


def loadavg() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"


def fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def machine_info() -> list[str]:
    try:
        java = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=20).stderr.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        java = "?"
    try:
        repo = Path(__file__).resolve().parent.parent
        rev = subprocess.run(
            ["git", "-C", str(repo), "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = "?"
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",)
    return [
        f"platform   {platform.platform()}",
        f"cpus       {os.cpu_count()}   load average at start {', '.join(f'{x:.2f}' for x in load)}",
        f"python     {platform.python_version()} ({sys.executable})",
        f"pyspark    {pyspark.__version__}   java: {java}",
        f"stream_ops {rev}",
    ]


def report(results: list[RunResult], args: argparse.Namespace, info: list[str], total_s: float) -> None:
    print("== failover benchmark: SIGKILL of the worker owning the keyed task ==")
    for line in info:
        print(line)
    print(
        f"settings   2 workers, word count queues=1 (1 source + 1 keyed task, opaque state); "
        f"ZooKeeper session timeout {args.session_timeout} s (tickTime 500 ms); "
        f"monitor interval 0.5 s, task_timeout {args.task_timeout} s, launch_grace {args.launch_grace} s; "
        f"worker --trigger-seconds {args.trigger_seconds} --max-files-per-trigger {args.max_files_per_trigger} "
        f"--heartbeat-interval {args.heartbeat_interval} --spark-master {args.spark_master}"
        f"{''.join(f' --spark-conf {item}' for item in args.spark_conf)}; "
        f"input {args.words_per_line} words/line x {args.lines_per_file} lines/file; "
        f"trickle {args.trickle_words} new words every {args.trickle_interval} s from {args.trickle_lead} s before the kill"
    )
    print()
    print(
        "-- building the state: after a warm-up (the first line of words through both tasks, from submit: "
        "Spark query start + first batches), the remaining words through the source stage, the shuffle "
        "and the keyed stage; times from the first file written --"
    )
    print(
        f"{'keys':>9} {'warm-up s':>9} {'files':>5} {'produce s':>9} {'source done s':>13} {'keyed done s':>12} "
        f"{'drained s':>9} {'src batches':>11} {'keyed batches':>13} {'keys/s':>8} {'state topic':>16}"
    )
    for r in results:
        rate = r.fed_keys / r.build_keyed_done_s if r.build_keyed_done_s else None
        print(
            f"{r.keys:>9} {r.warmup_s:>9.1f} {r.files:>5} {r.build_produce_s:>9.2f} {fmt(r.build_source_done_s, 1):>13} "
            f"{fmt(r.build_keyed_done_s, 1):>12} {r.build_drained_s:>9.1f} {r.source_batches:>11} "
            f"{r.keyed_batches:>13} {fmt(rate, 0):>8} {r.state_files:>5} f {r.state_bytes / 1e6:>7.1f} MB"
        )
    for r in results:
        for what, gaps in (("source", r.source_batch_s), ("keyed", r.keyed_batch_s)):
            if gaps:
                print(
                    f"  {r.keys} keys: {what} commits at intervals of "
                    f"{', '.join(f'{s:.1f}' for s in gaps[:30])} s{' ...' if len(gaps) > 30 else ''}"
                )
        print(f"  {r.keys} keys: load average (1, 5, 15 min) before the run {r.load[0]}, after {r.load[-1]}")
    print()
    print(
        "-- failover, seconds (detect/owner/commit columns are offsets from the previous event; "
        "'total' = SIGKILL -> first commit of the new owner) --"
    )
    header = (
        f"{'keys':>9} {'task':>4} {'stage':<10} {'from -> to':<33} {'epoch':>6} {'ws gone':>7} "
        f"{'1 detect':>8} {'2 owner':>7} {'3 replay':>8} {'keys replayed':>13} {'query up':>8} "
        f"{'4 commit':>8} {'total':>6}"
    )
    print(header)
    for r in results:
        if r.signal == "term":
            print(f"{r.keys:>9}  after a SIGTERM (tasks released by the stopping worker, no session expiry):")
        elif r.signal == "term-standby":
            print(f"{r.keys:>9}  after a SIGTERM, with a standby replica of the keyed task ('3 replay' = its tail):")
        elif r.signal == "standby":
            print(f"{r.keys:>9}  after a SIGKILL, with a standby replica of the keyed task ('3 replay' = its tail):")
        for t in r.tasks:
            total = t.committed
            query_up = None if t.running is None or t.acquired is None else t.running - t.acquired
            print(
                f"{r.keys:>9} {t.task_id:>4} {t.stage:<10} {r.killed + ' -> ' + (t.new_worker or '?'):<33} "
                f"{str(t.old_epoch) + '->' + str(t.new_epoch):>6} {fmt(t.worker_gone):>7} {fmt(t.detection):>8} "
                f"{fmt(t.new_owner):>7} {fmt(t.rebuilt_s, 3):>8} {fmt(t.rebuilt_keys, 0) if t.rebuilt_keys is not None else '-':>13} "
                f"{fmt(query_up):>8} {fmt(t.first_commit):>8} {fmt(total):>6}"
            )
            if t.read_s is not None:
                print(
                    f"{'':>9} {'':>4} replay split (new owner's log): state-topic files read and decoded "
                    f"{t.read_s:.2f} s, then {fmt(t.rebuilt_keys, 0) if t.rebuilt_keys is not None else '?'} keys "
                    f"written to RocksDB {fmt(t.restore_s)} s"
                )
        worst = max((t.committed for t in r.tasks if t.committed is not None), default=None)
        print(
            f"{r.keys:>9}  all {len(r.tasks)} moved task(s) committing again {fmt(worst)} s after the "
            f"{r.signal} "
            f"(max over tasks); verification: {r.verify}"
        )
    print()
    print("columns: 'ws gone' = the dead worker's /workers node vanished (session expiry) after the kill;")
    print("  1 detect = SIGKILL -> assignment without the dead worker; 2 owner = reassignment -> new owner's /owners")
    print("  node (higher epoch); 3 replay = the new owner's rebuild from the state topic (its log); 'query up' =")
    print("  owner acquired -> 'running' logged (replay + Spark query start); 4 commit = owner acquired -> first")
    print("  commit past the txid at kill time (includes 3 and 'query up').")
    for r in results:
        if r.events or r.notes:
            print()
            print(f"-- {r.keys} keys, {r.signal}: events after it ({r.killed} stopped, survivor {r.survivor}) --")
            for line in r.events:
                print(line)
            for note in r.notes:
                print(f"note: {note}")
    print()
    print("-- targets (SIGKILL/SIGTERM -> first commit elsewhere, at 1M keys; other sizes shown against the same) --")
    targets = {"standby": 6.0, "kill": 8.0, "term": 1.0, "term-standby": 1.0}
    for r in results:
        worst = max((t.committed for t in r.tasks if t.committed is not None), default=None)
        target = targets.get(r.signal)
        verdict = "-" if worst is None or target is None else ("PASS" if worst <= target else "MISS")
        print(f"{r.keys:>9} keys  {r.signal:<8} {fmt(worst):>6} s  target <= {target} s: {verdict}")
    print()
    print(f"benchmark wall time {total_s:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,1000000", help="state sizes in keys, comma-separated")
    parser.add_argument("--session-timeout", type=float, default=4.0)
    parser.add_argument(
        "--task-timeout",
        type=float,
        default=6.0,
        help="monitor heartbeat timeout; above the ~4.3-4.9 s session expiry so detection is by "
        "the /workers node vanishing, not by a stale heartbeat",
    )
    parser.add_argument("--launch-grace", type=float, default=60.0)
    parser.add_argument("--trigger-seconds", type=float, default=0.5)
    parser.add_argument("--max-files-per-trigger", type=int, default=4)
    parser.add_argument("--heartbeat-interval", type=float, default=0.5)
    parser.add_argument("--spark-master", default="local[2]")
    parser.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting passed to the workers (repeatable)",
    )
    parser.add_argument("--words-per-line", type=int, default=1000)
    parser.add_argument("--lines-per-file", type=int, default=50)
    parser.add_argument("--sample", type=int, default=1000, help="random built keys checked after the failover")
    parser.add_argument("--trickle-interval", type=float, default=0.25)
    parser.add_argument("--trickle-words", type=int, default=5)
    parser.add_argument("--trickle-lead", type=float, default=1.0, help="seconds of trickle before the kill")
    parser.add_argument("--trickle-tail", type=float, default=3.0, help="seconds of trickle after the first commit")
    parser.add_argument("--quiet", type=float, default=2.5, help="seconds without a commit that count as drained")
    parser.add_argument("--build-timeout", type=float, default=900.0)
    parser.add_argument("--failover-timeout", type=float, default=300.0)
    parser.add_argument("--tmp", default=None, help="parent of the stack's home directory")
    parser.add_argument(
        "--signals",
        default="kill,standby,term,term-standby",
        help="kill (SIGKILL), standby (SIGKILL with a standby replica), term (SIGTERM) and/or term-standby, comma-separated",
    )
    parser.add_argument("--keep", action="store_true", help="keep the home directories (logs, topics)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    nimbus_log = NimbusLog()
    nimbus_logger = logging.getLogger("stream_ops.nimbus")
    nimbus_logger.setLevel(logging.INFO)
    nimbus_logger.addHandler(nimbus_log)
    nimbus_logger.propagate = False
    info = machine_info()
    started = time.time()
    results = []
    for size in (int(s) for s in args.sizes.split(",") if s.strip()):
        for signal_name in (s.strip() for s in args.signals.split(",") if s.strip()):
            t0 = time.time()
            results.append(run_size(size, args, nimbus_log, signal_name))
            log(f"{size} keys, SIG{signal_name.upper()}: done in {time.time() - t0:.0f} s")
    report(results, args, info, time.time() - started)


if __name__ == "__main__":
    main()
