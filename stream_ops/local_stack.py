"""The local stack on embedded defaults: ZooKeeper, worker processes and (optionally) a Kafka
broker and Dagster.

``stream-ops demo`` and ``stream-ops dev`` use it, and so do the end-to-end tests, so what the
README's main command shows is what the tests prove.

The stack is for one developer on one machine: its embedded ZooKeeper has no credentials, so its
workers run with ``--insecure``, its nimbus with ``ZooKeeperConfig.insecure`` and its Dagster
code location with ``STREAM_OPS_ZK_INSECURE=true`` (see
:func:`~stream_ops.coordination.acl.require_auth`); it logs a warning saying so.
"""

from __future__ import annotations

import collections
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from stream_ops.config import ClusterConfig, QueryConfig, ZooKeeperConfig
from stream_ops.coordination.cluster_state import find_topology
from stream_ops.coordination.embedded import EmbeddedZooKeeper
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore, ZnodeStat
from stream_ops.coordination.watches import watch_children, watch_data
from stream_ops.dsl.build_plan import build_plan
from stream_ops.dsl.streams import Topology
from stream_ops.errors import QueryAuthError, QueryError, QueryTLSError, StreamOpsError, WorkerError
from stream_ops.kafka.embedded import EmbeddedKafka
from stream_ops.kafka.producing import produce_json, read_json_records
from stream_ops.nimbus.assignment import live_workers, reassign
from stream_ops.nimbus.code_archive import build_code_archive
from stream_ops.nimbus.dist_store import load_submission, sha256_hex
from stream_ops.nimbus.leader import run_nimbus
from stream_ops.nimbus.submission import activate, kill, submit
from stream_ops.ports import free_port
from stream_ops.runtime.processes import kill_group, start_worker, stop_process, worker_command, worker_launch_from_env
from stream_ops.runtime.query_client import query_state
from stream_ops.sources import KafkaTopic
from stream_ops.topics.file_topic import FileTopic
from stream_ops.topics.producer import produce
from stream_ops.topology_env import pass_env_names, topology_environment

logger = logging.getLogger(__name__)

#: Environment variables of the state-query settings (``stream-ops`` options and the Dagster code location).
_QUERY_ENV = (
    "STREAM_OPS_QUERY_TOKEN",
    "STREAM_OPS_QUERY_TOKEN_FILE",
    "STREAM_OPS_QUERY_TLS_CERT",
    "STREAM_OPS_QUERY_TLS_KEY",
    "STREAM_OPS_QUERY_TLS_CA",
)
#: Seconds between two checks that the stack's worker processes are alive while it waits for
#: their registration or for exact counts (a ZooKeeper watch wakes the wait for those at once).
WORKER_CHECK_S = 0.5
#: Environment variables of ZooKeeper credentials, never passed to the stack's processes.
_ZK_AUTH_ENV = ("STREAM_OPS_ZK_AUTH", "STREAM_OPS_ZK_AUTH_FILE", "STREAM_OPS_ZK_OPEN_READS")


