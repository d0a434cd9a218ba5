"""The nemesis of ``test_nemesis.py`` and ``bench/nemesis_soak.py``: what breaks the network and
the disks under real worker processes, the stack they run on, and the scenarios themselves.

* :class:`TcpProxy`: a TCP proxy on loopback between one worker and ZooKeeper that the test can
  *cut* (a silent partition: nothing is forwarded, no connection is reset; the connections are
  kept and resumed at the heal, or dropped at the heal) and *heal*.
* :func:`tmpfs`, :func:`fill_disk`: a small tmpfs mounted under the stack's home (root only),
  and a filler file that takes all of its space.
* :class:`FsyncShim`: an ``LD_PRELOAD`` library (``nemesis_fsync_shim.c``, compiled with gcc into
  a temporary directory) whose ``fsync``/``fdatasync`` sleep while a control file exists.
* :class:`NemesisStack`: a :class:`~stream_ops.local_stack.LocalStack` (one embedded ZooKeeper,
  the nimbus monitor in this process) with two workers: ``nemesis``, reaching ZooKeeper through
  the proxy, its RocksDB stores on their own small tmpfs and the fsync shim loaded; ``plain``,
  direct to ZooKeeper. The internal topics of every worker are on another small tmpfs.
* :class:`TransactionalHistory`: every version of the topology's ``/transactional`` records,
  read as they change, so a scenario can prove that no commit of a zombie's epoch landed after
  the cut.
* :func:`run_partition`, :func:`run_disk_full`, :func:`run_slow_disk`: the scenarios. Each feeds
  a word count continuously, applies its nemesis, and ends with every count equal to the
  ground truth computed from what was fed (or raises ``AssertionError`` saying what differed);
  each returns a :class:`ScenarioResult` whose timeline says what was done and seen when.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import re
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from stream_ops import OpaqueMapState, TransactionalMapState
from stream_ops.config import ClusterConfig
from stream_ops.coordination.cluster_state import read_assignment
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import OwnerRecord, TransactionalRecord
from stream_ops.coordination.store import ZkStore
from stream_ops.dsl.streams import Topology
from stream_ops.examples.wordcount import SAMPLE_SENTENCES, build_wordcount
from stream_ops.local_stack import LocalStack, WorkerProcess, expected_word_counts, wait_for_counts
from stream_ops.nimbus import describe_topology, submit
from stream_ops.nimbus.submission import deactivate, kill
from stream_ops.ports import free_port
from stream_ops.runtime.processes import spawn, stop_process, worker_command
from stream_ops.runtime.task_failures import clear_task_errors, read_task_errors
from stream_ops.topics.file_topic import FileTopic
from stream_ops.topics.producer import produce

logger = logging.getLogger("nemesis")

T = TypeVar("T")

SHIM_SOURCE = Path(__file__).resolve().with_name("nemesis_fsync_shim.c")
#: ZooKeeper session timeout of the stack's processes (s): short, so a partition expires it soon.
SESSION_TIMEOUT_S = 4.0
#: The nimbus monitor's heartbeat timeout (s).
TASK_TIMEOUT_S = 5.0
WORKER_ARGS = ("--trigger-seconds", "0.3", "--heartbeat-interval", "0.5")
#: Generous bounds for waits on a busy 2-core machine (other engineers' tests run beside these).
STEP_TIMEOUT_S = 120.0
COUNTS_TIMEOUT_S = 240.0


# --- waiting and the timeline --------------------------------------------------------------


def wait_for(condition: Callable[[], T | None], timeout_s: float, what: str, poll_s: float = 0.1) -> T:
    """Poll ``condition`` until it returns something truthy and return that; ``AssertionError``
    naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = condition()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)


class Timeline:
    """What a scenario did and saw, with seconds since its start; printed as it goes (``pytest
    -s`` shows it live, a failure's captured output afterwards, the soak prints it per round)."""

    def __init__(self, scenario: str) -> None:
        self.scenario = scenario
        self.started = time.monotonic()
        self.events: list[tuple[float, str]] = []

    def now(self) -> float:
        """Seconds since the scenario started."""
        return time.monotonic() - self.started

    def mark(self, what: str) -> float:
        """Record ``what`` at the current time; returns that time."""
        at = self.now()
        self.events.append((at, what))
        line = f"[{self.scenario} +{at:7.2f} s] {what}"
        print(line, flush=True)
        return at

    def lines(self) -> list[str]:
        return [f"+{t:7.2f} s  {text}" for t, text in self.events]


@dataclass
class ScenarioResult:
    """One scenario's outcome: its timeline and the facts it checked."""

    scenario: str
    seconds: float
    timeline: list[str]
    facts: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        facts = ", ".join(f"{k}={v}" for k, v in self.facts.items())
        return f"{self.scenario}: exact in {self.seconds:.1f} s ({facts})"


# --- the network: a TCP proxy that can be cut ----------------------------------------------


