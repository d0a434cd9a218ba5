"""The state-query server cannot starve its worker (issue 17, items 6 and 8; issue 30).

* Connections beyond a peer's share of the pending slots get 503 at once, and requests with
  the token beyond the served slots too; a client dripping its request is cut off at the
  auth deadline (not kept alive by each byte); deeply nested ``keys`` get 400; every error is a
  JSON reply and one log line, never a traceback.
* A worker process under a low open-files limit raises it to the hard limit, and keeps its
  ZooKeeper session and its tasks while a thousand clients drip one byte every few seconds
  into its query port (before: descriptors ran out, kazoo could not reconnect, the session and
  every task were lost).
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stream_ops.config import ClusterConfig, ZooKeeperConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.examples.wordcount import build_wordcount
from stream_ops.local_stack import expected_word_counts, wait_for_counts
from stream_ops.nimbus import submit
from stream_ops.ports import free_port
from stream_ops.runtime.query_server import MAX_JSON_DEPTH, QueryLimits, QueryServer
from stream_ops.topics.producer import produce

HERE = Path(__file__).resolve().parent
OTHER_LOOPBACK = "127.0.0.2"  # Linux routes all of 127/8 to lo: another peer on this machine
REPO = HERE.parents[2]


def _lookup(topology_id: str, task_id: int, keys: list[tuple[Any, ...]]) -> list[Any] | None:
    if topology_id == "boom":
        raise RuntimeError("lookup failed")
    return [len(key) for key in keys] if topology_id == "wc-1-1700000000" else None


SMALL = QueryLimits(max_connections=2, max_pending=4, max_pending_per_peer=2, auth_deadline_s=1.5)
"""Two requests served at once, four pending connections (two per peer), 1.5 s to send a request."""


@pytest.fixture
def small_server() -> Iterator[QueryServer]:
    srv = QueryServer("127.0.0.1", 0, _lookup, limits=SMALL)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def _port(srv: QueryServer) -> int:
    return int(srv.server_address[1])


def _raw_get(port: int, target: str, timeout_s: float = 5, source: str | None = None) -> tuple[int, dict[str, Any]]:
    """``GET target`` sent as is (no URL encoding) from ``source`` (an address); (status, JSON body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s, source_address=(source, 0) if source else None) as sock:
        sock.sendall(f"GET {target} HTTP/1.0\r\n\r\n".encode("latin-1"))
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_connections_over_a_peers_pending_cap_get_503_at_once(small_server: QueryServer, wait_until: Any) -> None:
    port = _port(small_server)
    idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(2)]
    try:
        wait_until(lambda: small_server.pending_connections == 2, 5, "2 connections to hold 127.0.0.1's 2 pending slots")
        started = time.monotonic()
        assert _health(port, timeout_s=3) == 503
        assert time.monotonic() - started < 1.0
        status, body = _raw_get(port, "/health")
        assert status == 503 and "2 connections from your address" in body["error"]
        assert small_server.pending_connections == 2  # refused by the accepting thread, no slot taken
        # Another peer has slots of its own.
        assert _health(port, timeout_s=3, source=OTHER_LOOPBACK) == 200
    finally:
        for sock in idle:
            sock.close()
    wait_until(lambda: _health(port, timeout_s=3) == 200, 5, "a slot to be free again")


def test_requests_over_the_served_cap_get_503_and_the_rest_is_still_answered(wait_until: Any) -> None:
    release = threading.Event()

    def blocking(topology_id: str, task_id: int, keys: list[tuple[Any, ...]]) -> list[Any] | None:
        release.wait(10)
        return [0 for _ in keys]

    srv = QueryServer("127.0.0.1", 0, blocking, limits=SMALL)
    srv.start()
    port = _port(srv)
    answers: list[int] = []
    try:
        held = [
            threading.Thread(target=lambda: answers.append(_raw_get(port, "/query?topology=t&task=1&keys=[[1]]")[0]))
            for _ in range(2)
        ]
        for thread in held:
            thread.start()
        wait_until(lambda: srv.served_connections == 2, 5, "two requests to hold both served slots")
        status, body = _raw_get(port, "/query?topology=t&task=1&keys=[[1]]", source=OTHER_LOOPBACK)
        assert status == 503 and "serving its limit of 2 requests" in body["error"]
        assert _health(port, timeout_s=3) == 200  # answered from a pending slot
        release.set()
        for thread in held:
            thread.join(10)
        assert answers == [200, 200]
    finally:
        release.set()
        srv.stop()


