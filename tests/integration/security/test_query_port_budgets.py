"""The query port under attack by clients without the token (issue 30, items 3, 4 and 5).

Against a real :class:`QueryServer` on a real socket, in this process:

* a header flood (99 headers of 65,000 bytes per connection) gets 431 after a few KiB, and the
  server's memory does not grow with it;
* a client dripping into as many connections as it can, from another address (127.0.0.2: all
  of 127/8 is loopback on Linux), does not keep a client with the token from being served;
  nor do clients from many addresses filling every pending slot (the newest takes the place of
  the oldest of the peer holding the most);
* thousands of 404s, 401s and 400s with 64 KiB paths full of escape sequences log a bounded,
  escaped handful of lines, one line per interval counting the rest, and do not hide the
  errors of clients with the token.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest

from stream_ops.runtime.query_server import LOGGED_CHARS, QueryLimits, QueryServer

TOKEN = "query-token-of-the-attack-tests-0123"
TOPOLOGY = "wc-1-1700000000"
ATTACKER = "127.0.0.2"


def _lookup(topology_id: str, task_id: int, keys: list[tuple[Any, ...]]) -> list[Any] | None:
    return [len(key) for key in keys] if topology_id == TOPOLOGY else None


@pytest.fixture
def secured() -> Iterator[QueryServer]:
    """A query server requiring the token, with the default limits."""
    srv = QueryServer("127.0.0.1", 0, _lookup, token=TOKEN)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def _port(srv: QueryServer) -> int:
    return int(srv.server_address[1])


def _exchange(port: int, data: bytes, *, source: str | None = None, timeout_s: float = 5.0) -> bytes:
    """Send ``data`` on a new connection from ``source``; everything the server answered."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s, source_address=(source, 0) if source else None) as sock:
        try:
            sock.sendall(data)
        except OSError:
            pass  # refused before all was sent: its answer is still there to read
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            pass
    return b"".join(chunks)


def _authorized_query(port: int, *, token: str = TOKEN) -> int:
    """Status of a well-formed query carrying ``token``, from 127.0.0.1."""
    reply = _exchange(
        port,
        f"GET /query?topology={TOPOLOGY}&task=2&keys=[[1]] HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode(),
    )
    return _status(reply)


def _status(reply: bytes) -> int:
    """The status of a raw reply; an HTTP/0.9-style answer (a body alone, to a request line
    without a valid version) counts as the 400 it is; 0 for no answer."""
    if reply.startswith(b"HTTP/"):
        return int(reply.split(b" ", 2)[1])
    return 400 if reply.startswith(b'{"error": "Bad request') else 0


class Dripper:
    """Keeps up to ``want`` connections to ``port`` from ``source``, each sending one byte of a
    never-ending header every ``every_s``; re-opens those the server answers or closes."""

    def __init__(self, port: int, source: str, want: int, every_s: float = 0.2) -> None:
        self.port, self.source, self.want, self.every_s = port, source, want, every_s
        self.held: list[socket.socket] = []
        self.most_held = 0
        self.connects = 0
        self.answered = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for sock in self.held:
            sock.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            for _ in range(self.want - len(self.held)):
                try:
                    sock = socket.create_connection(("127.0.0.1", self.port), timeout=2, source_address=(self.source, 0))
                    sock.sendall(b"GET /query?topology=t&task=1&keys=[[1]] HTTP/1.1\r\nHost: x\r\nX-Drip: ")
                    sock.setblocking(False)
                except OSError:
                    continue
                self.connects += 1
                self.held.append(sock)
            self._stop.wait(self.every_s)
            for sock in list(self.held):
                try:
                    sock.recv(4096)  # an answer (503, 408) or the end: the server let it go
                    self._drop(sock)
                    continue
                except BlockingIOError:
                    pass
                except OSError:
                    self._drop(sock)
                    continue
                try:
                    sock.send(b"a")
                except OSError:
                    self._drop(sock)
            self.most_held = max(self.most_held, len(self.held))

    def _drop(self, sock: socket.socket) -> None:
        self.held.remove(sock)
        self.answered += 1
        sock.close()


# --- item 4: headers cost memory before the token is checked ------------------------------------


