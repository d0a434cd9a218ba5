"""What the in-process benchmarks share: one embedded ZooKeeper, one SparkSession, a ZooKeeper
client and stream_ops Workers on threads sharing that session, all under a temporary work
directory and torn down in the right order (workers, client, Spark, ZooKeeper, files); the CPU
read from ``/proc``; and what the Kafka benchmarks (``kafka.py``, ``join_kafka.py``) add to that
rig: an embedded broker, a ``read_committed`` reader of an output topic, plain Spark's Kafka
queries and the stream_ops topologies they submit.

Example::

    with BenchRig("wordcount", app_name="bench-wordcount", keep=args.keep) as rig:
        worker = rig.start_worker(ClusterConfig(root=rig.work / "cluster"), trigger_s=0.2, max_files=100)
        submit(rig.store, worker.cluster, topology, workers=1)
"""

from __future__ import annotations

import abc
import contextlib
import math
import os
import platform
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, TypeVar

import pyspark
from confluent_kafka import Consumer, Message, TopicPartition
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from stream_ops import Topology
from stream_ops.config import ClusterConfig, ZooKeeperConfig
from stream_ops.coordination.cluster_state import read_storm
from stream_ops.coordination.embedded import EmbeddedZooKeeper
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.kafka.client import client_config
from stream_ops.kafka.embedded import EmbeddedKafka
from stream_ops.nimbus import kill, submit
from stream_ops.ports import free_port
from stream_ops.runtime.worker import Worker, WorkerSettings
from stream_ops.spark.session import create_spark_session

SPARK_MASTER = "local[2]"


class CommitWatch:
    """Set when a stateful task of a topology commits a batch: a ZooKeeper watch on each such
    task's transactional node, so a benchmark asks a state query right after a commit that can
    change its answer instead of polling on a timer (a poll interval would be added to what it
    measures; a query after every source task's commit too would take the run's CPU)."""

    def __init__(self, store: ZkStore, topology_id: str) -> None:
        self.changed = threading.Event()
        self._stopped = False
        client = store.client
        for task in read_storm(store, topology_id).stateful_tasks:
            client.DataWatch(ZkPaths.transactional_task(topology_id, task), self._on_change)

    def _on_change(self, data: bytes | None, stat: Any) -> bool | None:
        self.changed.set()
        return False if self._stopped else None

    def wait(self, timeout_s: float) -> None:
        """Until a task commits (or ``timeout_s`` passes); clears the event for the next wait."""
        self.changed.wait(timeout_s)
        self.changed.clear()

    def close(self) -> None:
        self._stopped = True  # each watch is dropped the next time it fires


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _stat(path: Path) -> list[str]:
    """The fields of a ``/proc/.../stat`` file after the command name (field 3 first), [] when gone."""
    try:
        text = path.read_text()
    except OSError:
        return []
    return text[text.rindex(")") + 2 :].split()


def process_cpu_s(pid: int, *, reaped_children: bool = True) -> float:
    """CPU seconds (user + system, all threads) of a live process so far, with those of its
    children it has waited for when ``reaped_children`` (0.0 once it is gone)."""
    fields = _stat(Path(f"/proc/{pid}/stat"))
    if not fields:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    if reaped_children:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    return ticks / _CLOCK_TICKS


def thread_cpu_s(tid: int) -> float:
    """CPU seconds (user + system) of a thread of this process so far (0.0 once it is gone)."""
    fields = _stat(Path(f"/proc/self/task/{tid}/stat"))
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS if fields else 0.0


def process_tree(pid: int) -> list[int]:
    """``pid`` and its live descendants (from the parent pids in ``/proc/*/stat``)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(entry / "stat")
            if fields:
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    return tree


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and its descendants, live ones and those already reaped (a
    process that ended between two samples is counted in its parent's reaped-children times)."""
    return sum(process_cpu_s(p) for p in process_tree(pid))


IN_PROCESS = ("bench", "spark")
"""The CPU parts (:meth:`Processes.sample`) of an engine that runs in this process and its SparkSession."""