def test_a_slow_drip_client_is_cut_off_at_the_auth_deadline(small_server: QueryServer, wait_until: Any) -> None:
    port = _port(small_server)
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nX-Drip: ")
        reply = b""
        # One byte every 0.2 s: each read of the server gets data long before any per-read timeout.
        while time.monotonic() - started < 6:
            try:
                sock.sendall(b"a")
            except OSError:
                break
            sock.settimeout(0.2)
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            reply += chunk
            if not chunk:
                break
    took = time.monotonic() - started
    assert reply.startswith(b"HTTP/1.0 408"), reply
    assert b"request not complete within 1.5 s" in reply
    assert 1.4 < took < 3.0
    wait_until(lambda: small_server.active_connections == 0, 5, "the connection's slot to be released")


def test_deeply_nested_keys_get_400_and_one_log_line(small_server: QueryServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="stream_ops.runtime.query_server")
    port = _port(small_server)
    nested = "[" * 30_000 + "]" * 30_000  # unencoded: 60,000 bytes, under the request size limit
    status, body = _raw_get(port, f"/query?topology=wc-1-1700000000&task=2&keys={nested}")
    assert status == 400 and f"deeper than {MAX_JSON_DEPTH} levels" in body["error"]
    too_deep = "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1)
    assert _raw_get(port, f"/query?topology=wc-1-1700000000&task=2&keys={too_deep}")[0] == 400
    deep_enough = "[[" + "[" * (MAX_JSON_DEPTH - 2) + "]" * (MAX_JSON_DEPTH - 2) + "]]"
    assert _raw_get(port, f"/query?topology=wc-1-1700000000&task=2&keys={deep_enough}") == (200, {"values": [1]})
    # Brackets inside strings are not nesting.
    assert _raw_get(port, '/query?topology=wc-1-1700000000&task=2&keys=[["' + "[" * 100 + '"]]')[0] == 200
    refusals = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert [r.getMessage().split(": 400 ")[0] for r in refusals] == ["query from 127.0.0.1"] * 2
    assert not any(r.exc_info for r in caplog.records)


def test_every_handler_error_is_json_with_one_log_line(
    small_server: QueryServer, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.INFO, logger="stream_ops.runtime.query_server")
    port = _port(small_server)
    assert _raw_get(port, "/query?topology=boom&task=2&keys=[[1]]") == (500, {"error": "lookup failed"})
    assert _raw_get(port, "/nowhere")[0] == 404
    assert _raw_get(port, "/query?topology=wc-1-1700000000&task=x&keys=[]")[0] == 400
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"POST /query HTTP/1.0\r\n\r\n")
        reply = b"".join(iter(lambda: sock.recv(65536), b""))
    assert reply.startswith(b"HTTP/1.0 501") and b'{"error": "Unsupported method' in reply
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO and "query from" in r.getMessage()]
    assert [m.split(": ", 1)[1][:3] for m in messages] == ["500", "404", "400", "501"]
    assert "Traceback" not in capfd.readouterr().err