@dataclass
class WorkerProcess:
    """A worker started as a separate ``stream-ops worker`` process."""

    port: int
    log: Path
    proc: subprocess.Popen[Any]

    @property
    def worker_id(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass
class LocalStack:
    """ZooKeeper plus worker processes under ``home``; a context manager that stops them all.

    Development only: nothing authenticates to its ZooKeeper, so workers, the nimbus and Dagster
    run explicitly insecure (see the module docstring).

    Args:
        home: shared directory (dist store, topics, checkpoints, logs).
        workers: worker processes to start.
        zookeeper_port: fixed port, or None for a free one.
        chroot: root znode.
        worker_args: extra ``stream-ops worker`` options (e.g. ``["--trigger-seconds", "0.5"]``).
        nimbus: run the heartbeat monitor (leader-elected) in this process, so tasks of dead
            workers are reassigned.
        task_timeout_s, launch_grace_s: the monitor's settings.
        query: State-query token and TLS of the workers and of this stack's queries (the local
            ZooKeeper has no credentials, so without a token queries are unauthenticated).
        kafka: also run a single-node Kafka broker under ``home/kafka`` (started before the
            workers, which then fetch Spark's Kafka connector if the jar cache lacks it);
            children get its address as ``STREAM_OPS_KAFKA``.
        kafka_port: the broker's fixed port, or None for a free one.
    """

    home: Path
    workers: int = 2
    zookeeper_port: int | None = None
    chroot: str = "/stream_ops"
    worker_args: Sequence[str] = ()
    session_timeout_s: float = 6.0
    zookeeper: EmbeddedZooKeeper | None = None
    worker_processes: list[WorkerProcess] = field(default_factory=list)
    dagster: subprocess.Popen[Any] | None = None
    nimbus: bool = True
    task_timeout_s: float = 10.0
    launch_grace_s: float = 60.0
    query: QueryConfig = field(default_factory=QueryConfig)
    kafka: bool = False
    kafka_port: int | None = None
    kafka_broker: EmbeddedKafka | None = None
    _nimbus_stop: threading.Event = field(default_factory=threading.Event)
    _nimbus_thread: threading.Thread | None = None

    @property
    def zk_config(self) -> ZooKeeperConfig:
        assert self.zookeeper is not None
        # The embedded ZooKeeper has no credentials: say so explicitly (require_auth).
        return ZooKeeperConfig(
            hosts=self.zookeeper.hosts, chroot=self.chroot, session_timeout_s=self.session_timeout_s, insecure=True
        )

    @property
    def cluster(self) -> ClusterConfig:
        return ClusterConfig(root=self.home)

    def __enter__(self) -> LocalStack:
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "logs").mkdir(exist_ok=True)
        logger.warning(
            "local stack under %s: ZooKeeper without credentials, workers and nimbus started --insecure; any process "
            "on this machine can change what they run (development only)",
            self.home,
        )
        try:
            self.zookeeper = EmbeddedZooKeeper(data_dir=self.home / "zookeeper", port=self.zookeeper_port or free_port())
            if self.kafka:
                self.zookeeper.start()
                self.kafka_broker = EmbeddedKafka(self.home / "kafka", port=self.kafka_port)
                self.kafka_broker.start()
                for _ in range(self.workers):
                    self.start_worker()
            else:
                # The workers import stream_ops and start their JVMs (seconds) while ZooKeeper
                # starts (~1 s): each connects once it serves, with its SparkSession still
                # starting. ZooKeeper starts on this thread: it dies with the thread that
                # started it (PR_SET_PDEATHSIG, stream_ops.jvm_server).
                for _ in range(self.workers):
                    self.start_worker()
                self.zookeeper.start()
            self.wait_for_workers(self.workers)
            if self.nimbus:
                self._nimbus_thread = threading.Thread(
                    target=run_nimbus,
                    args=(self.zk_config, self._nimbus_stop),
                    kwargs={"interval_s": 0.5, "task_timeout_s": self.task_timeout_s, "launch_grace_s": self.launch_grace_s},
                    name="stream-ops-nimbus",
                    daemon=True,
                )
                self._nimbus_thread.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def env(self) -> dict[str, str]:
        """Environment for child processes: where ZooKeeper and the shared files are."""
        assert self.zookeeper is not None
        env = dict(os.environ)
        env.update(
            STREAM_OPS_ZOOKEEPER=self.zookeeper.hosts,
            STREAM_OPS_CHROOT=self.chroot,
            STREAM_OPS_HOME=str(self.home),
            PYTHONUNBUFFERED="1",
        )
        if self.kafka_broker is not None:
            env["STREAM_OPS_KAFKA"] = self.kafka_broker.bootstrap_servers
        for name in _QUERY_ENV:  # the stack's own query settings, not the caller's environment
            env.pop(name, None)
        env.update(_query_env(self.query))
        for name in _ZK_AUTH_ENV:  # the embedded ZooKeeper has no credentials
            env.pop(name, None)
        env["STREAM_OPS_ZK_INSECURE"] = "true"  # the Dagster code location's ZooKeeperResource.insecure
        return env

    def start_worker(self, port: int | None = None) -> WorkerProcess:
        """Start one ``stream-ops worker`` process (on ``port``, or a free one)."""
        port = port or free_port()
        log = self.home / "logs" / f"worker-{port}.log"
        extra_args = [*self.worker_args, *(() if "--insecure" in self.worker_args else ("--insecure",))]
        if self.kafka and "--kafka-connector" not in extra_args:
            extra_args.append("--kafka-connector")
        # The worker gets the allow-listed environment, what the rest says as arguments and the
        # secrets on its pipe: given more, it would start itself again without it (~1 s).
        env = self.env()
        global_args, env_args, secrets = worker_launch_from_env(env)
        cmd = worker_command(
            self.zk_config, self.home, host="127.0.0.1", port=port, extra_args=[*extra_args, *env_args], global_args=global_args
        )
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            proc = start_worker(
                cmd,
                env=topology_environment(env, pass_env_names(env)),
                secrets=secrets,
                stop_with_parent=False,
                output=out.fileno(),
            )
        worker = WorkerProcess(port, log, proc)
        self.worker_processes.append(worker)
        logger.info("started worker %s (pid %d), log %s", worker.worker_id, worker.proc.pid, log)
        return worker

    def kill_worker(self, worker: WorkerProcess) -> None:
        """SIGKILL a worker's whole process group (JVM included), as a crash would."""
        kill_group(worker.proc)
        worker.proc.wait(10)
        self.worker_processes.remove(worker)

    def wait_for_workers(self, count: int, timeout_s: float = 90.0) -> list[str]:
        """Wait until ``count`` workers are registered in ZooKeeper."""
        deadline = time.monotonic() + timeout_s
        registered = threading.Event()
        with ZkStore.connect(self.zk_config) as store:
            store.ensure_path(ZkPaths.WORKERS)
            # Woken by each registration; the timeout only checks on the worker processes.
            watch_children(store, ZkPaths.WORKERS, lambda children: registered.set() if len(children) >= count else None)
            while True:
                live = sorted(live_workers(store))
                if len(live) >= count:
                    return live
                for w in self.worker_processes:
                    if w.proc.poll() is not None:
                        raise WorkerError(f"worker {w.worker_id} exited with {w.proc.returncode}; see {w.log}:\n{_tail(w.log)}")
                if time.monotonic() > deadline:
                    raise WorkerError(f"only {len(live)} of {count} workers registered after {timeout_s:.0f} s")
                registered.wait(WORKER_CHECK_S)
                registered.clear()

    def start_dagster(self, *, port: int = 3000, working_directory: Path | None = None) -> str:
        """Start ``dagster dev`` (webserver and daemon) on the example definitions."""
        dagster_home = self.home / "dagster"
        dagster_home.mkdir(parents=True, exist_ok=True)
        local_yaml = Path(__file__).resolve().parent.parent / "deployments" / "local" / "dagster.yaml"
        if local_yaml.exists():
            shutil.copy(local_yaml, dagster_home / "dagster.yaml")
        env = self.env()
        env["DAGSTER_HOME"] = str(dagster_home)
        exe = Path(sys.executable).with_name("dagster")
        cmd = [str(exe) if exe.exists() else "dagster", "dev", "-m", "definitions", "-h", "127.0.0.1", "-p", str(port)]
        log = self.home / "logs" / "dagster.log"
        with open(log, "ab") as out:
            self.dagster = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=working_directory or Path.cwd(), start_new_session=True
            )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.dagster.poll() is not None:
                raise StreamOpsError(f"dagster dev exited with {self.dagster.returncode}; see {log}:\n{_tail(log)}")
            try:
                with urllib.request.urlopen(f"{url}/server_info", timeout=1):
                    return url
            except OSError:
                time.sleep(0.5)
        raise StreamOpsError(f"Dagster did not answer on {url} within 120 s; see {log}")

    def close(self) -> None:
        """Stop the monitor, Dagster, the workers, Kafka and ZooKeeper (in that order)."""
        self._nimbus_stop.set()
        if self._nimbus_thread is not None:
            self._nimbus_thread.join(10)
            self._nimbus_thread = None
        if self.dagster is not None:
            stop_process(self.dagster)
            self.dagster = None
        for worker in list(self.worker_processes):
            stop_process(worker.proc)
        self.worker_processes.clear()
        if self.kafka_broker is not None:
            self.kafka_broker.stop()
        if self.zookeeper is not None:
            self.zookeeper.stop()