@dataclass
class Processes:
    """The processes whose CPU the benchmark reads, by part: ``bench`` (this process: its own
    threads only, the broker and ZooKeeper being its children too), ``spark`` (the SparkSession's
    JVM with the Python workers it starts, live and reaped), ``kafka-streams`` (the peer's JVM),
    ``broker`` and ``zookeeper``."""

    spark_jvm: int
    broker: int
    zookeeper: int
    kafka_streams: int | None = None

    def sample(self) -> dict[str, float]:
        """CPU seconds of each part so far."""
        return {
            "bench": process_cpu_s(os.getpid(), reaped_children=False),
            "spark": tree_cpu_s(self.spark_jvm),
            "kafka-streams": process_cpu_s(self.kafka_streams) if self.kafka_streams is not None else 0.0,
            "broker": tree_cpu_s(self.broker),
            "zookeeper": tree_cpu_s(self.zookeeper),
        }


@dataclass(frozen=True)
class CpuUse:
    """CPU seconds over one phase of a run.

    Attributes:
        engine_s: the engine's processes (its parts of :meth:`Processes.sample`); for an engine in this
            process, less the harness's own Python threads (``harness_s``).
        harness_s: the harness's own Python threads in this process over the phase (an
            output reader's loop, a load loop: measured with ``time.thread_time``); subtracted
            from an in-process engine's CPU, reported for every engine.
        broker_s: the Kafka broker.
        zookeeper_s: ZooKeeper (stream_ops' coordination; idle for the others).
        process_s: this process's threads less ``harness_s``: for an engine in another
            process, what the harness's Kafka clients' librdkafka threads and the idle rig
            cost, the most an in-process engine's ``engine_s`` carries that is not its own.
    """

    engine_s: float
    harness_s: float
    broker_s: float
    zookeeper_s: float
    process_s: float


def cpu_use(parts: Sequence[str], before: dict[str, float], after: dict[str, float], harness_s: float) -> CpuUse:
    """The phase's :class:`CpuUse` of an engine whose processes are ``parts``, from two
    :meth:`Processes.sample` results."""
    spent = {part: after[part] - before[part] for part in after}
    engine_s = sum(spent[part] for part in parts)
    if "bench" in parts:
        engine_s -= harness_s
    return CpuUse(engine_s, harness_s, spent["broker"], spent["zookeeper"], spent["bench"] - harness_s)


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0-1) of ``values`` (nan when empty)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else float("nan")


