"""The state-query endpoint: bound to the configured interface, strict about what it accepts.

Each worker serves ``GET /query`` on its slot port. It must listen only on
``WorkerSettings.bind_host`` and answer oversized requests with 414/431, malformed ones with
400, other methods with 501, without a traceback and without stopping to serve others.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

from stream_ops.config import ClusterConfig, ZooKeeperConfig
from stream_ops.coordination.store import ZkStore
from stream_ops.local_stack import free_port
from stream_ops.nimbus import live_workers
from stream_ops.runtime.query_server import MAX_KEYS, MAX_REQUEST_BYTES, QueryServer
from stream_ops.runtime.worker import Worker, WorkerSettings

OTHER_LOOPBACK = "127.0.0.2"  # Linux routes all of 127/8 to lo: a second interface address


def _lookup(topology_id: str, task_id: int, keys: list[tuple[Any, ...]]) -> list[Any] | None:
    if topology_id == "boom":
        raise RuntimeError("lookup failed")
    if topology_id != "wc-1-1700000000" or task_id != 2:
        return None
    return [len(key) for key in keys]


@pytest.fixture
def server() -> Iterator[QueryServer]:
    srv = QueryServer("127.0.0.1", 0, _lookup)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def _get(srv: QueryServer, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    host, port = srv.server_address[:2]
    conn = http.client.HTTPConnection(str(host), int(port), timeout=5)
    try:
        conn.request("GET", path, headers=headers or {})
        reply = conn.getresponse()
        body = reply.read()
    finally:
        conn.close()
    try:
        return reply.status, json.loads(body) if body else {}
    except ValueError:
        return reply.status, {"raw": body.decode("latin-1")}


def _raw(srv: QueryServer, data: bytes) -> bytes:
    host, port = srv.server_address[:2]
    with socket.create_connection((str(host), int(port)), timeout=5) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _query(topology: str = "wc-1-1700000000", task: str = "2", keys: str = '[["the"],["cow"]]') -> str:
    return "/query?" + urllib.parse.urlencode({"topology": topology, "task": task, "keys": keys})


def _refused(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def test_a_well_formed_query_is_answered(server: QueryServer) -> None:
    assert _get(server, "/health") == (200, {"status": "ok"})
    assert _get(server, _query()) == (200, {"values": [1, 1]})
    status, body = _get(server, _query(task="3"))
    assert status == 404 and "does not run on this worker" in body["error"]


def test_listens_only_on_the_configured_interface() -> None:
    srv = QueryServer(OTHER_LOOPBACK, 0, _lookup)
    srv.start()
    try:
        port = int(srv.server_address[1])
        assert srv.server_address[0] == OTHER_LOOPBACK
        assert _get(srv, "/health")[0] == 200
        assert _refused("127.0.0.1", port), "the query server answered on an interface it was not bound to"
    finally:
        srv.stop()


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/query", "no parameters"),
        ("/query?topology=wc-1-1700000000&task=2", "no keys"),
        (_query(task="two"), "task not a number"),
        (_query(keys="not json"), "keys not JSON"),
        (_query(keys='{"the": 1}'), "keys not a list"),
        (_query(keys='["the", "cow"]'), "a key that is not a list"),
        (_query(keys="[[" + "1" * 10 + "]"), "truncated JSON"),
    ],
)
def test_malformed_queries_get_400(server: QueryServer, path: str, why: str) -> None:
    status, body = _get(server, path)
    assert status == 400, why
    assert "bad query" in body["error"] and "Traceback" not in body["error"]


def test_too_many_keys_get_400(server: QueryServer) -> None:
    # Compact and unescaped, so that it is refused for the count, not the size.
    path = "/query?topology=wc-1-1700000000&task=2&keys=[" + ",".join(["[0]"] * (MAX_KEYS + 1)) + "]"
    assert len(path) < MAX_REQUEST_BYTES
    status, body = _get(server, path)
    assert status == 400 and str(MAX_KEYS) in body["error"]
    assert _get(server, "/query?topology=wc-1-1700000000&task=2&keys=[" + ",".join(["[0]"] * MAX_KEYS) + "]")[0] == 200


def test_oversized_requests_are_refused(server: QueryServer) -> None:
    keys = json.dumps([["x" * 100] for _ in range(MAX_REQUEST_BYTES // 100)])
    assert _get(server, _query(keys=keys))[0] == 414
    huge_line = b"GET /query?keys=" + b"a" * (MAX_REQUEST_BYTES + 10) + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    assert _raw(server, huge_line).startswith(b"HTTP/1.0 414")
    huge_header = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 70_000 + b"\r\n\r\n"
    assert _raw(server, huge_header).startswith(b"HTTP/1.0 431")
    many_headers = b"GET /health HTTP/1.1\r\n" + b"".join(b"X-H%d: 1\r\n" % i for i in range(150)) + b"\r\n"
    assert _raw(server, many_headers).startswith(b"HTTP/1.0 431")
    # A claimed body is never read: the reply comes at once, the server does not wait for it.
    started = time.monotonic()
    status, _ = _get(server, "/health", headers={"Content-Length": str(10**12)})
    assert status == 200 and time.monotonic() - started < 2


def test_garbage_other_methods_and_failing_lookups(server: QueryServer) -> None:
    # A TLS hello, say: no request line at all, so the answer is an HTTP/0.9-style error page.
    assert b"Error code: 400" in _raw(server, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n")
    assert b"Error code: 400" in _raw(server, b"GET /health HTTP/1.1 extra\r\n\r\n")
    assert b"Error code: 505" in _raw(server, b"GET /health HTTP/9.9\r\n\r\n")
    assert _raw(server, b"POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}").startswith(b"HTTP/1.0 501")
    assert _raw(server, b"DELETE /query HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.0 501")
    assert _get(server, "/../../etc/passwd")[0] == 404
    status, body = _get(server, _query(topology="boom"))
    assert status == 500 and body == {"error": "lookup failed"}
    # None of that stopped the server.
    assert _get(server, _query())[0] == 200


def test_an_idle_connection_does_not_block_other_clients(server: QueryServer) -> None:
    host, port = server.server_address[:2]
    idle = socket.create_connection((str(host), int(port)), timeout=5)
    try:
        done = threading.Event()
        result: list[int] = []

        def ask() -> None:
            result.append(_get(server, "/health")[0])
            done.set()

        threading.Thread(target=ask, daemon=True).start()
        assert done.wait(5) and result == [200]
    finally:
        idle.close()


def test_worker_binds_its_query_server_to_bind_host(zk_config: ZooKeeperConfig, tmp_path, spark, wait_until) -> None:
    settings = WorkerSettings(host="127.0.0.1", port=free_port(OTHER_LOOPBACK), bind_host=OTHER_LOOPBACK,
                              trigger_seconds=0.2, heartbeat_interval_s=0.5)
    worker = Worker(zk_config, ClusterConfig(root=tmp_path / "cluster"), settings, spark_factory=lambda: spark)
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    thread.start()
    try:
        with ZkStore.connect(zk_config) as store:
            wait_until(lambda: settings.worker_id in live_workers(store), 60, "the worker to register")
        conn = http.client.HTTPConnection(OTHER_LOOPBACK, settings.port, timeout=5)
        conn.request("GET", "/health")
        assert conn.getresponse().status == 200
        conn.close()
        assert _refused("127.0.0.1", settings.port)
    finally:
        stop.set()
        thread.join(60)
