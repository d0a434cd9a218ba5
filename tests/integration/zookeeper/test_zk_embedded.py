"""The embedded ZooKeeper server: start, readiness, stop, kill, restart, errors."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from stream_ops.config import ZooKeeperConfig
from stream_ops.coordination import embedded
from stream_ops.coordination.embedded import EmbeddedZooKeeper, four_letter_word, pyspark_jars_dir, zookeeper_classpath
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import JavaNotFoundError, ZooKeeperServerError, ZooKeeperUnavailableError
from stream_ops.jvm_server import find_java, serve_forever


def _wait_for(predicate, timeout_s: float = 10.0, interval_s: float = 0.02) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        time.sleep(interval_s)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_session_server_is_ready(zookeeper: EmbeddedZooKeeper) -> None:
    assert zookeeper.running
    assert zookeeper.is_serving()
    reply = four_letter_word(zookeeper.host, zookeeper.port, "srvr")
    assert "Mode: standalone" in reply
    assert four_letter_word(zookeeper.host, zookeeper.port, "ruok") == "imok"
    cfg = zookeeper.config_path.read_text()
    for line in (
        "tickTime=500",
        "minSessionTimeout=1000",
        "clientPortAddress=127.0.0.1",
        "admin.enableServer=false",
        "4lw.commands.whitelist=srvr,ruok,mntr,stat",
    ):
        assert line in cfg.splitlines()


def test_lifecycle_kill_restart_and_store_reconnect(tmp_path: Path) -> None:
    """Start, SIGKILL, restart on the same data and port, stop twice; a store rides through."""
    data_dir = tmp_path / "zk"
    server = EmbeddedZooKeeper(data_dir, tick_time_ms=200)
    assert not server.running and server.pid is None
    server.start()
    assert server.running and server.is_serving()
    assert server.hosts == f"127.0.0.1:{server.port}"
    with pytest.raises(ZooKeeperServerError, match="already running"):
        server.start()
    port = server.port
    config = ZooKeeperConfig(hosts=server.hosts, chroot="/kept", session_timeout_s=3, connect_timeout_s=5)
    store = ZkStore.connect(config, operation_timeout_s=0.5)
    try:
        store.create_json("/survivor", {"n": 1})
        server.kill()
        assert not server.running
        with pytest.raises(OSError):
            four_letter_word("127.0.0.1", port)
        server.stop()  # stop after kill is harmless

        # While the server is down, calls give up after the operation timeout without sending.
        _wait_for(lambda: not store.connected, timeout_s=5)
        started = time.monotonic()
        with pytest.raises(ZooKeeperUnavailableError, match="nothing was sent"):
            store.set_json("/survivor", {"n": 2})
        with pytest.raises(ZooKeeperUnavailableError):
            store.get_json("/survivor")
        assert time.monotonic() - started < 3

        again = EmbeddedZooKeeper(data_dir, port=port, tick_time_ms=200)
        with again:
            assert again.port == port
            pid = again.pid
            assert pid is not None
            _wait_for(lambda: store.connected, timeout_s=10)
            found = store.get_json("/survivor")
            assert found is not None and found[0] == {"n": 1}
        assert not again.running
        assert not _pid_alive(pid)
        assert not again.is_serving()
        again.stop()  # idempotent
        assert again.log_path.exists()
    finally:
        store.close()


def test_port_in_use_is_refused(zookeeper: EmbeddedZooKeeper, tmp_path: Path) -> None:
    server = EmbeddedZooKeeper(tmp_path / "zk", port=zookeeper.port)
    with pytest.raises(ZooKeeperServerError, match="already in use"):
        server.start()
    assert server.pid is None


def test_jvm_exit_before_ready_reports_log_tail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded, "MAIN_CLASS", "org.example.DoesNotExist")
    server = EmbeddedZooKeeper(tmp_path / "zk")
    with pytest.raises(ZooKeeperServerError, match="exited with code") as info:
        server.start(timeout_s=20)
    assert "DoesNotExist" in str(info.value)  # the JVM's complaint, from the log tail
    assert not server.running


def test_not_ready_in_time_raises_and_kills(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded, "four_letter_word", lambda *a, **k: "This ZooKeeper instance is not serving")
    server = EmbeddedZooKeeper(tmp_path / "zk")
    started = time.monotonic()
    with pytest.raises(ZooKeeperServerError, match="not ready after"):
        server.start(timeout_s=0.5)
    assert time.monotonic() - started < 5
    assert not server.running


def test_missing_java(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", "")
    with pytest.raises(JavaNotFoundError, match="Java 17"):
        find_java()
    with pytest.raises(JavaNotFoundError, match="JAVA_HOME"):
        EmbeddedZooKeeper(tmp_path / "zk").start()


def test_java_home_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    java = shutil.which("java")
    assert java is not None
    java_home = Path(os.path.realpath(java)).parent.parent
    monkeypatch.setenv("JAVA_HOME", str(java_home))
    monkeypatch.setenv("PATH", "")
    assert find_java() == str(java_home / "bin" / "java")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))  # no bin/java there
    with pytest.raises(JavaNotFoundError, match=str(tmp_path)):
        find_java()


def test_pyspark_ships_zookeeper() -> None:
    assert any(pyspark_jars_dir().glob("zookeeper-*.jar"))


def test_serve_forever_until_event(tmp_path: Path) -> None:
    server = EmbeddedZooKeeper(tmp_path / "zk")
    stop = threading.Event()
    errors: list[BaseException] = []

    def _run() -> None:
        try:
            serve_forever(server, stop, poll_interval_s=0.05)
        except BaseException as e:  # noqa: BLE001 - pragma: no cover - reported below
            errors.append(e)

    thread = threading.Thread(target=_run)
    thread.start()
    try:
        _wait_for(server.is_serving, timeout_s=30)
    finally:
        stop.set()
        thread.join(timeout=15)
    assert not thread.is_alive()
    assert not errors
    assert not server.running


class _FakeServer:
    """Stands in for EmbeddedZooKeeper where serve_forever's control flow is under test."""

    kind = "ZooKeeper"
    error_type = ZooKeeperServerError
    hosts = address = "127.0.0.1:1"
    pid = 1
    data_dir = log_path = Path("/nonexistent")

    def __init__(self, die_after_s: float | None = None) -> None:
        self.started_at: float | None = None
        self.stopped = False
        self.die_after_s = die_after_s

    @property
    def running(self) -> bool:
        if self.started_at is None or self.stopped:
            return False
        return self.die_after_s is None or time.monotonic() - self.started_at < self.die_after_s

    def start(self, timeout_s: float = 30.0) -> None:
        self.started_at = time.monotonic()

    def stop(self, timeout_s: float = 10.0) -> None:
        self.stopped = True

    def log_tail(self) -> str:
        return "last words"