def wait_until(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.05) -> bool:
    """Poll ``predicate`` until it holds (True) or ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)
    return True


class WorkerThread:
    """A stream_ops Worker running on a thread with the shared SparkSession."""

    def __init__(
        self,
        zk: ZooKeeperConfig,
        cluster: ClusterConfig,
        spark: SparkSession,
        *,
        trigger_s: float,
        max_files: int,
        shuffle_trigger_s: float | None = None,
    ) -> None:
        settings = WorkerSettings(
            host="127.0.0.1",
            port=free_port(),
            trigger_seconds=trigger_s,
            shuffle_trigger_seconds=shuffle_trigger_s,
            max_files_per_trigger=max_files,
            heartbeat_interval_s=1.0,
            spark_master=SPARK_MASTER,
            launched_by="bench",
        )
        self.cluster = cluster
        self.worker = Worker(zk, cluster, settings, spark_factory=lambda: spark)
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.worker.run, args=(self.stop_event,), name="stream-ops-worker", daemon=True)

    def start(self, store: ZkStore) -> None:
        self.thread.start()
        if not wait_until(lambda: bool(store.children(ZkPaths.WORKERS)), 60):
            raise SystemExit("the worker did not register in ZooKeeper within 60 s")

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(120)


class BenchRig:
    """ZooKeeper, a SparkSession and a ZooKeeper client under a fresh work directory.

    Args:
        name: names the work directory (``stream_ops_bench_<name>_...``).
        app_name: the Spark application's name.
        keep: keep the work directory at the end (its path is printed).
        spark_conf: extra Spark settings.
        kafka_connector: put Spark's Kafka connector on ``spark.jars`` (fetched if needed).
        log_level: the SparkContext's log level once started.
    """

    def __init__(
        self,
        name: str,
        *,
        app_name: str,
        keep: bool = False,
        spark_conf: Mapping[str, str] | None = None,
        kafka_connector: bool = False,
        log_level: str = "WARN",
    ) -> None:
        self.work = Path(tempfile.mkdtemp(prefix=f"stream_ops_bench_{name}_"))
        self.zk = EmbeddedZooKeeper(self.work / "zookeeper", tick_time_ms=500)
        self.keep = keep
        self._app_name = app_name
        self._spark_conf = dict(spark_conf or {})
        self._kafka_connector = kafka_connector
        self._log_level = log_level
        self._spark: SparkSession | None = None
        self._store: ZkStore | None = None
        self.workers: list[WorkerThread] = []

    @property
    def spark(self) -> SparkSession:
        assert self._spark is not None, "use the rig as a context manager"
        return self._spark

    @property
    def store(self) -> ZkStore:
        assert self._store is not None, "use the rig as a context manager"
        return self._store

    @property
    def zk_config(self) -> ZooKeeperConfig:
        return ZooKeeperConfig(hosts=self.zk.hosts, chroot="/bench", session_timeout_s=6.0, insecure=True)

    def __enter__(self) -> BenchRig:
        try:
            t = time.perf_counter()
            self.zk.start(timeout_s=60)
            print(f"zookeeper ready on {self.zk.hosts} in {time.perf_counter() - t:.1f} s", flush=True)
            t = time.perf_counter()
            self._spark = create_spark_session(
                master=SPARK_MASTER, app_name=self._app_name, conf=self._spark_conf, kafka_connector=self._kafka_connector
            )
            self._spark.sparkContext.setLogLevel(self._log_level)
            print(f"SparkSession ready in {time.perf_counter() - t:.1f} s", flush=True)
            self._store = ZkStore.connect(self.zk_config)
        except BaseException:
            self.close()
            raise
        return self

    def start_worker(
        self, cluster: ClusterConfig, *, trigger_s: float, max_files: int, shuffle_trigger_s: float | None = None
    ) -> WorkerThread:
        """A Worker on a thread, registered in ZooKeeper when this returns; stopped by :meth:`close`."""
        worker = WorkerThread(
            self.zk_config, cluster, self.spark, trigger_s=trigger_s, max_files=max_files, shuffle_trigger_s=shuffle_trigger_s
        )
        worker.start(self.store)
        self.workers.append(worker)
        return worker

    def stop_worker(self, worker: WorkerThread) -> None:
        worker.stop()
        self.workers.remove(worker)

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.workers.clear()
        if self._store is not None:
            self._store.close()
            self._store = None
        if self._spark is not None:
            self._spark.sparkContext.setLogLevel("OFF")  # shutdown races (ContextCleaner) are noise here
            self._spark.stop()
            self._spark = None
        self.zk.stop()
        if self.keep:
            print(f"work directory kept: {self.work}")
        else:
            shutil.rmtree(self.work, ignore_errors=True)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> Any:
        self.close()
        return None


# --- the Kafka benchmarks -------------------------------------------------------------------


@contextlib.contextmanager
def kafka_broker(rig: BenchRig) -> Iterator[EmbeddedKafka]:
    """An embedded Kafka broker (KRaft) under the rig's work directory: started, its address and
    start-up time printed, stopped when the block ends."""
    kafka = EmbeddedKafka(rig.work / "kafka")
    kafka.start()
    try:
        print(f"Kafka ready on {kafka.bootstrap_servers} in {kafka.started_in_s:.1f} s", flush=True)
        yield kafka
    finally:
        kafka.stop()


def kafka_processes(rig: BenchRig, kafka: EmbeddedKafka) -> Processes:
    """The processes whose CPU a Kafka benchmark reads: the rig's Spark JVM, the broker and ZooKeeper."""
    spark_jvm = int(rig.spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())  # type: ignore[union-attr]
    assert kafka.pid is not None and rig.zk.pid is not None
    return Processes(spark_jvm=spark_jvm, broker=kafka.pid, zookeeper=rig.zk.pid)


def print_kafka_machine(spark: SparkSession, partitions: int, loads: Sequence[Sequence[float]]) -> None:
    """A Kafka benchmark's ``machine:`` and ``load:`` report lines; ``loads`` are the 1/5/15-min
    load averages sampled through the run (the first and the last are shown)."""
    java = spark.sparkContext._jvm.System.getProperty("java.version")  # type: ignore[union-attr]
    start, end = (", ".join(f"{v:.2f}" for v in load) for load in (loads[0], loads[-1]))
    print(
        f"machine:  {os.cpu_count()} cpus, {platform.platform()}, Python {platform.python_version()}, pyspark "
        f"{pyspark.__version__}, Java {java}; Kafka broker embedded (KRaft, 1 node), {partitions} partitions per topic"
    )
    print(f"load:     1/5/15-min load average {start} at the start, {end} at the end")