class _Pipe:
    """One proxied connection: the client's socket, ZooKeeper's, and a pump thread each way."""

    def __init__(self, proxy: TcpProxy, client: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream: socket.socket | None = None
        self.closed = threading.Event()
        self.generation = proxy.generation

    def start(self) -> None:
        threading.Thread(target=self._run, name="nemesis-proxy-pipe", daemon=True).start()

    def _run(self) -> None:
        try:
            # A connection made during a cut waits for the heal, as a SYN would be retried.
            if not self.proxy.wait_flowing(self):
                return
            self.upstream = socket.create_connection(self.proxy.upstream, timeout=5.0)
            self.upstream.settimeout(5.0)
            self.client.settimeout(5.0)
            other = threading.Thread(target=self._pump, args=(self.upstream, self.client), daemon=True)
            other.start()
            self._pump(self.client, self.upstream)
            other.join()
        except OSError:
            pass
        finally:
            self.close()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        while not self.closed.is_set():
            if not self.proxy.wait_flowing(self):
                return
            try:
                readable, _, _ = select.select([source], [], [], 0.05)
            except (OSError, ValueError):
                return
            if not readable:
                continue
            try:
                data = source.recv(65536)
            except OSError:
                return
            if not data:
                with contextlib.suppress(OSError):
                    target.shutdown(socket.SHUT_WR)
                return
            # Read before a cut: held until the heal (TCP would retransmit it), never forwarded during it.
            if not self.proxy.send(self, target, data):
                return

    def close(self, *, reset: bool = False) -> None:
        """Close both sockets (``reset``: with an RST, as a router that lost the connection)."""
        self.closed.set()
        for sock in (self.client, self.upstream):
            if sock is None:
                continue
            if reset:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            with contextlib.suppress(OSError):
                sock.close()
        self.proxy.forget(self)


class TcpProxy:
    """A TCP proxy on loopback in front of one ZooKeeper server, which the test can cut and heal.

    ``cut()`` is a silent partition: from that moment nothing more is forwarded either way, no
    connection is closed or reset, and new connections are accepted but get nothing (as SYNs
    dropped on the way would). ``heal()`` ends it: with ``drop_connections=False`` at the cut the
    connections from before resume (what was read and held is forwarded, as TCP's retransmission
    would deliver it), with ``True`` they are reset at the heal (the path lost their state), so
    the client must reconnect. A connection made during the cut goes on to ZooKeeper at the heal.

    Example:
        >>> with TcpProxy(("127.0.0.1", 2181)) as proxy:  # doctest: +SKIP
        ...     start_worker(zookeeper=proxy.hosts)
        ...     proxy.cut()
        ...     proxy.heal()
    """

    def __init__(self, upstream: tuple[str, int], *, host: str = "127.0.0.1", port: int | None = None) -> None:
        self.upstream = upstream
        self.host = host
        self.port = port or free_port(host)
        self.generation = 0
        self._flowing = threading.Event()
        self._flowing.set()
        self._gate = threading.Lock()
        self._drop_at_heal = False
        self._pipes: set[_Pipe] = set()
        self._pipes_lock = threading.Lock()
        self._stopped = threading.Event()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None

    @property
    def hosts(self) -> str:
        """The ``host:port`` to give a ZooKeeper client instead of the server's."""
        return f"{self.host}:{self.port}"

    def start(self) -> TcpProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, self.port))
        listener.listen(64)
        self._listener = listener
        self._thread = threading.Thread(target=self._accept, name="nemesis-proxy", daemon=True)
        self._thread.start()
        return self

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stopped.is_set():
            try:
                readable, _, _ = select.select([self._listener], [], [], 0.1)
                if not readable:
                    continue
                client, _ = self._listener.accept()
            except OSError:
                return
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pipe = _Pipe(self, client)
            with self._pipes_lock:
                self._pipes.add(pipe)
            pipe.start()

    def wait_flowing(self, pipe: _Pipe) -> bool:
        """Block while the proxy is cut; False once ``pipe`` is closed (or dropped at a heal)."""
        while not self._flowing.wait(0.05):
            if pipe.closed.is_set() or self._stopped.is_set():
                return False
        return not pipe.closed.is_set() and not self._stopped.is_set()

    def send(self, pipe: _Pipe, target: socket.socket, data: bytes) -> bool:
        """Forward ``data`` unless cut; when cut, hold it until the heal. False: the pipe is done."""
        while True:
            if not self.wait_flowing(pipe):
                return False
            with self._gate:
                if not self._flowing.is_set():
                    continue  # cut between the wait and the gate: hold it
                try:
                    target.sendall(data)
                except OSError:
                    return False
                return True

    def forget(self, pipe: _Pipe) -> None:
        with self._pipes_lock:
            self._pipes.discard(pipe)

    def cut(self, *, drop_connections: bool = False) -> None:
        """Stop forwarding, silently (nothing is closed). Returns once no byte is being forwarded:
        from then until :meth:`heal` ZooKeeper gets nothing from the proxied clients, nor they
        from it. ``drop_connections``: reset the connections of before the cut at the heal."""
        self._drop_at_heal = drop_connections
        with self._gate:
            self._flowing.clear()
            self.generation += 1

    def heal(self) -> None:
        """Forward again; connections from before the cut resume, or are reset if they were dropped."""
        if self._drop_at_heal:
            with self._pipes_lock:
                old = [p for p in self._pipes if p.generation < self.generation]
            for pipe in old:
                pipe.close(reset=True)
        self._flowing.set()

    def close(self) -> None:
        self._stopped.set()
        self._flowing.set()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.close()
        with self._pipes_lock:
            pipes = list(self._pipes)
        for pipe in pipes:
            pipe.close()
        if self._thread is not None:
            self._thread.join(5)


# --- the disk: small tmpfs mounts and a filler ---------------------------------------------


def can_mount_tmpfs() -> str | None:
    """None when this process may mount a tmpfs, else why not (a skip reason)."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root (CI runs the suite as root)"
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "mount/umount are not installed"
    probe = Path(tempfile.mkdtemp(prefix="nemesis-mount-probe-"))
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)], capture_output=True, text=True)
        if done.returncode != 0:
            return f"mount -t tmpfs failed here: {done.stderr.strip() or done.returncode}"
        subprocess.run(["umount", str(probe)], check=True, capture_output=True)
        return None
    finally:
        probe.rmdir()


@contextlib.contextmanager
def tmpfs(path: Path, size_bytes: int) -> Iterator[Path]:
    """Mount a tmpfs of ``size_bytes`` on ``path`` (created if missing), unmounted on exit
    whatever happens (lazily, if something still holds it open)."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0755", "tmpfs", str(path)],
        check=True,
        capture_output=True,
        text=True,
    )
    try:
        yield path
    finally:
        done = subprocess.run(["umount", str(path)], capture_output=True, text=True)
        if done.returncode != 0:
            logger.warning("umount %s failed (%s); unmounting it lazily", path, done.stderr.strip())
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def free_bytes(path: Path) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


def fill_disk(mount: Path, name: str = ".nemesis-filler") -> Path:
    """Take every free byte of the file system of ``mount`` with one file; returns its path
    (delete it to give the space back). A hidden name: no reader of the topics lists it."""
    filler = mount / name
    chunk = b"\0" * (1 << 20)
    with open(filler, "wb", buffering=0) as f:
        for size in (len(chunk), 4096, 1):
            while True:
                try:
                    f.write(chunk[:size])
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break
    return filler


# --- the slow disk: an LD_PRELOAD fsync shim -----------------------------------------------


@dataclass(frozen=True)
class SlowSync:
    """One slowed ``fsync``/``fdatasync`` as the shim logged it."""

    pid: int
    call: str
    ms: int
    began_ns: int
    ended_ns: int | None
    path: str


