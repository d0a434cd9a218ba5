"""The state-query endpoint: bound to the configured interface, strict about what it accepts.

Each worker serves ``GET /query`` on its slot port. It must listen only on
``WorkerSettings.bind_host`` and answer oversized requests with 414/431, malformed ones with
400, other methods with 501, without a traceback and without stopping to serve others.

With a query token (explicit, or derived from the cluster's ZooKeeper digest) ``/query``
answers 401 and no values to a request without ``Authorization: Bearer <token>``; with a
certificate it serves only TLS, and clients verify it against the cluster's CA.
"""

from __future__ import annotations

import hmac
import http.client
import json
import logging
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from stream_ops import Count, FileTopic, Max, OpaqueMapState, Topology
from stream_ops.cli import main
from stream_ops.config import ClusterConfig, QueryConfig, ZooKeeperConfig, query_token
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import QueryAuthError, QueryError, QueryTLSError
from stream_ops.examples.wordcount import split
from stream_ops.local_stack import wait_for_counts
from stream_ops.nimbus import live_workers, submit
from stream_ops.operators.trident_state import MapGet
from stream_ops.ports import free_port
from stream_ops.runtime import query_client
from stream_ops.runtime.query_client import QueryAccess, TaskAsk, ask_all, client_tls_context, query_state
from stream_ops.runtime.query_server import MAX_KEYS, MAX_REQUEST_BYTES, QueryServer, server_tls_context
from stream_ops.runtime.worker import Worker, WorkerSettings
from stream_ops.topics.producer import produce

OTHER_LOOPBACK = "127.0.0.2"  # Linux routes all of 127/8 to lo: a second interface address
TOKEN = "query-token-of-the-tests-0123456789"


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
    """What the server answers to ``data`` sent as is (it may answer and close before reading it all)."""
    host, port = srv.server_address[:2]
    with socket.create_connection((str(host), int(port)), timeout=5) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # refused before all was read (the connection reset): the answer is still there to read
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            pass
    return b"".join(chunks)