Decoded = TypeVar("Decoded")


class OutputReader(abc.ABC, Generic[Decoded]):
    """Reads an output topic (``read_committed``, every partition from offset 0) on a thread.

    Each message without an error is read at a wall-clock time ``now``, decoded by
    :meth:`_decode` (None: skipped) and counted in :attr:`messages`, and the decoded value taken
    by :meth:`_take` under the reader's lock (``self._lock``, which the subclass's queries take
    too). A subclass sets up what ``_take`` fills before calling this ``__init__``: it starts the
    thread.
    """

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.messages = 0
        self.thread_cpu_s = 0.0
        """CPU seconds of the reading thread's Python loop so far (its librdkafka threads not included)."""
        settings = {"group.id": f"bench-{topic}", "isolation.level": "read_committed", "enable.auto.commit": False}
        self._consumer = Consumer(client_config(bootstrap, **settings, **{"fetch.wait.max.ms": 10}))
        self._consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"read-{topic}", daemon=True)
        self._thread.start()

    @abc.abstractmethod
    def _decode(self, message: Message) -> Decoded | None:
        """What ``message`` holds, None to skip it (called outside the lock)."""

    @abc.abstractmethod
    def _take(self, decoded: Decoded, message: Message, now: float) -> None:
        """Record a decoded message read at ``now`` (called under the lock)."""

    def _run(self) -> None:
        started = time.thread_time()
        while not self._stop.is_set():
            self.thread_cpu_s = time.thread_time() - started
            for message in self._consumer.consume(10_000, timeout=0.05):
                if message.error() is not None:
                    continue
                now = time.time()
                decoded = self._decode(message)
                if decoded is None:
                    continue
                with self._lock:
                    self.messages += 1
                    self._take(decoded, message, now)

    def close(self) -> None:
        """Stop the thread and close the consumer."""
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()


class SparkKafkaQueries:
    """Plain Spark's streaming queries between Kafka topics, checkpointed under ``checkpoints``,
    on a ``trigger_s`` processing-time trigger, all stopped by :meth:`stop`."""

    def __init__(self, spark: SparkSession, bootstrap: str, checkpoints: Path, trigger_s: float) -> None:
        self._spark = spark
        self._bootstrap = bootstrap
        self._checkpoints = checkpoints
        self._trigger_s = trigger_s
        self._queries: list[StreamingQuery] = []

    def read(self, topic: str) -> DataFrame:
        """``topic`` as a streaming DataFrame (Spark's Kafka columns), from the earliest offsets."""
        return (
            self._spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", self._bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .load()
        )

    def write(self, frame: DataFrame, topic: str, *, output_mode: str) -> None:
        """Start a query writing ``frame`` (its ``key`` and ``value`` columns) to ``topic``,
        checkpointed in ``<checkpoints>/<topic>``."""
        query = (
            frame.writeStream.format("kafka")
            .option("kafka.bootstrap.servers", self._bootstrap)
            .option("topic", topic)
            .option("checkpointLocation", str(self._checkpoints / topic))
            .outputMode(output_mode)
            .trigger(processingTime=f"{self._trigger_s} seconds")
            .start()
        )
        self._queries.append(query)

    def stop(self) -> None:
        """Stop every query started."""
        for query in self._queries:
            query.stop()
        self._queries.clear()


class Topologies:
    """stream_ops topologies submitted to one of the rig's workers, killed together by :meth:`kill_all`."""

    def __init__(self, rig: BenchRig, worker: WorkerThread) -> None:
        self._rig = rig
        self._worker = worker
        self._names: list[str] = []
        self.ids: list[str] = []
        """The running topologies' ids."""

    def submit(self, topology: Topology) -> None:
        """Submit ``topology`` to the worker (one worker slot)."""
        self.ids.append(submit(self._rig.store, self._worker.cluster, topology, workers=1))
        self._names.append(topology.name)

    def _until_stopped(self, _: float) -> None:
        wait_until(lambda: not self._worker.worker.running_tasks, 60)

    def kill_all(self) -> None:
        """Kill every topology submitted, each once the worker has no task running."""
        for name in self._names:
            kill(self._rig.store, name, wait_s=1.0, sleep=self._until_stopped)
        self._names.clear()
        self.ids.clear()