class FsyncShim:
    """``nemesis_fsync_shim.c`` compiled into ``directory``: loaded with ``LD_PRELOAD``, it makes
    ``fsync``/``fdatasync`` sleep ``slow(ms)`` milliseconds each until ``fast()``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.control = directory / "fsync-delay-ms"
        self.log = directory / "slow-syncs.log"
        self.library = directory / "libnemesis_fsync.so"

    @staticmethod
    def missing_compiler() -> str | None:
        """None when gcc is there, else a skip reason."""
        if shutil.which("gcc") is None:
            return "gcc is not installed (tests/run.sh installs it as root)"
        return None

    def build(self) -> FsyncShim:
        self.directory.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                "gcc",
                "-shared",
                "-fPIC",
                "-O2",
                "-Wall",
                "-Werror",
                f'-DNEMESIS_CONTROL="{self.control}"',
                f'-DNEMESIS_LOG="{self.log}"',
                "-o",
                str(self.library),
                str(SHIM_SOURCE),
                "-ldl",
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        return self

    def slow(self, ms: int) -> None:
        """From now on each ``fsync``/``fdatasync`` of a process with the shim sleeps ``ms`` ms first."""
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(str(ms))
        tmp.rename(self.control)

    def fast(self) -> None:
        self.control.unlink(missing_ok=True)

    def loaded_by(self, pid: int) -> bool:
        """Whether process ``pid`` has the library mapped."""
        try:
            return str(self.library) in Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            return False

    def syncs(self) -> list[SlowSync]:
        """Every slowed call logged so far (``ended_ns`` None: still sleeping)."""
        if not self.log.exists():
            return []
        begun: dict[tuple[int, int, int], SlowSync] = {}
        done: list[SlowSync] = []
        for line in self.log.read_text(errors="replace").splitlines():
            parts = line.split(" ", 7)
            if len(parts) < 7:
                continue
            what, pid, tid, call, fd, ms, ns = parts[:7]
            path = parts[7] if len(parts) == 8 else ""
            key = (int(pid), int(tid), int(fd))
            if what == "begin":
                begun[key] = SlowSync(int(pid), call, int(ms), int(ns), None, path)
            elif what == "end" and key in begun:
                started = begun.pop(key)
                done.append(SlowSync(started.pid, call, started.ms, started.began_ns, int(ns), path))
        return done + list(begun.values())

    def in_progress(self, pids: Sequence[int] | None = None) -> list[SlowSync]:
        """The slowed calls sleeping right now (of ``pids`` only, if given)."""
        return [s for s in self.syncs() if s.ended_ns is None and (pids is None or s.pid in pids)]


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


# --- the stack -----------------------------------------------------------------------------


@dataclass
class NemesisStack(LocalStack):
    """A :class:`LocalStack` whose workers the nemesis can reach: start it with ``workers=0``
    and add them with :meth:`start_nemesis_worker` and :meth:`start_plain_worker`.

    Every worker keeps the internal topics under ``topics_root`` (the stack's ``cluster`` says
    so too, for submissions). The nemesis worker reaches ZooKeeper through ``proxy``, keeps its
    RocksDB stores under ``nemesis_local_dir`` and loads ``shim`` (``LD_PRELOAD``, passed through
    its allow-listed environment with ``--pass-env LD_PRELOAD``: the worker restarts itself with
    a reduced environment, which drops every other name).
    """

    topics_root: Path | None = None
    proxy: TcpProxy | None = None
    shim: FsyncShim | None = None
    nemesis_local_dir: Path | None = None
    nemesis: WorkerProcess | None = None
    plain: WorkerProcess | None = None

    @property
    def cluster(self) -> ClusterConfig:
        return ClusterConfig(root=self.home, topics_root=self.topics_root)

    def _start(self, port: int | None, *, hosts: str | None, local_dir: Path | None, preload: Path | None) -> WorkerProcess:
        port = port or free_port()
        zk = self.zk_config if hosts is None else self.zk_config.model_copy(update={"hosts": hosts})
        extra = [*self.worker_args, "--insecure"]
        if self.topics_root is not None:
            extra += ["--topics-root", str(self.topics_root)]
        env = self.env()
        if preload is not None:
            extra += ["--pass-env", "LD_PRELOAD"]
            env["LD_PRELOAD"] = str(preload)
        global_args = ["--local-dir", str(local_dir)] if local_dir is not None else []
        cmd = worker_command(zk, self.home, host="127.0.0.1", port=port, extra_args=extra, global_args=global_args)
        log = self.home / "logs" / f"worker-{port}.log"
        worker = WorkerProcess(port, log, spawn(cmd, log, env))
        self.worker_processes.append(worker)
        return worker

    def start_worker(self, port: int | None = None) -> WorkerProcess:
        """A plain worker (direct to ZooKeeper)."""
        return self.start_plain_worker(port)

    def start_plain_worker(self, port: int | None = None) -> WorkerProcess:
        self.plain = self._start(port, hosts=None, local_dir=None, preload=None)
        return self.plain

    def start_nemesis_worker(self, port: int | None = None) -> WorkerProcess:
        self.nemesis = self._start(
            port,
            hosts=self.proxy.hosts if self.proxy is not None else None,
            local_dir=self.nemesis_local_dir,
            preload=self.shim.library if self.shim is not None else None,
        )
        return self.nemesis

    def wait_registered(self, worker: WorkerProcess, timeout_s: float = STEP_TIMEOUT_S) -> None:
        """Until ``worker``'s ``/workers`` node exists (it fails at once if the process exits)."""
        with ZkStore.connect(self.zk_config) as store:

            def registered() -> bool:
                if worker.proc.poll() is not None:
                    raise AssertionError(f"worker {worker.worker_id} exited with {worker.proc.returncode}; see {worker.log}")
                return store.exists(ZkPaths.worker(worker.worker_id))

            wait_for(registered, timeout_s, f"worker {worker.worker_id} to register", poll_s=0.2)

    def stop_workers(self) -> None:
        """SIGTERM every worker (SIGKILL after 20 s), as :meth:`LocalStack.close` does."""
        for worker in list(self.worker_processes):
            stop_process(worker.proc)
        self.worker_processes.clear()

    def ensure_workers(self) -> None:
        """Restart whichever of the two workers is not running (a scenario may have killed one)."""
        if self.nemesis is None or self.nemesis.proc.poll() is not None:
            if self.nemesis is not None and self.nemesis in self.worker_processes:
                self.worker_processes.remove(self.nemesis)
            self.start_nemesis_worker(self.nemesis.port if self.nemesis is not None else None)
        if self.plain is None or self.plain.proc.poll() is not None:
            if self.plain is not None and self.plain in self.worker_processes:
                self.worker_processes.remove(self.plain)
            self.start_plain_worker(self.plain.port if self.plain is not None else None)
        assert self.nemesis is not None and self.plain is not None
        self.wait_registered(self.nemesis)
        self.wait_registered(self.plain)


@contextlib.contextmanager
def nemesis_stack(
    home: Path, *, with_shim: bool = True, topics_bytes: int = 48 << 20, local_bytes: int = 24 << 20
) -> Iterator[NemesisStack]:
    """Mount the two small tmpfs under ``home``, build the shim (unless ``with_shim`` is False),
    start ZooKeeper, the proxy, the nimbus and the two workers; tear everything down in reverse
    order, unmounting always."""
    home.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        topics = stack.enter_context(tmpfs(home / "small-topics", topics_bytes))
        local = stack.enter_context(tmpfs(home / "small-local", local_bytes))
        shim = FsyncShim(home / "shim").build() if with_shim else None
        nemesis = NemesisStack(
            home=home,
            workers=0,
            worker_args=WORKER_ARGS,
            session_timeout_s=SESSION_TIMEOUT_S,
            task_timeout_s=TASK_TIMEOUT_S,
            launch_grace_s=30.0,
            topics_root=topics / "topics",
            shim=shim,
            nemesis_local_dir=local / "local",
        )
        stack.enter_context(nemesis)  # LocalStack.__exit__ stops workers, nimbus and ZooKeeper
        assert nemesis.zookeeper is not None
        host, _, port = nemesis.zookeeper.hosts.rpartition(":")
        nemesis.proxy = stack.enter_context(TcpProxy((host, int(port))))
        # Unwound in reverse: the slow disk and the partition end, the workers stop (the nemesis
        # worker releasing its tasks through the healed proxy), then the proxy closes, then the
        # nimbus and ZooKeeper stop, then the mounts go.
        stack.callback(nemesis.stop_workers)
        stack.callback(nemesis.proxy.heal)
        if shim is not None:
            stack.callback(shim.fast)
        nemesis.start_nemesis_worker()
        nemesis.start_plain_worker()
        nemesis.ensure_workers()
        yield nemesis