#: What a local stack keeps under its home; ``--fresh`` removes exactly these.
STACK_DIRECTORIES = ("zookeeper", "kafka", "dist", "topics", "checkpoints", "local", "input", "dagster", "logs")


def clear_stack_state(home: Path) -> list[Path]:
    """Remove what a previous local stack left under ``home`` (ZooKeeper and Kafka data, dist store,
    topics, checkpoints, local state, demo input, Dagster instance, logs), so the next start is clean.

    Nothing else under ``home`` is touched. Returns the directories removed.
    """
    removed = []
    for name in STACK_DIRECTORIES:
        path = home / name
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)
        else:
            continue
        removed.append(path)
    return removed


def _query_env(query: QueryConfig) -> dict[str, str]:
    """The environment variables giving child processes (workers, Dagster) ``query``'s settings.

    The token goes through the environment, never on a command line.
    """
    values = {
        "STREAM_OPS_QUERY_TOKEN": query.token.get_secret_value() if query.token is not None else None,
        "STREAM_OPS_QUERY_TLS_CERT": query.tls_cert,
        "STREAM_OPS_QUERY_TLS_KEY": query.tls_key,
        "STREAM_OPS_QUERY_TLS_CA": query.tls_ca,
    }
    return {name: str(value) for name, value in values.items() if value is not None}