def _json_error(reply: bytes) -> str:
    """The ``error`` of a raw reply's JSON body (with or without a status line and headers)."""
    body = reply.partition(b"\r\n\r\n")[2] if reply.startswith(b"HTTP/") else reply
    return str(json.loads(body)["error"])


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
    # A TLS hello, say: no request line at all, so the answer is an HTTP/0.9-style body alone (JSON).
    assert "Bad request" in _json_error(_raw(server, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n"))
    assert "Bad request syntax" in _json_error(_raw(server, b"GET /health HTTP/1.1 extra\r\n\r\n"))
    assert "Invalid HTTP version" in _json_error(_raw(server, b"GET /health HTTP/9.9\r\n\r\n"))
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


def test_worker_binds_its_query_server_to_bind_host(zk_config: ZooKeeperConfig, tmp_path, spark, wait_until, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="stream_ops.runtime.worker")
    settings = WorkerSettings(
        host="127.0.0.1", port=free_port(OTHER_LOOPBACK), bind_host=OTHER_LOOPBACK, trigger_seconds=0.2, heartbeat_interval_s=0.5
    )
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
        # No ZooKeeper credentials, no token: said once, at start.
        assert caplog.text.count("state queries are unauthenticated") == 1
    finally:
        stop.set()
        thread.join(60)


# --- authentication --------------------------------------------------------------------------


@pytest.fixture
def secured() -> Iterator[QueryServer]:
    srv = QueryServer("127.0.0.1", 0, _lookup, token=TOKEN)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def test_a_query_asks_the_workers_of_its_tasks_at_once() -> None:
    def slow(topology_id: str, task_id: int, keys: list[tuple[Any, ...]]) -> list[Any] | None:
        time.sleep(0.5)
        return [f"task {task_id}: {key[0]}" for key in keys] if task_id in (2, 3) else None

    servers = [QueryServer("127.0.0.1", 0, slow) for _ in range(2)]
    for srv in servers:
        srv.start()
    try:
        workers = [_worker_of(srv) for srv in servers]
        asks = [TaskAsk(workers[0], 2, [["the"], ["cow"]]), TaskAsk(workers[1], 3, [["moo"]])]
        started = time.monotonic()
        found = ask_all("wc-1-1700000000", asks, QueryAccess(), timeout_s=5.0)
        assert time.monotonic() - started < 0.9, "two workers of 0.5 s each, asked at once"
        assert found == [["task 2: the", "task 2: cow"], ["task 3: moo"]]
        # Task 4 goes in worker 1's request with task 3; the 404 names it.
        with pytest.raises(QueryError, match=r"refused the query for tasks 3, 4: 404 .*/4 does not run on this worker"):
            ask_all("wc-1-1700000000", [*asks, TaskAsk(workers[1], 4, [["no"]])], QueryAccess(), timeout_s=5.0)
    finally:
        for srv in servers:
            srv.stop()


def test_the_tasks_of_one_worker_are_asked_in_one_request() -> None:
    asked: list[int] = []

    def lookup(topology_id: str, task_id: int, keys: list[tuple[Any, ...]]) -> list[Any] | None:
        asked.append(task_id)
        return [f"task {task_id}: {key[0]}" for key in keys]

    srv = QueryServer("127.0.0.1", 0, lookup)
    srv.start()
    try:
        worker = _worker_of(srv)
        asks = [TaskAsk(worker, 3, [["moo"]]), TaskAsk(worker, 2, [["the"], ["cow"]]), TaskAsk(worker, 5, [])]
        assert [request.indexes for request in query_client._requests("wc-1-1700000000", asks)] == [[0, 1, 2]]
        found = ask_all("wc-1-1700000000", asks, QueryAccess(), timeout_s=5.0)
        assert found == [["task 3: moo"], ["task 2: the", "task 2: cow"], []]
        assert asked == [3, 2, 5]
        # Past the server's request size, a worker's tasks take more requests, each within it.
        many = [[f"word-{i:05d}"] for i in range(1500)]
        big = [TaskAsk(worker, task, many) for task in range(4)]
        requests = query_client._requests("wc-1-1700000000", big)
        assert len(requests) > 1 and sorted(i for r in requests for i in r.indexes) == [0, 1, 2, 3]
        found = ask_all("wc-1-1700000000", big, QueryAccess(), timeout_s=5.0)
        assert found == [[f"task {task}: {key[0]}" for key in many] for task in range(4)]
    finally:
        srv.stop()


def test_task_and_keys_parameters_come_in_pairs(server: QueryServer) -> None:
    status, body = _get(server, "/query?topology=t&task=2&keys=%5B%5D&task=3")
    assert status == 400 and "give them in pairs" in body["error"]


def _ask_one(
    worker: str, topology_id: str, task_id: int, keys: list[list[Any]], access: QueryAccess, timeout_s: float
) -> list[Any]:
    """The values of one task's keys, asked of ``worker``."""
    return ask_all(topology_id, [TaskAsk(worker, task_id, keys)], access, timeout_s)[0]


def _worker_of(srv: QueryServer) -> str:
    host, port = srv.server_address[:2]
    return f"{host}:{port}"


@pytest.mark.parametrize(
    ("authorization", "why"),
    [
        (None, "no header"),
        ("Bearer query-token-of-the-tests-9876543210", "a wrong token"),
        (f"Bearer {TOKEN[:-1]}", "a prefix of the token"),
        (f"Bearer {TOKEN}x", "the token and more"),
        (f"Basic {TOKEN}", "another scheme"),
        (TOKEN, "no scheme"),
    ],
)
def test_a_query_without_the_right_token_gets_401_and_no_values(
    secured: QueryServer, authorization: str | None, why: str
) -> None:
    headers = {"Authorization": authorization} if authorization is not None else {}
    status, body = _get(secured, _query(), headers)
    assert status == 401, why
    assert "values" not in body and "query token" in body["error"] and "--query-token-file" in body["error"]
    # Refused before it is parsed: a malformed query learns nothing either.
    assert _get(secured, "/query", headers)[0] == 401


def test_the_right_token_gets_values_and_health_stays_open(secured: QueryServer) -> None:
    assert _get(secured, _query(), {"Authorization": f"Bearer {TOKEN}"}) == (200, {"values": [1, 1]})
    assert _get(secured, _query(), {"Authorization": f"bearer {TOKEN}"})[0] == 200
    assert _get(secured, "/health") == (200, {"status": "ok"})


def test_the_token_is_compared_in_constant_time(secured: QueryServer, monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def recording(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", recording)
    assert _get(secured, _query(), {"Authorization": "Bearer nope"})[0] == 401
    assert _get(secured, _query(), {"Authorization": f"Bearer {TOKEN}"})[0] == 200
    assert compared == [(b"nope", TOKEN.encode()), (TOKEN.encode(), TOKEN.encode())]


def test_the_client_sends_the_token_and_explains_a_refusal(secured: QueryServer) -> None:
    worker = _worker_of(secured)
    assert _ask_one(worker, "wc-1-1700000000", 2, [["the"], ["cow"]], QueryAccess(token=TOKEN), 5) == [1, 1]
    with pytest.raises(QueryAuthError, match="no query token was sent; pass --query-token-file or --zk-auth"):
        _ask_one(worker, "wc-1-1700000000", 2, [["the"]], QueryAccess(), 5)
    with pytest.raises(QueryAuthError, match="not the one it serves with"):
        _ask_one(worker, "wc-1-1700000000", 2, [["the"]], QueryAccess(token="query-token-of-the-tests-9876543210"), 5)


# --- TLS -------------------------------------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _issue(pki: Path, name: str, san: str) -> tuple[Path, Path]:
    """A server certificate for ``san`` signed by the test CA in ``pki``: (cert, key)."""
    (pki / f"{name}.ext").write_text(
        f"subjectAltName={san}\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n"
    )
    _openssl(
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        f"/CN={name}",
        cwd=pki,
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-out",
        f"{name}.pem",
        "-extfile",
        f"{name}.ext",
        cwd=pki,
    )
    return pki / f"{name}.pem", pki / f"{name}.key"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A test CA, a worker certificate naming 127.0.0.1 and one naming another host."""
    if shutil.which("openssl") is None:
        if os.environ.get("CI"):
            raise AssertionError("CI installs openssl (tests/run.sh): the TLS tests must run there")
        pytest.skip("the openssl binary is needed to make the test certificates")
    root = tmp_path_factory.mktemp("pki")
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=stream-ops test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        cwd=root,
    )
    cert, key = _issue(root, "worker", "IP:127.0.0.1,DNS:localhost")
    other_cert, other_key = _issue(root, "elsewhere", "DNS:worker9.example.internal")
    return {"ca": root / "ca.pem", "cert": cert, "key": key, "other_cert": other_cert, "other_key": other_key}


@pytest.fixture
def tls_server(pki: dict[str, Path]) -> Iterator[QueryServer]:
    srv = QueryServer("127.0.0.1", 0, _lookup, token=TOKEN, tls=server_tls_context(pki["cert"], pki["key"]))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def test_a_client_with_the_ca_gets_values_over_https(tls_server: QueryServer, pki: dict[str, Path]) -> None:
    access = QueryAccess.resolve(ZooKeeperConfig(), QueryConfig(token=TOKEN, tls_ca=pki["ca"]))
    assert access.scheme == "https"
    assert _ask_one(_worker_of(tls_server), "wc-1-1700000000", 2, [["the"], ["cow"]], access, 5) == [1, 1]
    # TLS does not replace the token.
    with pytest.raises(QueryAuthError):
        _ask_one(_worker_of(tls_server), "wc-1-1700000000", 2, [["the"]], QueryAccess(tls=access.tls), 5)


def test_a_plain_http_client_gets_nothing_from_a_tls_server(tls_server: QueryServer) -> None:
    with pytest.raises(QueryError, match="pass --query-tls-ca") as caught:
        _ask_one(_worker_of(tls_server), "wc-1-1700000000", 2, [["the"]], QueryAccess(token=TOKEN), 5)
    assert not isinstance(caught.value, QueryAuthError)
    try:
        reply = _raw(tls_server, f"GET {_query()} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode())
    except OSError:
        reply = b""  # reset or not connected: the server drops a connection that does not start with a TLS hello
    assert b"values" not in reply and not reply.startswith(b"HTTP/")
    with pytest.raises((OSError, http.client.HTTPException)):
        _get(tls_server, "/health")


def test_the_worker_certificate_must_name_its_host(pki: dict[str, Path]) -> None:
    srv = QueryServer("127.0.0.1", 0, _lookup, token=TOKEN, tls=server_tls_context(pki["other_cert"], pki["other_key"]))
    srv.start()
    try:
        access = QueryAccess(token=TOKEN, tls=client_tls_context(pki["ca"]))
        with pytest.raises(QueryTLSError, match="must name host 127.0.0.1"):
            _ask_one(_worker_of(srv), "wc-1-1700000000", 2, [["the"]], access, 5)
    finally:
        srv.stop()


def test_a_certificate_from_another_ca_is_refused(tls_server: QueryServer, tmp_path: Path) -> None:
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "rogue.key",
        "-out",
        "rogue.pem",
        "-days",
        "2",
        "-subj",
        "/CN=rogue CA",
        cwd=tmp_path,
    )
    access = QueryAccess(token=TOKEN, tls=client_tls_context(tmp_path / "rogue.pem"))
    with pytest.raises(QueryTLSError, match="pass --query-tls-ca with the CA that signed"):
        _ask_one(_worker_of(tls_server), "wc-1-1700000000", 2, [["the"]], access, 5)


def test_an_https_client_of_a_plain_server_is_told_why(secured: QueryServer, pki: dict[str, Path]) -> None:
    access = QueryAccess(token=TOKEN, tls=client_tls_context(pki["ca"]))
    with pytest.raises(QueryTLSError, match="does it serve TLS"):
        _ask_one(_worker_of(secured), "wc-1-1700000000", 2, [["the"]], access, 5)


def test_a_stalled_tls_handshake_does_not_block_other_clients(tls_server: QueryServer, pki: dict[str, Path]) -> None:
    host, port = tls_server.server_address[:2]
    idle = socket.create_connection((str(host), int(port)), timeout=5)  # connects, never says hello
    try:
        access = QueryAccess(token=TOKEN, tls=client_tls_context(pki["ca"]))
        started = time.monotonic()
        assert _ask_one(_worker_of(tls_server), "wc-1-1700000000", 2, [["the"]], access, 5) == [1]
        assert time.monotonic() - started < 3
    finally:
        idle.close()


def test_unreadable_tls_files_are_explained(tmp_path: Path, pki: dict[str, Path]) -> None:
    with pytest.raises(QueryTLSError, match="--query-tls-cert and --query-tls-key"):
        server_tls_context(tmp_path / "missing.pem", tmp_path / "missing.key")
    with pytest.raises(QueryTLSError, match="--query-tls-cert and --query-tls-key"):
        server_tls_context(pki["cert"], pki["other_key"])  # not its key
    with pytest.raises(QueryTLSError, match="--query-tls-ca"):
        client_tls_context(tmp_path / "missing-ca.pem")


# --- workers ---------------------------------------------------------------------------------


def _run_worker(
    zk: ZooKeeperConfig, settings: WorkerSettings, root: Path, spark: Any
) -> tuple[threading.Event, threading.Thread]:
    worker = Worker(zk, ClusterConfig(root=root), settings, spark_factory=lambda: spark)
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    thread.start()
    return stop, thread


def test_a_worker_with_zookeeper_credentials_requires_the_derived_token_over_tls(
    zk_config: ZooKeeperConfig,
    tmp_path: Path,
    spark: Any,
    wait_until: Any,
    pki: dict[str, Path],
    caplog: pytest.LogCaptureFixture,
) -> None:
    zk = zk_config.model_copy(update={"auth_digest": "stream-ops:worker-test-password"})
    query = QueryConfig(tls_cert=pki["cert"], tls_key=pki["key"], tls_ca=pki["ca"])
    settings = WorkerSettings(host="127.0.0.1", port=free_port(), trigger_seconds=0.2, heartbeat_interval_s=0.5, query=query)
    caplog.set_level(logging.WARNING, logger="stream_ops.runtime.worker")
    stop, thread = _run_worker(zk, settings, tmp_path / "cluster", spark)
    try:
        with ZkStore.connect(zk) as store:
            wait_until(lambda: settings.worker_id in live_workers(store), 60, "the worker to register")
            # Its record says it serves TLS: a client without the CA sends it nothing (query_client).
            assert live_workers(store)[settings.worker_id].tls is True
        derived = QueryAccess.resolve(zk, QueryConfig(tls_ca=pki["ca"]))
        assert derived.token == query_token(QueryConfig(), zk)
        # Authenticated: the lookup runs, and this task simply does not run here.
        with pytest.raises(QueryError, match="404 .*does not run on this worker"):
            _ask_one(settings.worker_id, "wc-1-1700000000", 2, [["the"]], derived, 5)
        with pytest.raises(QueryAuthError):
            _ask_one(settings.worker_id, "wc-1-1700000000", 2, [["the"]], QueryAccess(tls=derived.tls), 5)
        with pytest.raises(QueryError, match="pass --query-tls-ca"):
            _ask_one(settings.worker_id, "wc-1-1700000000", 2, [["the"]], QueryAccess(token=derived.token), 5)
        assert "unauthenticated" not in caplog.text
    finally:
        stop.set()
        thread.join(60)


def _ask_topology(root: Path) -> Topology:
    """Word counts, and questions answered from them by a state_query on the map state."""
    topology = Topology("wc-ask")
    counts = (
        topology.source("sentences", FileTopic(root / "sentences", 2), schema={"sentence": "string"})
        .each(split, out="word", fields=["sentence"])
        .group_by("word")
        .persistent_aggregate(Count(), out="count", state=OpaqueMapState, name="counts")
    )
    answers = topology.source("questions", FileTopic(root / "questions", 1), schema={"word": "string"}).state_query(
        counts, ["word"], MapGet(), out={"count": "long"}
    )
    kept = answers.group_by("word").persistent_aggregate(Max("count"), out="count", state=OpaqueMapState, name="answers")
    topology.query("words", counts)
    topology.query("answers", kept)
    return topology


def test_state_query_between_workers_and_clients_carry_the_derived_token(
    zk_config: ZooKeeperConfig, tmp_path: Path, spark: Any, wait_until: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    zk = zk_config.model_copy(update={"auth_digest": "stream-ops:state-query-password", "open_reads": True})
    settings = WorkerSettings(host="127.0.0.1", port=free_port(), trigger_seconds=0.2, heartbeat_interval_s=0.5)
    cluster_root = tmp_path / "cluster"
    stop, thread = _run_worker(zk, settings, cluster_root, spark)
    try:
        with ZkStore.connect(zk) as store:
            wait_until(lambda: settings.worker_id in live_workers(store), 60, "the worker to register")
            topology = _ask_topology(tmp_path / "in")
            submit(store, ClusterConfig(root=cluster_root), topology, workers=1)
            sources = {c.source.name: c.source.topic for c in topology.chains}
            text = ["how are you", "how do you do"]
            produce(sources["sentences"], [{"sentence": s} for s in text])
            truth = Counter(w for s in text for w in s.split())
            wait_for_counts(store, topology.name, "words", dict(truth), timeout_s=60)

            def answered() -> bool:
                # The state_query task asks the worker's query server, with the worker's token.
                produce(sources["questions"], [{"word": w} for w in ("how", "you")])
                time.sleep(1.0)
                found = query_state(store, topology.name, "answers", [["how"], ["you"]])
                return found == {"how": truth["how"], "you": truth["you"]}

            wait_until(answered, 60, "state_query answers equal the counts")
        # open_reads: anyone may route a query, but without the token the worker answers nothing.
        with ZkStore.connect(zk.model_copy(update={"auth_digest": None, "open_reads": False})) as anonymous:
            with pytest.raises(QueryAuthError, match="pass --query-token-file or --zk-auth"):
                query_state(anonymous, topology.name, "words", [["how"]])
            explicit = QueryConfig(token=query_token(QueryConfig(), zk))
            assert query_state(anonymous, topology.name, "words", [["how"]], query_config=explicit) == {"how": 2}

        # The CLI: the same, with the token derived from --zk-auth or read from --query-token-file.
        for name in (
            "STREAM_OPS_ZK_AUTH",
            "STREAM_OPS_ZK_OPEN_READS",
            "STREAM_OPS_QUERY_TOKEN",
            "STREAM_OPS_QUERY_TOKEN_FILE",
            "STREAM_OPS_QUERY_TLS_CA",
        ):
            monkeypatch.setenv(name, "")  # empty = unset for click; the CLI exports them, undone after the test
        token_file = tmp_path / "query-token"
        token_file.write_text(f"{explicit.token.get_secret_value()}\n")  # type: ignore[union-attr]

        def cli(*args: str) -> Any:
            base = ["--zookeeper", zk.hosts, "--chroot", zk.chroot, "--home", str(cluster_root)]
            return CliRunner().invoke(main, [*base, *args, "query", topology.name, "words", "how"])

        refused = cli()
        assert refused.exit_code == 1 and "no query token was sent; pass --query-token-file" in refused.output
        assert json.loads(cli("--zk-auth", zk.auth_credentials() or "", "--zk-open-reads").output) == {"how": 2}
        assert json.loads(cli("--query-token-file", str(token_file)).output) == {"how": 2}
    finally:
        stop.set()
        thread.join(60)