# --- what ZooKeeper shows ------------------------------------------------------------------


@dataclass(frozen=True)
class TxVersion:
    """One version of a ``/transactional/{id}/{task}`` record as seen by the history."""

    seen_at: float
    version: int
    mzxid: int
    record: TransactionalRecord


class TransactionalHistory:
    """Every version of a topology's ``/transactional`` records, read each time one changes
    (a data watch per task, and a poll every 50 ms besides). A version that lived for less than
    a read's round trip may be missed; a zombie commit would stay until the next owner's
    takeover or commit, i.e. hundreds of milliseconds at least."""

    def __init__(self, store: ZkStore, topology_id: str, tasks: Sequence[int]) -> None:
        self.store = store
        self.topology_id = topology_id
        self.tasks = list(tasks)
        self.versions: dict[int, list[TxVersion]] = {t: [] for t in self.tasks}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nemesis-tx-history", daemon=True)

    def __enter__(self) -> TransactionalHistory:
        self.read()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(10)

    def read(self) -> None:
        paths = {ZkPaths.transactional_task(self.topology_id, t): t for t in self.tasks}
        found = self.store.get_json_many(list(paths))
        now = time.monotonic()
        with self._lock:
            for path, node in found.items():
                if node is None:
                    continue
                data, stat = node
                versions = self.versions[paths[path]]
                if not versions or versions[-1].version != stat.version:
                    versions.append(TxVersion(now, stat.version, stat.mzxid, TransactionalRecord.model_validate(data)))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(0.05)
            self._wake.clear()
            try:
                self.read()
            except Exception:
                logger.debug("history read failed", exc_info=True)

    def latest(self, task: int) -> TransactionalRecord | None:
        with self._lock:
            versions = self.versions[task]
            return versions[-1].record if versions else None

    def commits(self, task: int) -> list[TxVersion]:
        """The versions that recorded a commit (a new committed txid, epoch or time), not a
        takeover (which raises ``epoch`` only)."""
        with self._lock:
            versions = list(self.versions[task])
        return [
            v
            for i, v in enumerate(versions)
            if v.record.committed_txid >= 0
            and (
                i == 0
                or (v.record.committed_txid, v.record.committed_epoch, v.record.committed_at)
                != (
                    versions[i - 1].record.committed_txid,
                    versions[i - 1].record.committed_epoch,
                    versions[i - 1].record.committed_at,
                )
            )
        ]

    def commits_of_epoch_after(self, task: int, epoch: int, zxid: int) -> list[TxVersion]:
        """The commits made under owner ``epoch`` that ZooKeeper wrote after ``zxid``."""
        return [v for v in self.commits(task) if v.record.committed_epoch == epoch and v.mzxid > zxid]

    def committed_transitions(self, task: int) -> list[tuple[int, int]]:
        """(committed txid, committed epoch) of each version seen, in order, repeats removed."""
        with self._lock:
            pairs = [(v.record.committed_txid, v.record.committed_epoch) for v in self.versions[task]]
        return [p for i, p in enumerate(pairs) if i == 0 or pairs[i - 1] != p]


def zxid_now(store: ZkStore) -> int:
    """A zxid ZooKeeper assigned after everything it had received before this call: the czxid of
    a fresh ephemeral marker node (deleted again)."""
    path = store.create_json("/nemesis/mark-", {"at": time.time()}, ephemeral=True, sequence=True)
    stat = store.stat(path)
    assert stat is not None
    store.delete(path)
    return int(stat.czxid)


def owner_of(store: ZkStore, topology_id: str, task: int) -> OwnerRecord | None:
    found = store.get_json(ZkPaths.owner(topology_id, task))
    return None if found is None else OwnerRecord.model_validate(found[0])


def tasks_on(store: ZkStore, topology_id: str, worker: WorkerProcess) -> list[int]:
    """The tasks the assignment gives ``worker``."""
    found = read_assignment(store, topology_id)
    if found is None:
        return []
    return sorted(t for t, w in found[0].tasks.items() if w == worker.worker_id)


def owned_by(store: ZkStore, topology_id: str, worker: WorkerProcess) -> dict[int, int]:
    """Task -> owner epoch, for the tasks ``worker`` owns now."""
    status = describe_topology(store, topology_id)
    return {t.task_id: t.owner_epoch or 0 for t in status.tasks if t.owner == worker.worker_id}