def _tail(path: Path, lines: int = 30) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(collections.deque(f, maxlen=lines))
    except OSError:
        return ""


def expected_word_counts(sentences: Sequence[str]) -> dict[str, int]:
    """Ground truth for the word count, computed without stream_ops."""
    return dict(collections.Counter(word for sentence in sentences for word in sentence.split(" ")))


def wait_for_counts(
    store: ZkStore,
    topology: str,
    query: str,
    expected: dict[str, int],
    *,
    timeout_s: float,
    query_config: QueryConfig | None = None,
) -> dict[str, Any]:
    """Ask the state query until every expected word has its expected count.

    It asks again as soon as a stateful task of ``topology`` commits a batch (a ZooKeeper watch
    on each such task's transactional node: only a commit changes the answer), and at least
    every :data:`WORKER_CHECK_S` seconds. ``query_config`` is passed to :func:`query_state`
    (token, TLS CA).
    """
    deadline = time.monotonic() + timeout_s
    last: dict[str, Any] = {}
    committed = _watch_commits(store, topology)
    while True:
        try:
            last = query_state(store, topology, query, [[w] for w in sorted(expected)], query_config=query_config)
            if last == expected:
                return last
        except (QueryAuthError, QueryTLSError):
            raise  # configuration, not a worker still starting: waiting would not help
        except QueryError as e:
            logger.debug("query not answered yet: %s", e)
        if time.monotonic() > deadline:
            wrong = {w: (last.get(w), n) for w, n in expected.items() if last.get(w) != n}
            raise StreamOpsError(f"counts did not reach the ground truth in {timeout_s:.0f} s; (got, expected): {wrong}")
        committed.wait(WORKER_CHECK_S)
        committed.clear()


def _watch_commits(store: ZkStore, topology: str) -> threading.Event:
    """An event set each time a stateful task of ``topology`` (a name) commits a batch.

    The watches end at their first change after the store is closed. A topology not found is
    left to the caller's timer (the event is never set)."""
    committed = threading.Event()
    record = find_topology(store, topology, missing_ok=True)
    if record is None:
        return committed

    def on_commit(data: bytes | None, stat: ZnodeStat | None) -> bool | None:
        committed.set()
        return None if data is not None else False

    for task_id in record.stateful_tasks:
        watch_data(store, ZkPaths.transactional_task(record.topology_id, task_id), on_commit)
    return committed