def test_a_header_flood_gets_431_after_a_few_kib_and_costs_no_memory(secured: QueryServer) -> None:
    port = _port(secured)
    header = b"X-Flood: " + b"f" * 65_000 + b"\r\n"
    # 99 headers in all, as many as the base class would read before anything checks the token.
    flood = b"GET /query?topology=t&task=1&keys=[[1]] HTTP/1.1\r\nHost: x\r\n" + header * 98 + b"\r\n"
    sources = [f"127.0.0.{n}" for n in range(2, 6)]
    replies: list[tuple[bytes, float]] = []
    lock = threading.Lock()

    def flooder(source: str) -> None:
        for _ in range(3):
            started = time.monotonic()
            reply = _exchange(port, flood, source=source)
            with lock:
                replies.append((reply, time.monotonic() - started))

    tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        threads = [threading.Thread(target=flooder, args=(source,)) for source in sources for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # 16 connections at once, 6.4 MB of headers each: the server kept a few KiB of each.
    assert peak - baseline < 4 * 2**20, f"the flood grew traced memory by {(peak - baseline) / 2**20:.1f} MiB"
    assert len(replies) == 48
    for reply, took in replies:
        assert reply.startswith(b"HTTP/1.0 431"), reply[:200]
        assert b"at most 8192 bytes" in reply and took < 2.0
    assert _authorized_query(port) == 200


def test_too_many_header_lines_get_431() -> None:
    srv = QueryServer("127.0.0.1", 0, _lookup, token=TOKEN, limits=QueryLimits(max_header_lines=8))
    srv.start()
    try:
        many = b"GET /health HTTP/1.1\r\n" + b"".join(b"X-H%d: 1\r\n" % i for i in range(9)) + b"\r\n"
        reply = _exchange(_port(srv), many)
        assert reply.startswith(b"HTTP/1.0 431") and b"at most 8 lines" in reply
        enough = b"GET /health HTTP/1.1\r\n" + b"".join(b"X-H%d: 1\r\n" % i for i in range(8)) + b"\r\n"
        assert _exchange(_port(srv), enough).startswith(b"HTTP/1.0 200")
    finally:
        srv.stop()


# --- item 3: anyone can take every query slot ---------------------------------------------------


def test_a_dripping_client_elsewhere_does_not_starve_a_client_with_the_token(secured: QueryServer, wait_until: Any) -> None:
    port = _port(secured)
    dripper = Dripper(port, ATTACKER, want=100)
    dripper.start()
    try:
        wait_until(lambda: dripper.most_held >= 8, 10, "the dripper to hold its share of the pending slots")
        statuses = []
        ends = time.monotonic() + 2.5  # more than the auth deadline: the dripper re-opened its connections meanwhile
        while time.monotonic() < ends:
            statuses.append(_authorized_query(port))
            time.sleep(0.05)
        assert statuses and set(statuses) == {200}, statuses
        assert dripper.answered > 0, "the dripper was never refused: it did not try to take more than its share"
    finally:
        dripper.stop()


def test_clients_of_many_addresses_filling_every_pending_slot_do_not_starve_it(wait_until: Any) -> None:
    limits = QueryLimits(max_pending=8, max_pending_per_peer=2)
    srv = QueryServer("127.0.0.1", 0, _lookup, token=TOKEN, limits=limits)
    srv.start()
    drippers = [Dripper(_port(srv), f"127.0.0.{n}", want=4) for n in range(2, 10)]
    try:
        for dripper in drippers:
            dripper.start()
        wait_until(lambda: srv.pending_connections == 8, 10, "the drippers to fill every pending slot")
        statuses = [_authorized_query(_port(srv)) for _ in range(20)]
        assert set(statuses) == {200}, statuses
        assert srv.admission.evictions > 0
    finally:
        for dripper in drippers:
            dripper.stop()
        srv.stop()


# --- item 5: anyone can fill the disk through the log ---------------------------------------------


class _Lines(logging.Handler):
    """Counts what reaches the log, without keeping a flood's worth of text."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines = 0
        self.bytes = 0
        self.unprintable: list[str] = []
        self.messages: list[str] = []
        self._lock2 = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        with self._lock2:
            self.lines += 1
            self.bytes += len(text.encode("utf-8"))
            if not text.isprintable():
                self.unprintable.append(text[:300])
            if len(self.messages) < 1000:
                self.messages.append(text[:3000])


@pytest.fixture
def log_lines() -> Iterator[_Lines]:
    handler = _Lines()
    query_logger = logging.getLogger("stream_ops.runtime.query_server")
    level = query_logger.level
    query_logger.addHandler(handler)
    query_logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        query_logger.removeHandler(handler)
        query_logger.setLevel(level)


def test_thousands_of_failed_requests_log_a_bounded_escaped_handful(log_lines: _Lines, wait_until: Any) -> None:
    limits = QueryLimits(log_lines=10, log_interval_s=1.0)
    srv = QueryServer("127.0.0.1", 0, _lookup, token=TOKEN, limits=limits)
    srv.start()
    port = _port(srv)
    nasty = "\x1b[2J\x1b[31mowned\x07\x9b31m\x7f"  # no ';', '?' or '#': the whole path is the path
    path = ("/" + nasty * 4000)[:64_000].encode("latin-1")
    requests = [
        b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n",  # 404 unknown path
        b"GET /query?" + path + b" HTTP/1.1\r\nHost: x\r\n\r\n",  # 401 no token
        b"GET " + path + b" HTTP/1.1 " + nasty.encode("latin-1") + b"\r\n\r\n",  # 400 bad request syntax
    ]
    answered: list[int] = []

    def attacker(source: str) -> None:
        for i in range(700):
            reply = _exchange(port, requests[i % 3], source=source)
            answered.append(_status(reply))

    started = time.monotonic()
    try:
        threads = [threading.Thread(target=attacker, args=(f"127.0.0.{n}",)) for n in range(2, 5)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        took = time.monotonic() - started
        intervals = math.ceil(took / limits.log_interval_s) + 1
        assert log_lines.lines <= (limits.log_lines + 1) * intervals, (log_lines.lines, took)
        assert sorted(set(answered)) == [400, 401, 404] and len(answered) == 2100
        assert log_lines.bytes <= log_lines.lines * (3 * LOGGED_CHARS + 200), "a line longer than its bound"
        assert not log_lines.unprintable, log_lines.unprintable[:3]
        assert any("\\x1b[2J" in m for m in log_lines.messages), "the flood's lines were not logged escaped"
        wait_until(lambda: any("suppressed" in m for m in log_lines.messages), 5, "a line counting the suppressed ones")
        # The attack used up the budget of clients without the token, not theirs.
        bad = f"GET /query?topology={TOPOLOGY}&task=two&keys=[] HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
        assert _exchange(port, bad.encode()).startswith(b"HTTP/1.0 400")
        assert any(": 400 bad query" in m for m in log_lines.messages[-5:]), log_lines.messages[-5:]
    finally:
        srv.stop()
