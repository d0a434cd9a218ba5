"""What the in-process benchmarks share: one embedded ZooKeeper, one SparkSession, a ZooKeeper
client and stream_ops Workers on threads sharing that session, all under a temporary work
directory and torn down in the right order (workers, client, Spark, ZooKeeper, files).

Example::

    with BenchRig("wordcount", app_name="bench-wordcount", keep=args.keep) as rig:
        worker = rig.start_worker(ClusterConfig(root=rig.work / "cluster"), trigger_s=0.2, max_files=100)
        submit(rig.store, worker.cluster, topology, workers=1)
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from pyspark.sql import SparkSession

from stream_ops.config import ClusterConfig, ZooKeeperConfig
from stream_ops.coordination.cluster_state import read_storm
from stream_ops.coordination.embedded import EmbeddedZooKeeper
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
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