def feed_sentences(stack: LocalStack, input_topic: FileTopic | KafkaTopic, sentences: Sequence[str]) -> None:
    """Write ``{"sentence": s}`` records to the demo's input: a FileTopic, or a Kafka topic of
    the stack's broker (created with its partitions if missing, the records spread over them)."""
    records = ({"sentence": s} for s in sentences)
    if isinstance(input_topic, FileTopic):
        produce(input_topic, records)
        return
    if stack.kafka_broker is None:
        raise StreamOpsError(f"the demo reads Kafka topic {input_topic.topic!r} but the stack runs no broker (--kafka)")
    partitions = input_topic.partitions or 1
    stack.kafka_broker.ensure_topic(input_topic.topic, partitions)
    produce_json(input_topic.bootstrap, input_topic.topic, records, partitions=partitions)


StartedHow = Literal["submitted", "resumed", "resubmitted"]
"""How :func:`start_topology` got the topology running."""


def start_topology(store: ZkStore, cluster: ClusterConfig, topology: Topology, *, workers: int) -> tuple[str, StartedHow]:
    """Get ``topology`` running on the stack: submit it, or resume the submission it finds.

    A stack started again on the same home finds its ZooKeeper data and topics as it left them.
    A running topology of the same name whose plan and code archive are those of ``topology``
    is *resumed*: its tasks move to the new workers and go on from their committed state. One
    whose plan or code changed is killed and ``topology`` *resubmitted* (a new id: its state
    starts empty).

    Returns:
        The topology id and how it was started.
    """
    record = find_topology(store, topology.name, missing_ok=True)
    if record is None:
        return submit(store, cluster, topology, workers=workers), "submitted"
    plan = build_plan(topology)
    try:
        running = load_submission(cluster.resolved_dist_dir(), record)
        same = running.plan.to_json() == plan.to_json() and record.code_sha256 == sha256_hex(build_code_archive(plan))
    except StreamOpsError as e:
        logger.warning("cannot read %s's submission (%s); resubmitting %s", record.topology_id, e, topology.name)
        same = False
    if same:
        if record.status == "INACTIVE":
            activate(store, record.topology_id)
        reassign(store, record.topology_id)  # the previous stack's workers are gone: their tasks move now
        return record.topology_id, "resumed"
    kill(store, record.topology_id)
    return submit(store, cluster, topology, workers=workers), "resubmitted"


def input_sentences(input_topic: FileTopic | KafkaTopic) -> list[str]:
    """Every sentence the demo's input holds (all runs of the stack on this home): the ground truth."""
    if isinstance(input_topic, FileTopic):
        return [
            record["sentence"]
            for queue in range(input_topic.queues)
            for _, _, record in input_topic.read_queue(queue)
            if isinstance(record, dict) and isinstance(record.get("sentence"), str)
        ]
    return [
        record["sentence"]
        for record in read_json_records(input_topic.bootstrap, input_topic.topic)
        if isinstance(record, dict) and isinstance(record.get("sentence"), str)
    ]


def run_demo(
    stack: LocalStack,
    topology: Topology,
    input_topic: FileTopic | KafkaTopic,
    sentences: Sequence[str],
    *,
    timeout_s: float = 180.0,
    query_words: Sequence[str] = ("how", "are", "you", "nice", "day"),
) -> dict[str, Any]:
    """Start ``topology`` (:func:`start_topology`), feed ``sentences``, wait until the counts are
    exact for everything its input holds, return a few of them and how it was started."""
    started = time.monotonic()
    with ZkStore.connect(stack.zk_config) as store:
        topology_id, how = start_topology(store, stack.cluster, topology, workers=stack.workers)
        logger.info("%s %s", how, topology_id)
        feed_sentences(stack, input_topic, sentences)
        # A topology reading its input from the start counts every run's sentences, not only this run's.
        everything = input_sentences(input_topic)
        expected = expected_word_counts(everything)
        wait_for_counts(store, topology.name, "words", expected, timeout_s=timeout_s, query_config=stack.query)
        shown = query_state(store, topology.name, "words", [[w] for w in query_words], query_config=stack.query)
    return {
        "topology_id": topology_id,
        "started": how,
        "sentences": len(everything),
        "words": sum(expected.values()),
        "seconds": round(time.monotonic() - started, 1),
        "counts": shown,
    }