def _health(port: int, timeout_s: float, source: str | None = None) -> int:
    """Status of ``GET /health`` from ``source`` (raises OSError when nothing answers in time)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s, source_address=(source, 0) if source else None)
    try:
        conn.request("GET", "/health")
        reply = conn.getresponse()
        reply.read()
        return reply.status
    finally:
        conn.close()


class Drip:
    """``count`` connections to ``port``, each sending one byte of a never-ending header every ``every_s``.

    Connector threads keep ``count`` connections open (re-opening those the server closes); one
    thread drips into all of them.
    """

    def __init__(self, port: int, count: int, every_s: float, connectors: int = 128) -> None:
        self.port, self.count, self.every_s = port, count, every_s
        self.sockets: set[socket.socket] = set()
        self.connects = 0
        self.closed_by_server = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._connect_loop, daemon=True) for _ in range(connectors)]
        self._threads.append(threading.Thread(target=self._drip_loop, daemon=True))

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def _connect_loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                full = len(self.sockets) >= self.count
            if full:
                self._stop.wait(0.05)
                continue
            try:
                sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Drip: ")
                sock.setblocking(False)
            except OSError:
                continue
            with self._lock:
                self.sockets.add(sock)
                self.connects += 1

    def _drip_loop(self) -> None:
        while not self._stop.wait(self.every_s):
            with self._lock:
                sockets = list(self.sockets)
            for sock in sockets:
                try:
                    if sock.recv(4096) == b"":  # answered and closed by the server
                        raise ConnectionResetError
                except BlockingIOError:
                    pass
                except OSError:
                    self._drop(sock)
                    continue
                try:
                    sock.send(b"a")
                except OSError:
                    self._drop(sock)

    def _drop(self, sock: socket.socket) -> None:
        with self._lock:
            self.sockets.discard(sock)
            self.closed_by_server += 1
        sock.close()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        with self._lock:
            for sock in self.sockets:
                sock.close()


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _limits(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no open-files limit in /proc/<pid>/limits")


@pytest.fixture
def drip_worker(zk_config: ZooKeeperConfig, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A worker process whose Python side runs with at most 256 (soft) / 400 (hard) open files."""
    port = free_port()
    args = {
        # Every setting but the (absent) credentials, which do not survive a JSON dump.
        "zk": {k: v for k, v in zk_config.model_dump(mode="json").items() if k != "auth_digest"},
        "root": str(tmp_path / "cluster"),
        "settings": {"host": "127.0.0.1", "port": port, "trigger_seconds": 0.2, "heartbeat_interval_s": 0.5},
        "soft": 256,
        "hard": 400,
    }
    log = (tmp_path / "worker.log").open("wb")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "drip_worker.py"), json.dumps(args)], stdout=log, stderr=subprocess.STDOUT, env=env
    )
    try:
        yield {
            "proc": proc,
            "port": port,
            "worker_id": f"127.0.0.1:{port}",
            "log": tmp_path / "worker.log",
            "cluster": ClusterConfig(root=tmp_path / "cluster"),
        }
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


def test_slow_drip_clients_do_not_starve_a_worker_under_a_low_fd_limit(
    drip_worker: dict[str, Any], zk_store: ZkStore, tmp_path: Path, wait_until: Any
) -> None:
    proc, port, worker_id = drip_worker["proc"], drip_worker["port"], drip_worker["worker_id"]
    wait_until(
        lambda: worker_id in zk_store.children(ZkPaths.WORKERS) or proc.poll() is not None, 90, "the worker process to register"
    )
    assert proc.poll() is None, drip_worker["log"].read_text()[-3000:]
    session = zk_store.get_json(ZkPaths.worker(worker_id))[1].ephemeralOwner  # type: ignore[index]
    # At start the worker raised its soft limit to the hard one.
    assert _limits(proc.pid) == (400, 400)

    topology = build_wordcount(tmp_path / "input", queues=2)
    submit(zk_store, drip_worker["cluster"], topology, workers=1)
    topic = topology.chains[0].source.topic
    sent = ["how are you", "nice to meet you"] * 5
    produce(topic, ({"sentence": s} for s in sent))
    wait_for_counts(zk_store, "wordcount", "words", expected_word_counts(sent), timeout_s=90)
    baseline = _fds(proc.pid)

    drip = Drip(port, count=1000, every_s=3.0)
    drip.start()
    try:
        # While it lasts: the worker answers (200, or 503 when its connection cap is reached) at
        # once, keeps its session, and keeps counting.
        answered = []
        for round_ in range(5):  # 7.5 s: the drip clients send a byte every 3 s, so each sends two or three
            time.sleep(1.5)
            started = time.monotonic()
            try:
                status = _health(port, timeout_s=3)
            except OSError as e:
                status = f"no answer: {e!r}"  # type: ignore[assignment]
            answered.append((status, round(time.monotonic() - started, 2), _fds(proc.pid)))
            more = [f"drip round {round_} you"]
            produce(topic, ({"sentence": s} for s in more))
            sent += more
        assert proc.poll() is None
        assert all(status in (200, 503) and took < 3 for status, took, _ in answered), (answered, baseline, drip.connects)
        wait_for_counts(zk_store, "wordcount", "words", expected_word_counts(sent), timeout_s=60)
        found = zk_store.get_json(ZkPaths.worker(worker_id))
        assert found is not None and found[1].ephemeralOwner == session, "the worker's ZooKeeper session was lost"
    finally:
        drip.stop()
    wait_until(lambda: _health(port, timeout_s=3) == 200, 15, "the query server to answer 200 again")
    assert "LOST" not in drip_worker["log"].read_text()