def log_lines(worker: WorkerProcess, pattern: str, *, since: int = 0) -> list[str]:
    """Lines of ``worker``'s log (from byte ``since``) matching the regex ``pattern``."""
    try:
        with open(worker.log, "rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    rx = re.compile(pattern)
    return [line for line in text.splitlines() if rx.search(line)]


def log_size(worker: WorkerProcess) -> int:
    try:
        return worker.log.stat().st_size
    except OSError:
        return 0


# --- the input -----------------------------------------------------------------------------


class Feeder:
    """Feeds a word count's input continuously on a thread, remembering every sentence sent
    (the ground truth). Sentences are the sample ones plus one word never sent before each time."""

    _rounds = itertools.count()

    def __init__(self, topology: Topology, *, pause_s: float = 0.15, tag: str = "w") -> None:
        source = topology.chains[0].source
        assert source is not None and isinstance(source.topic, FileTopic), "the word count reads a FileTopic"
        self.topic: FileTopic = source.topic
        self.pause_s = pause_s
        self.tag = tag
        self.sent: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nemesis-feeder", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        i = 0
        try:
            while not self._stop.is_set():
                batch = [*list(SAMPLE_SENTENCES)[i % 8 :], f"{self.tag}{i} how"]
                produce(self.topic, ({"sentence": s} for s in batch))
                with self._lock:
                    self.sent.extend(batch)
                i += 1
                self._stop.wait(self.pause_s)
        except BaseException as e:  # noqa: BLE001 - reported by stop()
            self.error = e

    def start(self) -> Feeder:
        self._thread.start()
        return self

    def stop(self) -> list[str]:
        """Stop feeding; returns everything sent."""
        self._stop.set()
        self._thread.join(30)
        if self.error is not None:
            raise AssertionError(f"feeding the input failed: {self.error!r}") from self.error
        with self._lock:
            return list(self.sent)

    def __enter__(self) -> Feeder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


# --- scenario building blocks --------------------------------------------------------------


def _store_dir_name(worker: WorkerProcess, topology_id: str, task: int) -> str:
    """The tail of a task's RocksDB directory on ``worker`` (``TopologyLayout.local_store_dir``)."""
    return f"{worker.worker_id.replace(':', '_')}/{topology_id}/task-{task:05d}"


def committed(store: ZkStore, topology_id: str) -> dict[int, int]:
    """Task -> committed txid."""
    return {t.task_id: t.committed_txid for t in describe_topology(store, topology_id).tasks}


def wait_committed_beyond(
    store: ZkStore, topology_id: str, baseline: dict[int, int], tasks: Sequence[int], what: str, *, by: int = 1
) -> dict[int, int]:
    """Until each of ``tasks`` committed at least ``by`` batches past ``baseline``; returns the txids."""

    def advanced() -> dict[int, int] | None:
        now = committed(store, topology_id)
        return now if all(now[t] >= baseline[t] + by for t in tasks) else None

    return wait_for(advanced, STEP_TIMEOUT_S, what, poll_s=0.2)


@contextlib.contextmanager
def scenario_topology(
    stack: NemesisStack, store: ZkStore, name: str, state: Any, timeline: Timeline
) -> Iterator[tuple[Topology, str]]:
    """Submit a word count named ``name`` (input under ``<home>/input/<name>``, 2 source and 2
    keyed tasks over the two workers); afterwards deactivate it, wait for its tasks to be
    released, kill it and delete its files on the small mounts (a soak runs many)."""
    topology = build_wordcount(stack.home / "input" / name, name=name, state=state, split_with="sql")
    topology_id = submit(store, stack.cluster, topology, workers=2)
    timeline.mark(f"submitted {topology_id} ({getattr(state, '__name__', state)}), tasks on {_placement(store, topology_id)}")
    try:
        yield topology, topology_id
    finally:
        _retire(stack, store, topology_id)


def _placement(store: ZkStore, topology_id: str) -> dict[int, str]:
    found = read_assignment(store, topology_id)
    return {} if found is None else dict(sorted(found[0].tasks.items()))


def _owned_tasks(store: ZkStore, topology_id: str) -> list[str]:
    path = ZkPaths.owners(topology_id)
    return store.children(path) if store.exists(path) else []


def _retire(stack: NemesisStack, store: ZkStore, topology_id: str) -> None:
    try:
        deactivate(store, topology_id)
        try:
            wait_for(lambda: not _owned_tasks(store, topology_id), 30.0, f"the tasks of {topology_id} to be released")
        except AssertionError:
            logger.warning("tasks of %s still owned 30 s after its deactivation; killing it anyway", topology_id)
        kill(store, topology_id)
    except Exception:
        logger.warning("could not retire %s", topology_id, exc_info=True)
    shutil.rmtree(stack.cluster.resolved_topics_root() / topology_id, ignore_errors=True)
    if stack.nemesis_local_dir is not None and stack.nemesis_local_dir.exists():
        for worker_dir in stack.nemesis_local_dir.iterdir():
            shutil.rmtree(worker_dir / topology_id, ignore_errors=True)


def _await_running(store: ZkStore, topology_id: str, workers: Sequence[WorkerProcess], timeline: Timeline) -> dict[int, int]:
    """Until every task committed a batch and is owned by its assigned worker; returns the
    committed txids then."""

    def running() -> dict[int, int] | None:
        status = describe_topology(store, topology_id)
        ok = all(t.committed_txid >= 0 and t.owner is not None and t.owner == t.assigned_to for t in status.tasks)
        return {t.task_id: t.committed_txid for t in status.tasks} if ok else None

    found = wait_for(running, STEP_TIMEOUT_S, f"every task of {topology_id} to run and commit", poll_s=0.2)
    owners = {w.worker_id: tasks_on(store, topology_id, w) for w in workers}
    timeline.mark(f"every task committed; tasks per worker {owners}")
    return found


def _exact(store: ZkStore, topology: Topology, sent: list[str], timeline: Timeline) -> dict[str, int]:
    expected = expected_word_counts(sent)
    wait_for_counts(store, topology.name, "words", expected, timeout_s=COUNTS_TIMEOUT_S)
    timeline.mark(f"counts exact: {len(expected)} words, {sum(expected.values())} counted, from {len(sent)} sentences fed")
    return expected


def _check_commit_order(history: TransactionalHistory, timeline: Timeline) -> None:
    """Per task, every commit seen has a txid and an owner epoch at least those of the one before."""
    for task in history.tasks:
        commits = [(v.record.committed_txid, v.record.committed_epoch) for v in history.commits(task)]
        for before, after in itertools.pairwise(commits):
            assert after[0] >= before[0] and after[1] >= before[1], (
                f"task {task}: commit (txid, epoch) {after} after {before}: a commit went backwards"
            )
    timeline.mark(
        "commit order: txids and owner epochs never went backwards ("
        + ", ".join(f"task {t}: {len(history.commits(t))} commits" for t in history.tasks)
        + ")"
    )


def zombie_files_that_count(topics_dir: Path, task: int, epoch: int, above_txid: int) -> list[Path]:
    """Batch files of ``task`` written under owner ``epoch`` for a txid above ``above_txid`` that a
    reader would accept: published (not staged, not hidden) shuffle, sink or dead-letter files
    at all, and state-topic files unless a higher epoch wrote the same txid (the replay rule
    counts only the highest epoch's file of a txid; DESIGN section 5)."""
    rx = re.compile(rf"^t{task:05d}-x(\d{{12}})-e(\d{{6}})\.")
    counted = []
    for path in topics_dir.rglob(f"t{task:05d}-x*-e{epoch:06d}.*"):
        relative = path.relative_to(topics_dir).parts
        match = rx.match(path.name)
        if match is None or int(match.group(1)) <= above_txid or any(p.startswith((".", "_")) for p in relative):
            continue
        if relative[0].startswith("state-"):
            txid = match.group(1)
            superseded = any(
                (m := rx.match(other.name)) is not None and int(m.group(2)) > epoch
                for other in path.parent.glob(f"t{task:05d}-x{txid}-e*.*")
            )
            if superseded:
                continue
        counted.append(path)
    return counted


# --- scenario: a network partition between one worker and ZooKeeper ------------------------


def run_partition(
    stack: NemesisStack,
    *,
    name: str,
    state: Any = TransactionalMapState,
    hold_s: float | None = None,
    drop_connections: bool = False,
    lead_s: float = 0.0,
) -> ScenarioResult:
    """Cut the nemesis worker (an owner of half the tasks) from ZooKeeper while it keeps its
    disk and Spark, and input keeps coming; heal the cut; end exact.

    With ``hold_s`` None the cut lasts until its session expired, the plain worker took its
    tasks over under a higher owner epoch and committed past the cut; with a number it lasts
    that long (below the session timeout the session survives and no task moves). ``lead_s``:
    how long input flows after the first commits before the cut.

    Checks: no commit under the cut worker's owner epoch reaches ``/transactional`` while cut
    (ZooKeeper's zxid order), nor ever after the cut once its session expired; then no file of
    that epoch above the txid committed at the cut is one a reader accepts; the zombie learns
    its session is gone (its log) and registers again; a session that survived commits again
    under the same epoch; every count equals the ground truth.
    """
    timeline = Timeline(name)
    proxy = stack.proxy
    assert proxy is not None
    stack.ensure_workers()
    zombie, survivor = stack.nemesis, stack.plain
    assert zombie is not None and survivor is not None
    facts: dict[str, Any] = {"drop_connections": drop_connections}
    with ZkStore.connect(stack.zk_config) as store, scenario_topology(stack, store, name, state, timeline) as (topology, tid):
        topics_dir = stack.cluster.resolved_topics_root() / tid
        with Feeder(topology, tag=f"{name}-") as feeder:
            _await_running(store, tid, (zombie, survivor), timeline)
            mine = owned_by(store, tid, zombie)
            assert mine, f"the scheduler gave {zombie.worker_id} no task of {tid}: {_placement(store, tid)}"
            all_tasks = sorted(committed(store, tid))
            # The worker to be cut commits first: its tasks are past their first batches.
            wait_committed_beyond(store, tid, committed(store, tid), list(mine), "commits on the worker to be cut", by=2)
            _linger(lead_s, timeline)
            with TransactionalHistory(store, tid, all_tasks) as history:
                log_at_cut = log_size(zombie)
                proxy.cut(drop_connections=drop_connections)
                try:
                    cut_zxid = zxid_now(store)
                    history.read()
                    cut_txids = {t: r.committed_txid for t in all_tasks if (r := history.latest(t)) is not None}
                    t_cut = timeline.mark(
                        f"CUT {zombie.worker_id} from ZooKeeper (silent; connections "
                        f"{'dropped at the heal' if drop_connections else 'kept'}); it owned {mine} (task: epoch), "
                        f"committed txids {cut_txids}, cut zxid {cut_zxid:#x}"
                    )
                    expired = _hold_cut(store, tid, zombie, survivor, mine, cut_txids, hold_s, timeline, facts, t_cut)
                    heal_zxid = zxid_now(store)
                finally:
                    proxy.heal()
                t_heal = timeline.mark(f"HEALED the cut of {zombie.worker_id} (zxid before the heal {heal_zxid:#x})")
                facts["cut_s"] = round(t_heal - t_cut, 1)
                if expired:
                    lost = wait_for(
                        lambda: log_lines(zombie, r"session LOST", since=log_at_cut),
                        STEP_TIMEOUT_S,
                        "the zombie to see its session lost",
                    )
                    timeline.mark(f"zombie saw it: {lost[0].strip()[:160]}")
                    wait_for(
                        lambda: store.exists(ZkPaths.worker(zombie.worker_id)), STEP_TIMEOUT_S, "the zombie to register again"
                    )
                    timeline.mark(f"{zombie.worker_id} registered again under a new session")
                healed_at = committed(store, tid)
                # Input keeps coming while the healed worker is back: every task commits twice more.
                wait_committed_beyond(store, tid, healed_at, all_tasks, "commits after the heal", by=2)
                timeline.mark(f"commits after the heal: {committed(store, tid)}; owners {owned_by_all(store, tid)}")
                if not expired and log_lines(zombie, r"session LOST", since=log_at_cut):
                    expired = True  # it expired as the heal came in
                    timeline.mark(f"the session of {zombie.worker_id} expired as the heal came in")
                takeover = any((r := history.latest(t)) is not None and r.epoch > e for t, e in mine.items())
            sent = feeder.stop()
        _exact(store, topology, sent, timeline)
        refusals = log_lines(zombie, r"refused|left for replay|no longer owns", since=log_at_cut)
        facts.update(expired=expired, takeover=takeover, zombie_refusals=len(refusals))
        for line in refusals[:3]:
            timeline.mark(f"cut worker's log: {line.strip()[:220]}")
        for task, epoch in mine.items():
            # Expired: nothing under the old epoch after the cut, ever. Not expired: nothing while cut.
            late = [v for v in history.commits_of_epoch_after(task, epoch, cut_zxid) if expired or v.mzxid < heal_zxid]
            assert not late, (
                f"task {task}: commits under the cut worker's epoch {epoch} reached ZooKeeper after the cut"
                f"{'' if expired else ' and before the heal'}: {[(v.record.committed_txid, hex(v.mzxid)) for v in late]}"
            )
            if expired:
                counted = zombie_files_that_count(topics_dir, task, epoch, cut_txids[task])
                assert not counted, (
                    f"task {task}: files of the zombie's epoch {epoch} past the cut that readers accept: {counted}"
                )
            if takeover:
                final = history.latest(task)
                assert final is not None and final.epoch > epoch and final.committed_epoch > epoch, (
                    f"task {task}: after the takeover its record is {final}"
                )
            elif not expired:
                resumed = history.commits_of_epoch_after(task, epoch, heal_zxid)
                assert resumed, f"task {task}: the cut worker's session survived but it committed nothing after the heal"
        if expired:
            timeline.mark(
                f"zombie fenced: no commit under its epochs {mine} after the cut zxid; none of its files past the cut is "
                "read (no published shuffle file; its state-topic files superseded by the new owner's epoch)"
            )
        else:
            timeline.mark(
                f"session survived the cut: no commit under {mine} while cut, commits under the same epochs after the heal"
            )
        _check_commit_order(history, timeline)
    return ScenarioResult(name, timeline.now(), timeline.lines(), facts)


def _hold_cut(
    store: ZkStore,
    topology_id: str,
    zombie: WorkerProcess,
    survivor: WorkerProcess,
    mine: dict[int, int],
    cut_txids: dict[int, int],
    hold_s: float | None,
    timeline: Timeline,
    facts: dict[str, Any],
    t_cut: float,
) -> bool:
    """Keep the cut: until the takeover is done (``hold_s`` None) or for ``hold_s``; returns
    whether the cut worker's session expired meanwhile."""
    if hold_s is None:
        wait_for(lambda: not store.exists(ZkPaths.worker(zombie.worker_id)), STEP_TIMEOUT_S, "the cut worker's session to expire")
        t_expired = timeline.mark(f"session of {zombie.worker_id} expired (its /workers node is gone)")
        new_epochs = wait_for(
            lambda: _taken_over(store, topology_id, mine, survivor), STEP_TIMEOUT_S, "the plain worker to take the tasks over"
        )
        t_takeover = timeline.mark(f"TAKEOVER by {survivor.worker_id}: owner epochs {new_epochs}")
        wait_committed_beyond(store, topology_id, cut_txids, list(mine), "the new owner's commits past the cut", by=2)
        timeline.mark(f"new owner committed past the cut: {committed(store, topology_id)}")
        facts.update(expired_after_s=round(t_expired - t_cut, 1), takeover_after_s=round(t_takeover - t_cut, 1))
        return True
    expired = False
    deadline = time.monotonic() + hold_s
    while time.monotonic() < deadline:
        if not expired and not store.exists(ZkPaths.worker(zombie.worker_id)):
            expired = True
            facts["expired_after_s"] = round(
                timeline.mark(f"session of {zombie.worker_id} expired (its /workers node is gone)") - t_cut, 1
            )
        time.sleep(0.05)
    return expired


def _linger(seconds: float, timeline: Timeline) -> None:
    """Let input flow ``seconds`` more before the nemesis strikes (the soak's random timing)."""
    if seconds <= 0:
        return
    threading.Event().wait(seconds)
    timeline.mark(f"input flowed {seconds:.1f} s more")


def owned_by_all(store: ZkStore, topology_id: str) -> dict[int, str | None]:
    return {t.task_id: t.owner for t in describe_topology(store, topology_id).tasks}


def _taken_over(store: ZkStore, topology_id: str, old: dict[int, int], by: WorkerProcess) -> dict[int, int] | None:
    """Task -> new owner epoch, once ``by`` owns every task of ``old`` under a higher epoch."""
    found = {}
    for task, epoch in old.items():
        owner = owner_of(store, topology_id, task)
        if owner is None or owner.worker_id != by.worker_id or owner.epoch <= epoch:
            return None
        found[task] = owner.epoch
    return found


def stateful_tasks(store: ZkStore, topology_id: str) -> list[int]:
    """The tasks that keep state (the keyed word counts)."""
    found = store.get_json(ZkPaths.storm(topology_id))
    assert found is not None, f"{topology_id} is not submitted"
    return sorted(found[0].get("stateful_tasks", []))


# --- scenario: the disk of the topics / of the state stores is full ------------------------


def _disk_full_errors(store: ZkStore, topology_id: str, *, since: float, under: Path) -> dict[int, str]:
    """Task -> reason of its latest failure after ``since`` (unix time) that names ENOSPC on a
    file under ``under``."""
    root = os.path.realpath(under)
    found = {}
    for task, record in read_task_errors(store, topology_id).items():
        for error in reversed(record.errors):
            if error.time >= since and "No space left on device" in error.reason and root in error.reason:
                found[task] = error.reason
                break
    return found


def run_disk_full(
    stack: NemesisStack,
    *,
    name: str,
    state: Any = OpaqueMapState,
    disks: Sequence[str] = ("topics", "local"),
    hold_s: float = 0.0,
    lead_s: float = 0.0,
) -> ScenarioResult:
    """Fill a small tmpfs while input keeps coming, then give the space back; end exact.

    ``disks``, in turn: ``"topics"``, the internal topics of every worker (shuffle and state
    topics: a batch cannot stage or append, so it cannot commit); ``"local"``, the nemesis
    worker's RocksDB stores (a committed batch's store write fails after its commit, and its
    repair from the state topic fails too). Each time a task must stop with an error naming the
    full disk, shown in ``/errors/{id}/{task}`` and in the status's problems; the disk stays
    full ``hold_s`` longer; once the filler is deleted every task commits again (a task the
    worker quarantined meanwhile is released as an operator would: its ``/errors`` node deleted).
    ``lead_s``: how long input flows after the first commits before the first disk fills.
    """
    timeline = Timeline(name)
    assert stack.topics_root is not None and stack.nemesis_local_dir is not None
    mounts = {"topics": stack.topics_root.parent, "local": stack.nemesis_local_dir.parent}
    stack.ensure_workers()
    nemesis, plain = stack.nemesis, stack.plain
    assert nemesis is not None and plain is not None
    facts: dict[str, Any] = {}
    with ZkStore.connect(stack.zk_config) as store, scenario_topology(stack, store, name, state, timeline) as (topology, tid):
        with Feeder(topology, tag=f"{name}-") as feeder:
            _await_running(store, tid, (nemesis, plain), timeline)
            all_tasks = sorted(committed(store, tid))
            keyed_here = sorted(set(stateful_tasks(store, tid)) & set(tasks_on(store, tid, nemesis)))
            assert "local" not in disks or keyed_here, (
                f"{nemesis.worker_id} runs no keyed task of {tid}, so its full store disk would touch nothing: "
                f"{_placement(store, tid)}"
            )
            _linger(lead_s, timeline)
            for disk in disks:
                mount = mounts[disk]
                filled_since = time.time()
                filler = fill_disk(mount)
                t_fill = timeline.mark(
                    f"FILLED the {disk} tmpfs {mount} ({filler.stat().st_size >> 20} MiB filler, {free_bytes(mount)} bytes left)"
                )
                try:
                    failed = wait_for(
                        lambda mount=mount, since=filled_since: _disk_full_errors(store, tid, since=since, under=mount),  # type: ignore[misc]
                        STEP_TIMEOUT_S,
                        f"a task to stop with an error naming the full {disk} disk",
                        poll_s=0.2,
                    )
                    t_error = timeline.mark(f"tasks {sorted(failed)} STOPPED with: {next(iter(failed.values()))[:300]}")
                    problems = describe_topology(store, tid).problems()
                    assert any("No space left on device" in line for line in problems), (
                        f"the status names no full disk: {problems}"
                    )
                    shown = stream_ops_status(stack, tid)
                    assert "No space left on device" in shown, f"stream-ops status does not name the full disk:\n{shown}"
                    timeline.mark(
                        "stream-ops status: " + " | ".join(line.strip()[:160] for line in shown.splitlines() if "!" in line)
                    )
                    facts[f"{disk}_error_after_s"] = round(t_error - t_fill, 1)
                    if hold_s > 0:
                        until = time.monotonic() + hold_s
                        while time.monotonic() < until:
                            time.sleep(0.1)
                        timeline.mark(f"held full {hold_s:.1f} s more; failing tasks: {describe_topology(store, tid).problems()}")
                finally:
                    filler.unlink(missing_ok=True)
                t_free = timeline.mark(f"space of the {disk} tmpfs given back ({free_bytes(mount)} bytes free)")
                released = _release_quarantined(store, tid)
                if released:
                    timeline.mark(f"tasks {released} were quarantined; released as an operator would (/errors deleted)")
                wait_committed_beyond(
                    store, tid, committed(store, tid), all_tasks, f"every task to commit again after the {disk} disk had room"
                )
                t_resumed = timeline.mark(
                    f"RESUMED: every task committed again; owner epochs {[(t.task_id, t.owner_epoch) for t in describe_topology(store, tid).tasks]}"
                )
                facts[f"{disk}_resumed_after_s"] = round(t_resumed - t_free, 1)
                facts[f"{disk}_quarantined"] = released
            sent = feeder.stop()
        _exact(store, topology, sent, timeline)
    return ScenarioResult(name, timeline.now(), timeline.lines(), facts)


def stream_ops_status(stack: NemesisStack, topology_id: str) -> str:
    """The output of ``stream-ops status <id>`` run as an operator would (its own process)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "stream_ops.cli",
            "--zookeeper",
            stack.zk_config.hosts,
            "--chroot",
            stack.chroot,
            "--home",
            str(stack.home),
            "status",
            topology_id,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**stack.env(), "STREAM_OPS_ZK_INSECURE": "true"},
    )
    return done.stdout + done.stderr


def _release_quarantined(store: ZkStore, topology_id: str) -> list[int]:
    quarantined = [t.task_id for t in describe_topology(store, topology_id).tasks if t.quarantined]
    for task in quarantined:
        clear_task_errors(store, (topology_id, task))
    return quarantined


# --- scenario: a slow disk (fsync taking seconds) during commits and takeovers -------------


def run_slow_disk(
    stack: NemesisStack,
    *,
    name: str,
    state: Any = TransactionalMapState,
    delay_ms: int = 1000,
    progress_while_slow: bool = False,
    lead_s: float = 0.0,
) -> ScenarioResult:
    """Make every ``fsync``/``fdatasync`` of the nemesis worker (its Python process and Spark
    JVM: the shim is ``LD_PRELOAD``-ed into both) sleep ``delay_ms``; let it commit under the
    slow disk; SIGKILL the plain worker while the nemesis worker sits in a slow fsync, so the
    slow worker must take the killed worker's tasks over (restore their stores, start their
    queries) on the slow disk; then make the disk fast again; end exact.

    With ``progress_while_slow`` the slow worker must also commit every task it took over
    before the disk becomes fast: a liveness requirement the worker does not meet today at
    ``delay_ms`` 1000 (rocksdict holds the GIL through RocksDB's fsyncs, so kazoo cannot ping
    and the session expires at every store open; see ``test_nemesis.py``). ``lead_s``: how long
    input flows after the first commits before the disk turns slow.
    """
    timeline = Timeline(name)
    shim = stack.shim
    assert shim is not None, "the stack was started without the fsync shim"
    stack.ensure_workers()
    slow, other = stack.nemesis, stack.plain
    assert slow is not None and other is not None
    facts: dict[str, Any] = {"delay_ms": delay_ms}
    tree = process_tree(slow.proc.pid)
    loaded = [pid for pid in tree if shim.loaded_by(pid)]
    assert slow.proc.pid in loaded and len(loaded) >= 2, (
        f"the shim is loaded in {loaded} of the slow worker's processes {tree} (want its Python process and its JVM)"
    )
    timeline.mark(f"shim {shim.library.name} loaded in the slow worker {slow.worker_id}'s processes {loaded} of {tree}")
    with ZkStore.connect(stack.zk_config) as store, scenario_topology(stack, store, name, state, timeline) as (topology, tid):
        with Feeder(topology, tag=f"{name}-") as feeder:
            _await_running(store, tid, (slow, other), timeline)
            all_tasks = sorted(committed(store, tid))
            mine = owned_by(store, tid, slow)
            theirs = owned_by(store, tid, other)
            assert mine and theirs, f"both workers must own tasks of {tid}: {_placement(store, tid)}"
            _linger(lead_s, timeline)
            with TransactionalHistory(store, tid, all_tasks) as history:
                log_at_slow = log_size(slow)
                syncs_before = len(shim.syncs())
                at_slow = committed(store, tid)
                shim.slow(delay_ms)
                try:
                    t_slow = timeline.mark(f"SLOW DISK on: every fsync/fdatasync of {slow.worker_id} sleeps {delay_ms} ms")
                    # Commits under the slow disk: two more per task (the first may have synced before).
                    wait_committed_beyond(store, tid, at_slow, list(mine), "commits of the slow worker under the slow disk", by=2)
                    slowed = shim.syncs()[syncs_before:]
                    assert any(s.pid in tree and s.ended_ns is not None for s in slowed), "no fsync of the slow worker was slowed"
                    timeline.mark(
                        f"slow worker committed under the slow disk: {committed(store, tid)}; {len(slowed)} slowed syncs, e.g. "
                        f"{sorted({Path(s.path).parent.name + '/' + Path(s.path).name[:32] for s in slowed})[:4]}"
                    )
                    in_sync = wait_for(
                        lambda: shim.in_progress(process_tree(slow.proc.pid)),
                        STEP_TIMEOUT_S,
                        "the slow worker to sit in a slow fsync",
                    )
                    at_kill = committed(store, tid)
                    stack.kill_worker(other)
                    t_kill = timeline.mark(
                        f"SIGKILLED {other.worker_id} (owner of {theirs}) while {slow.worker_id} sat in {in_sync[0].call} of "
                        f"{in_sync[0].path}"
                    )
                    new_epochs = wait_for(
                        lambda: _taken_over(store, tid, theirs, slow), STEP_TIMEOUT_S, "the slow worker to take the tasks over"
                    )
                    t_takeover = timeline.mark(f"TAKEOVER by the slow worker under the slow disk: owner epochs {new_epochs}")
                    facts["takeover_after_kill_s"] = round(t_takeover - t_kill, 1)
                    keyed_moved = sorted(set(stateful_tasks(store, tid)) & set(theirs))
                    if keyed_moved:
                        marker = _store_dir_name(slow, tid, keyed_moved[0])
                        wait_for(
                            lambda: any(marker in s.path for s in shim.syncs()),
                            STEP_TIMEOUT_S,
                            "the slow worker to open a moved task's store on the slow disk",
                        )
                        timeline.mark(f"the slow worker opens moved task {keyed_moved[0]}'s RocksDB on the slow disk")
                    # The takeover runs on the slow disk until every moved task runs there, or the
                    # slow worker lost its session trying (see the module docstring).
                    outcome = wait_for(
                        lambda: _takeover_outcome(slow, tid, list(theirs), since=log_at_slow),
                        STEP_TIMEOUT_S,
                        "the moved tasks to run on the slow worker, or its session to be lost",
                    )
                    timeline.mark(f"under the slow disk: {outcome}")
                    if progress_while_slow:
                        wait_committed_beyond(
                            store, tid, at_kill, list(theirs), "the slow worker's commits of the moved tasks while slow"
                        )
                        timeline.mark(f"the slow worker committed the moved tasks while slow: {committed(store, tid)}")
                finally:
                    shim.fast()
                t_fast = timeline.mark(
                    f"SLOW DISK off after {timeline.now() - t_slow:.1f} s, {len(shim.syncs()) - syncs_before} slowed syncs"
                )
                losses = log_lines(slow, r"session LOST", since=log_at_slow)
                facts["session_losses_while_slow"] = len(losses)
                if losses:
                    timeline.mark(
                        f"the slow worker lost its ZooKeeper session {len(losses)} times while slow: {losses[0].strip()[:160]}"
                    )
                released = _release_quarantined(store, tid)
                if released:
                    timeline.mark(
                        f"tasks {released} were quarantined while slow; released as an operator would (/errors deleted)"
                    )
                facts["quarantined"] = released
                wait_for(lambda: _owned_by_one(store, tid, slow, all_tasks), STEP_TIMEOUT_S, "the slow worker to own every task")
                wait_committed_beyond(store, tid, at_kill, all_tasks, "commits of every task after the disk is fast")
                t_done = timeline.mark(f"every task committed on {slow.worker_id}: {committed(store, tid)}")
                facts["all_committing_after_fast_s"] = round(t_done - t_fast, 1)
            sent = feeder.stop()
        _exact(store, topology, sent, timeline)
        _check_commit_order(history, timeline)
    return ScenarioResult(name, timeline.now(), timeline.lines(), facts)


def _takeover_outcome(worker: WorkerProcess, topology_id: str, tasks: Sequence[int], *, since: int) -> str | None:
    """What became of a takeover by ``worker`` (its log from byte ``since``): every task of
    ``tasks`` running, or its ZooKeeper session lost; None while neither."""
    lost = log_lines(worker, r"session LOST", since=since)
    if lost:
        return f"{worker.worker_id} LOST its ZooKeeper session: {lost[0].strip()[:160]}"
    running = {t for t in tasks if log_lines(worker, rf"task {re.escape(topology_id)}/{t} running on ", since=since)}
    if running == set(tasks):
        return f"every moved task {sorted(tasks)} started on {worker.worker_id}"
    return None


def _owned_by_one(store: ZkStore, topology_id: str, worker: WorkerProcess, tasks: Sequence[int]) -> bool:
    return set(owned_by(store, topology_id, worker)) >= set(tasks)