def test_serve_forever_stops_on_sigterm() -> None:
    server = _FakeServer()
    before = signal.getsignal(signal.SIGTERM)

    def _send_sigterm_when_serving() -> None:
        _wait_for(lambda: server.running, timeout_s=10)  # handlers are installed before start()
        os.kill(os.getpid(), signal.SIGTERM)

    sender = threading.Thread(target=_send_sigterm_when_serving)
    sender.start()
    serve_forever(server, poll_interval_s=0.02)  # type: ignore[arg-type]  # returns on SIGTERM
    sender.join()
    assert server.stopped
    assert signal.getsignal(signal.SIGTERM) == before


def test_serve_forever_reports_a_dead_server() -> None:
    server = _FakeServer(die_after_s=0.1)
    with pytest.raises(ZooKeeperServerError, match="(?s)exited unexpectedly.*last words"):
        serve_forever(server, threading.Event(), poll_interval_s=0.02)  # type: ignore[arg-type]
    assert server.stopped


def test_classpath_is_short_but_complete(tmp_path: Path) -> None:
    jars = pyspark_jars_dir()
    entries = zookeeper_classpath(jars).split(os.pathsep)
    names = {Path(e).name for e in entries}
    assert any(n.startswith("zookeeper-jute-") for n in names)
    assert any(n.startswith("slf4j-api-") for n in names)
    assert len(entries) < len(list(jars.glob("*.jar")))
    (tmp_path / "zookeeper-9.9.jar").touch()  # unrecognisable layout: use every jar
    assert zookeeper_classpath(tmp_path) == f"{tmp_path}{os.sep}*"
