"""The state-query endpoint each worker serves on its slot port (HTTP, JSON).

``GET /query?topology=<id>&task=<n>&keys=<json list of key lists>`` returns
``{"values": [...]}`` in key order. ``task`` and ``keys`` may repeat, in pairs, to ask several
tasks of this worker at once (one round trip): the values are then those of each pair's keys,
pair after pair. Requests are bounded in size; malformed ones get 400 and a task that does not
run here 404 (the first such task of the request), so a client can re-route after a move.

With a token (:func:`stream_ops.config.query_token`), ``/query`` requires
``Authorization: Bearer <token>`` and answers 401 without it; ``/health`` stays open. With a TLS
context (:func:`server_tls_context`) every connection is TLS, its handshake made on the
connection's own thread under the same deadline as the request line and headers.

Limits (:class:`QueryLimits`), so that no client without the token can starve the worker of
threads, memory, file descriptors or disk (its ZooKeeper session and its tasks need them all),
nor keep the clients that have the token (other workers' ``state_query`` lookups among them)
from being served:

* A new connection first takes a *pending* slot: at most ``max_pending`` at once, at most
  ``max_pending_per_peer`` of them from one peer address (an IPv6 peer: its /64). When every
  pending slot is taken, the new connection takes the place of the oldest pending connection of
  the peer that holds the most, if its own peer holds fewer (that one is shut down); otherwise,
  as over the per-peer cap, it is answered ``503`` at once by the accepting thread and closed (a
  TLS one is closed without an answer: its handshake would take a thread).
* A pending connection has ``auth_deadline_s`` in all to finish its TLS handshake and send its
  request line and headers, however slowly it drips them; then it gets ``408``. The request
  line is at most ``MAX_REQUEST_BYTES``; the headers at most ``max_header_lines`` lines and
  ``max_header_bytes`` bytes in all, read by this module (never a longer line buffered), else
  ``431``. The token is checked then, before anything else is done.
* A request with the token (or any, on a server without one) moves to a *served* slot: at most
  ``max_connections`` at once, one more gets ``503``. ``/health`` and every refusal are
  answered from the pending slot. A lookup that raises a
  :class:`~stream_ops.errors.TransientError` gets ``503`` too (any other failure ``500``).
* ``keys`` is refused (400) beyond ``MAX_KEYS`` keys in all or ``MAX_JSON_DEPTH`` levels of
  nesting, checked before it is parsed.

Every error is a JSON ``{"error": ...}`` response and at most one log line, with what the
client sent cut to ``LOGGED_CHARS`` characters and control characters escaped
(:func:`loggable`). At most ``log_lines`` such lines are logged per ``log_interval_s`` for the
clients without the token and as many for those with it; the rest are counted, and one line
per interval says how many were suppressed. No traceback reaches the log (it is logged at
DEBUG).

Example:
    >>> server = QueryServer("127.0.0.1", 6700, lookup, token=token, limits=QueryLimits(max_connections=32))  # doctest: +SKIP
    >>> server.start()  # doctest: +SKIP
"""

from __future__ import annotations

import collections
import hmac
import io
import ipaddress
import json
import logging
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, urlparse

from pydantic import BaseModel, ConfigDict, Field

from stream_ops.errors import QueryTLSError, TransientError

logger = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 64 * 1024
MAX_KEYS = 10_000
#: Deepest nesting of ``keys`` accepted: a list of keys, each a list of values that may be lists.
MAX_JSON_DEPTH = 16
#: Characters of anything a client sent (a path, a header) that go into a log line or an error.
LOGGED_CHARS = 200

#: Refused connections kept half-closed at most this long, so the client reads its 503 before
#: the close (closing with unread request bytes would reset the connection and lose the answer).
_LINGER_S = 1.0
#: Refused connections lingering at once; beyond that they are closed at once.
_MAX_LINGERING = 32
#: Seconds between two log lines about refused connections.
_REFUSAL_LOG_EVERY_S = 10.0

Lookup = Callable[[str, int, list[tuple[Any, ...]]], list[Any] | None]
"""(topology id, task id, keys) -> values, or None when the task does not run here."""


class QueryLimits(BaseModel):
    """What one worker's query server lets its clients use.

    Example:
        >>> QueryLimits(max_connections=16).auth_deadline_s
        2.0
    """

    model_config = ConfigDict(frozen=True)

    max_connections: int = Field(
        64,
        ge=1,
        description=(
            "Requests with the token served at once (one thread and one file descriptor each while the lookup runs); "
            "one more is answered 503. Keep it well below the worker's open-files limit."
        ),
    )
    max_pending: int = Field(
        32,
        ge=1,
        description=(
            "Connections at once whose token is not checked yet (TLS handshake, request line, headers under way), one "
            "thread each. When all are taken, a new connection replaces the oldest one of the peer holding the most, "
            "if its own peer holds fewer; else it is answered 503 at once."
        ),
    )
    max_pending_per_peer: int = Field(
        8,
        ge=1,
        description=(
            "Pending connections at once from one peer address (an IPv6 peer: its /64), so that one host cannot take "
            "them all; one more is answered 503 at once."
        ),
    )
    auth_deadline_s: float = Field(
        2.0,
        gt=0,
        description="Seconds a connection has in all for its TLS handshake, request line and headers; then 408.",
    )
    request_deadline_s: float = Field(
        10.0,
        gt=0,
        description="Seconds the reply to a request with the token may take to be sent; a client that stops reading is cut off.",
    )
    max_header_lines: int = Field(32, ge=1, description="Header lines a request may have; more is answered 431.")
    max_header_bytes: int = Field(
        8192, ge=256, description="Bytes of header lines (after the request line) a request may have; more is answered 431."
    )
    log_lines: int = Field(
        20,
        ge=1,
        description=(
            "Lines logged about failed requests per log_interval_s, for clients without the token and for those with "
            "it each; the rest are counted, and one line per interval says how many were suppressed."
        ),
    )
    log_interval_s: float = Field(60.0, gt=0, description="The interval of log_lines, in seconds.")


class _RequestRefused(Exception):  # noqa: N818 - control flow inside the handler, never leaves this module
    """An error response to send: HTTP status and what the client should know."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


class _DeadlinePassed(Exception):  # noqa: N818 - control flow inside the handler, never leaves this module
    """The request line and headers did not arrive before the connection's deadline."""


class _Evicted(Exception):  # noqa: N818 - control flow inside the handler, never leaves this module
    """The connection's pending slot was given to a newer connection; it was shut down."""


def json_depth_exceeds(text: str, limit: int) -> bool:
    """Whether JSON ``text`` nests arrays or objects deeper than ``limit`` (without parsing it).

    Brackets inside strings do not count. Malformed text is not judged here (the parser is).

    Example:
        >>> json_depth_exceeds('[["a"], ["[[["]]', 2), json_depth_exceeds("[[[1]]]", 2)
        (False, True)
    """
    if text.count("[") + text.count("{") <= limit:
        return False
    depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return True
        elif char in "]}":
            depth -= 1
    return False


def loggable(text: str, limit: int = LOGGED_CHARS) -> str:
    r"""``text`` fit for one log line: cut to ``limit`` characters, control characters escaped.

    Escape sequences (ANSI colours, cursor moves), CR and LF are shown as ``\x1b``, ``\r``,
    ``\n``, so a client cannot forge log lines or reach an operator's terminal.

    Example:
        >>> loggable("/x\x1b[2J\r\nINFO forged" + "a" * 300, 20)
        '/x\\x1b[2J\\r\\nINFO fo... (319 characters)'
    """
    cut = text[:limit]
    shown = "".join(char if char.isprintable() else char.encode("unicode_escape").decode("ascii") for char in cut)
    if len(shown) > limit:
        shown = shown[:limit]
    return f"{shown}... ({len(text)} characters)" if len(text) > limit or len(shown) < len(cut) else shown


class _LogBudget:
    """At most ``lines`` log lines per ``interval_s`` about one kind of client; the rest counted.

    A line over the budget is dropped and counted; when the interval ends (noticed by the next
    line or by :meth:`flush`), one line says how many were dropped.
    """

    def __init__(self, who: str, lines: int, interval_s: float) -> None:
        self._who = who
        self._lines = lines
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._window_end = float("-inf")
        self._used = 0
        self._suppressed = 0

    def log(self, level: int, message: str, *args: Any) -> None:
        if not logger.isEnabledFor(level):
            return
        with self._lock:
            summary = self._roll(time.monotonic())
            allowed = self._used < self._lines
            if allowed:
                self._used += 1
            else:
                self._suppressed += 1
        if summary:
            self._summarise(summary)
        if allowed:
            logger.log(level, message, *args)

    def flush(self, now: float) -> None:
        """Say how many lines the interval that ended dropped (called on the accepting thread)."""
        with self._lock:
            summary = self._roll(now) if now >= self._window_end else 0
        if summary:
            self._summarise(summary)

    def _roll(self, now: float) -> int:
        """Start a new interval if the last one ended; returns what it suppressed (lock held)."""
        if now < self._window_end:
            return 0
        suppressed = self._suppressed
        self._window_end = now + self._interval_s
        self._used = self._suppressed = 0
        return suppressed

    def _summarise(self, suppressed: int) -> None:
        logger.warning(
            "query server: %d more log line(s) about requests %s suppressed (at most %d per %g s)",
            suppressed,
            self._who,
            self._lines,
            self._interval_s,
        )


def peer_of(address: Any) -> str:
    """The peer a connection counts against: its IPv4 address, or the /64 of an IPv6 one.

    Example:
        >>> peer_of(("2001:db8::7", 5000, 0, 0)), peer_of(("::ffff:10.0.0.3", 1)), peer_of(("127.0.0.2", 9))
        ('2001:db8::/64', '10.0.0.3', '127.0.0.2')
    """
    host = str(address[0]) if isinstance(address, tuple) and address else str(address)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip.exploded.split('%')[0]}/64", strict=False))
    return str(ip)


@dataclass(eq=False)
class _Ticket:
    """One connection's slot: pending until its token is checked, then served."""

    peer: str
    deadline: float
    sock: socket.socket
    served: bool = False
    evicted: bool = False


_Refusal = Literal["peer", "full"]


class _Admission:
    """The pending and served slots of a server's connections (thread-safe).

    A pending ticket's socket is shut down only under the lock and only while the ticket is
    pending: a handler releases its ticket before it closes the socket, so a shutdown never
    reaches a file descriptor the kernel gave to another connection meanwhile.
    """

    def __init__(self, limits: QueryLimits) -> None:
        self._limits = limits
        self._lock = threading.Lock()
        self._pending: dict[_Ticket, None] = {}  # oldest first
        self._per_peer: collections.Counter[str] = collections.Counter()
        self._served = 0
        self.evictions = 0

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def served(self) -> int:
        return self._served

    def admit(self, sock: socket.socket, peer: str) -> _Ticket | _Refusal:
        """A pending slot for a new connection (perhaps another's, evicted), or why there is none."""
        limits = self._limits
        with self._lock:
            held = self._per_peer[peer]
            if held >= limits.max_pending_per_peer:
                return "peer"
            if len(self._pending) >= limits.max_pending:
                most = max(self._per_peer.values())
                if most <= held:
                    return "full"
                self._evict(next(t for t in self._pending if self._per_peer[t.peer] == most))
            ticket = _Ticket(peer, time.monotonic() + limits.auth_deadline_s, sock)
            self._pending[ticket] = None
            self._per_peer[peer] += 1
            return ticket

    def track(self, ticket: _Ticket, sock: socket.socket) -> bool:
        """Follow the connection's new socket (TLS); False if it was evicted meanwhile."""
        with self._lock:
            ticket.sock = sock
            return not ticket.evicted

    def promote(self, ticket: _Ticket) -> Literal["served", "evicted", "full"]:
        """Move an authenticated connection from its pending slot to a served one."""
        with self._lock:
            if ticket.evicted:
                return "evicted"
            self._unpend(ticket)
            if self._served >= self._limits.max_connections:
                return "full"
            self._served += 1
            ticket.served = True
            return "served"

    def release(self, ticket: _Ticket) -> None:
        """Give back whichever slot the connection holds (before its socket is closed)."""
        with self._lock:
            if ticket in self._pending:
                self._unpend(ticket)
            elif ticket.served:
                ticket.served = False
                self._served -= 1

    def _unpend(self, ticket: _Ticket) -> None:
        if ticket not in self._pending:
            return
        del self._pending[ticket]
        self._per_peer[ticket.peer] -= 1
        if not self._per_peer[ticket.peer]:
            del self._per_peer[ticket.peer]

    def _evict(self, ticket: _Ticket) -> None:
        self._unpend(ticket)
        ticket.evicted = True
        self.evictions += 1
        try:
            # The plain socket method: an SSLSocket's own shutdown would unwrap its TLS
            # object under its handler thread.
            socket.socket.shutdown(ticket.sock, socket.SHUT_RDWR)
        except OSError:
            pass  # a socket being wrapped in TLS: its handler sees ``evicted`` when it tracks it


class _DeadlineReader(io.RawIOBase):
    """Reads a socket, each read waiting at most until one deadline for the whole request."""

    def __init__(self, sock: socket.socket, ticket: _Ticket) -> None:
        super().__init__()
        self._sock = sock
        self._ticket = ticket

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        remaining = self._ticket.deadline - time.monotonic()
        if remaining <= 0:
            raise _DeadlinePassed
        self._sock.settimeout(remaining)
        try:
            received = self._sock.recv_into(buffer)
        except TimeoutError as e:
            raise _DeadlinePassed from e
        if not received and self._ticket.evicted:
            raise _Evicted
        return received


class _Handler(BaseHTTPRequestHandler):
    """One request per connection (HTTP/1.0): read within the budgets, checked, answered."""

    server: QueryServer
    #: socketserver's socket timeout until :meth:`setup` bounds reads by the ticket's deadline
    #: and :meth:`_reply` bounds writes.
    timeout = 10.0

    def __init__(self, request: Any, client_address: Any, server: QueryServer, *, ticket: _Ticket) -> None:
        self.ticket = ticket
        self.authenticated = False
        super().__init__(request, client_address, server)

    def setup(self) -> None:
        super().setup()
        # What an error reply needs before the request line is parsed (the base sets them later).
        self.requestline, self.command, self.request_version = "", "", "HTTP/1.0"
        # Every read of the request line and headers waits at most until the ticket's deadline,
        # so a client dripping a byte at a time cannot hold the connection longer than that.
        self.rfile.close()
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, self.ticket))

    def handle(self) -> None:
        self.close_connection = True
        self.handle_one_request()

    # --- logging: at most one line per error reply, none per success -------------------------

    def _log(self, level: int, message: str, *args: Any) -> None:
        budgets = self.server.log_budgets
        (budgets.authenticated if self.authenticated else budgets.anonymous).log(level, message, *args)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - signature from the base class
        self._log(logging.DEBUG, "query %s", loggable(format % args))

    def log_error(self, format: str, *args: Any) -> None:  # noqa: A002 - signature from the base class
        # The base class calls it from send_error (which logs itself, below) and for timeouts.
        self._log(logging.DEBUG, "query %s", loggable(format % args))

    # --- replies ----------------------------------------------------------------------------------

    def _reply(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode("utf-8")
        # Writes are bounded too: a client that stops reading cannot hold the thread.
        limits = self.server.limits
        self.connection.settimeout(limits.request_deadline_s if self.ticket.served else limits.auth_deadline_s)
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, headers: dict[str, str] | None = None, *, level: int | None = None) -> None:
        """Answer ``status`` with a JSON error and log it once (by default 4xx at INFO, 5xx at WARNING)."""
        if level is None:
            level = logging.WARNING if status >= 500 else logging.INFO
        shown = loggable(message, 2 * LOGGED_CHARS)
        self._log(level, "query from %s: %d %s", self.client_address[0], status, shown)
        self._reply(status, {"error": shown}, headers)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """JSON instead of the base class's HTML page (oversized, malformed or unsupported requests)."""
        short, long = self.responses.get(code, ("Error", ""))
        text = f"{message or short}: {explain or long}" if (explain or long) else (message or short)
        self.close_connection = True
        self._error(code, text, {"Connection": "close"})

    # --- requests ---------------------------------------------------------------------------------

    def handle_one_request(self) -> None:
        """Serve one request; one not sent before its deadline gets 408, a failure a JSON 500."""
        try:
            self._read_and_answer()
        except _DeadlinePassed:
            self._error(408, f"request not complete within {self.server.limits.auth_deadline_s:g} s")
        except _Evicted:
            self._log(logging.DEBUG, "query connection from %s replaced by a newer one", self.client_address[0])
        except OSError as e:  # the client went away, or a write timed out
            self._log(logging.DEBUG, "query connection from %s dropped: %s", self.client_address[0], loggable(repr(e)))
        except Exception as e:
            logger.debug("query handler failed", exc_info=True)
            self._error(500, f"internal error: {type(e).__name__}: {e}")

    def _read_and_answer(self) -> None:
        self.raw_requestline = self.rfile.readline(MAX_REQUEST_BYTES + 1)
        if len(self.raw_requestline) > MAX_REQUEST_BYTES:
            self.send_error(414)
            return
        if not self.raw_requestline or not self.parse_request():
            return
        if self.command != "GET":
            self.send_error(501, f"Unsupported method ({self.command!r})")
            return
        try:
            self._serve_get()
        except _RequestRefused as refused:
            self._error(refused.status, refused.message, refused.headers)

    def parse_request(self) -> bool:
        """The base class's parsing of the request line, with headers read within the budgets.

        The base class would read up to 100 header lines of 64 KiB each before anything can
        check the token; here the header block is read first, bounded, and the base class
        parses that block alone.
        """
        try:
            block = self._header_block()
        except _RequestRefused as refused:
            self.send_error(refused.status, refused.message)
            return False
        wire, self.rfile = self.rfile, io.BufferedReader(io.BytesIO(block))
        try:
            return super().parse_request()
        finally:
            self.rfile = wire

    def _header_block(self) -> bytes:
        """The header lines up to the blank line (or the end of input), within the limits.

        Raises:
            _RequestRefused: 431, more lines or bytes than the limits allow.
        """
        limits = self.server.limits
        budget = limits.max_header_bytes
        lines: list[bytes] = []
        while True:
            line = self.rfile.readline(budget + 1)
            budget -= len(line)
            if budget < 0:
                raise _RequestRefused(431, f"Request Header Fields Too Large: at most {limits.max_header_bytes} bytes")
            if line in (b"\r\n", b"\n", b""):
                return b"".join(lines) + b"\r\n"
            lines.append(line)
            if len(lines) > limits.max_header_lines:
                raise _RequestRefused(431, f"Request Header Fields Too Large: at most {limits.max_header_lines} lines")

    def _serve_get(self) -> None:
        if len(self.path) > MAX_REQUEST_BYTES:
            raise _RequestRefused(414, f"request too large: at most {MAX_REQUEST_BYTES} bytes")
        url = urlparse(self.path)
        if url.path == "/health":
            self._reply(200, {"status": "ok"})
            return
        self.authenticated = self._authorized()
        if url.path != "/query":
            raise _RequestRefused(404, f"unknown path {loggable(url.path)}")
        if not self.authenticated:
            self._error(
                401,
                "missing or wrong query token: send 'Authorization: Bearer <token>' "
                "(pass --query-token-file or --zk-auth matching the cluster's)",
                {"WWW-Authenticate": 'Bearer realm="stream-ops"'},
                level=logging.WARNING,
            )
            return
        promoted = self.server.admission.promote(self.ticket)
        if promoted == "evicted":
            raise _Evicted
        if promoted == "full":
            self.server.note_refusal(self.client_address)
            self._reply(
                503,
                {
                    "error": f"the query server is serving its limit of {self.server.limits.max_connections} requests; retry shortly"
                },
                {"Retry-After": "1"},
            )
            return
        topology_id, asks = _parse_query(url.query)
        values: list[Any] = []
        for task_id, keys in asks:
            try:
                found = self.server.lookup(topology_id, task_id, keys)
            except TransientError as e:  # e.g. the task's store still writing a committed batch
                raise _RequestRefused(503, f"{e}", {"Retry-After": "1"}) from e
            except Exception as e:
                logger.debug("lookup of %s/%d failed", topology_id, task_id, exc_info=True)
                raise _RequestRefused(500, str(e)) from e
            if found is None:
                # Routine while tasks move (the client re-routes): logged at DEBUG only.
                self._error(404, f"task {topology_id}/{task_id} does not run on this worker", level=logging.DEBUG)
                return
            values += found
        self._reply(200, {"values": values})

    def _authorized(self) -> bool:
        """Whether the request carries the server's bearer token (always, when it has none)."""
        expected = self.server.token
        if expected is None:
            return True
        scheme, _, presented = self.headers.get("Authorization", "").partition(" ")
        # Compared as bytes in constant time; a header is latin-1 text on the wire.
        return scheme.lower() == "bearer" and hmac.compare_digest(
            presented.strip().encode("latin-1", "replace"), expected.encode("latin-1")
        )


def _parse_query(query: str) -> tuple[str, list[tuple[int, list[tuple[Any, ...]]]]]:
    """``(topology, [(task, keys), ...])`` of a query string, the pairs in request order.

    Raises:
        _RequestRefused: 400, naming what is wrong.
    """
    params = parse_qs(query)
    try:
        topology_id = params["topology"][0]
        tasks, texts = params["task"], params["keys"]
        if len(tasks) != len(texts):
            raise ValueError(f"{len(tasks)} task parameters for {len(texts)} keys parameters: give them in pairs")
        asks: list[tuple[int, list[tuple[Any, ...]]]] = []
        total = 0
        for task, text in zip(tasks, texts, strict=True):
            if json_depth_exceeds(text, MAX_JSON_DEPTH):
                raise ValueError(f"keys nest deeper than {MAX_JSON_DEPTH} levels")
            keys = json.loads(text)
            total += len(keys) if isinstance(keys, list) else 0
            if not isinstance(keys, list) or total > MAX_KEYS or not all(isinstance(k, list) for k in keys):
                raise ValueError(f"keys must be JSON lists of at most {MAX_KEYS} key lists in all")
            asks.append((int(task), [tuple(k) for k in keys]))
    except (KeyError, IndexError, ValueError, RecursionError) as e:
        raise _RequestRefused(400, f"bad query: {e}; expected topology, task and keys parameters") from e
    return topology_id, asks


def server_tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    """The TLS context of a query server presenting ``cert`` (PEM chain) with its private ``key``.

    Raises:
        QueryTLSError: The certificate or key cannot be read or do not match.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certfile=cert, keyfile=key)
    except (OSError, ssl.SSLError) as e:
        raise QueryTLSError(
            f"cannot load the query server's certificate {cert} and key {key}: {e}; pass --query-tls-cert and "
            "--query-tls-key as PEM files of one key pair, readable by the worker"
        ) from e
    return context


def _refusal(message: str) -> bytes:
    """The whole 503 response sent to a connection refused by the accepting thread."""
    body = json.dumps({"error": message}).encode("utf-8")
    head = (
        "HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


@dataclass(frozen=True)
class _LogBudgets:
    """The log budget of clients without the token and that of clients with it."""

    anonymous: _LogBudget
    authenticated: _LogBudget


class QueryServer(ThreadingHTTPServer):
    """HTTP(S) server answering state queries for the tasks of one worker.

    Args:
        host: Interface to bind.
        port: Port to bind (0 picks a free one).
        lookup: Answers a query from the worker's tasks.
        token: Bearer token ``/query`` requires; None serves anyone (local development).
        tls: Server TLS context (:func:`server_tls_context`); None serves plain HTTP.
        limits: Connection slots, deadlines, header and log budgets (:class:`QueryLimits`).
    """

    daemon_threads = True
    # Connections over the caps are accepted and answered at once, so a deeper queue only lets
    # a burst of clients wait for that instead of having their connects dropped.
    request_queue_size = 128

    def __init__(
        self,
        host: str,
        port: int,
        lookup: Lookup,
        *,
        token: str | None = None,
        tls: ssl.SSLContext | None = None,
        limits: QueryLimits | None = None,
    ) -> None:
        super().__init__((host, port), _Handler)  # type: ignore[arg-type]  # _serve_connection adds the ticket
        self.lookup = lookup
        self.token = token
        self.tls = tls
        self.limits = limits or QueryLimits()
        self.admission = _Admission(self.limits)
        self.log_budgets = _LogBudgets(
            _LogBudget("without the query token", self.limits.log_lines, self.limits.log_interval_s),
            _LogBudget("with the query token", self.limits.log_lines, self.limits.log_interval_s),
        )
        self._lingering: collections.deque[tuple[float, socket.socket]] = collections.deque()
        self.refusals = 0
        """Connections answered 503 (or closed unanswered, with TLS) since the start."""
        self._refused = 0
        self._refusals_logged_at = float("-inf")
        self._refusal_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def active_connections(self) -> int:
        """Connections being handled right now (each holds a thread): pending and served."""
        return self.admission.pending + self.admission.served

    @property
    def pending_connections(self) -> int:
        """Connections whose request line, headers or token are still awaited."""
        return self.admission.pending

    @property
    def served_connections(self) -> int:
        """Requests with the token being answered."""
        return self.admission.served

    # --- admission (accepting thread) -----------------------------------------------------------

    def process_request(self, request: Any, client_address: Any) -> None:
        """Handle the connection on its own thread if it gets a pending slot, else refuse it at once."""
        ticket = self.admission.admit(request, peer_of(client_address))
        if not isinstance(ticket, _Ticket):
            self._refuse(request, client_address, ticket)
            return
        thread = threading.Thread(
            target=self._serve_connection, args=(request, client_address, ticket), name="stream-ops-query-conn", daemon=True
        )
        try:
            thread.start()
        except BaseException:
            self.admission.release(ticket)
            raise

    def note_refusal(self, client_address: Any) -> None:
        """Count a refused connection; log the count at most every ``_REFUSAL_LOG_EVERY_S``."""
        now = time.monotonic()
        with self._refusal_lock:
            self.refusals += 1
            self._refused += 1
            if now - self._refusals_logged_at < _REFUSAL_LOG_EVERY_S:
                return
            refused, self._refused, self._refusals_logged_at = self._refused, 0, now
        limits = self.limits
        logger.warning(
            "query server busy: refused %d connection(s) since the last report (latest from %s): %d pending of at most %d "
            "(%d per peer), %d served of at most %d; raise QueryLimits.max_pending / max_connections if legitimate "
            "clients need more",
            refused,
            loggable(str(client_address[0])),
            self.admission.pending,
            limits.max_pending,
            limits.max_pending_per_peer,
            self.admission.served,
            limits.max_connections,
        )

    def _refuse(self, request: socket.socket, client_address: Any, why: _Refusal) -> None:
        """Answer 503 without blocking (plain HTTP) and close; runs on the accepting thread."""
        self.note_refusal(client_address)
        if self.tls is not None:
            self.shutdown_request(request)
            return
        if why == "peer":
            message = (
                f"{self.limits.max_pending_per_peer} connections from your address are still sending their request; retry shortly"
            )
        else:
            message = f"the query server is handling its limit of {self.limits.max_pending} new connections; retry shortly"
        try:
            request.setblocking(False)
            request.send(_refusal(message))
            request.shutdown(socket.SHUT_WR)
        except OSError:
            self.close_request(request)
            return
        if len(self._lingering) >= _MAX_LINGERING:
            self.close_request(request)
            return
        self._lingering.append((time.monotonic() + _LINGER_S, request))

    def service_actions(self) -> None:
        """Close refused connections once their client had time to read the 503; end log intervals
        (accepting thread, every poll)."""
        now = time.monotonic()
        while self._lingering and self._lingering[0][0] <= now:
            _, sock = self._lingering.popleft()
            self.close_request(sock)
        self.log_budgets.anonymous.flush(now)
        self.log_budgets.authenticated.flush(now)

    # --- per connection (its own thread) --------------------------------------------------------

    def _serve_connection(self, request: socket.socket, client_address: Any, ticket: _Ticket) -> None:
        """Handle one connection (after its TLS handshake when serving TLS), then close it."""
        connection: socket.socket = request
        try:
            if self.tls is not None:
                wrapped = self._handshake(request, client_address, ticket)
                if wrapped is None:
                    return
                connection = wrapped
            _Handler(connection, client_address, self, ticket=ticket)
        except Exception:  # noqa: BLE001 - as socketserver does: one connection's failure is logged, not raised
            self.handle_error(request, client_address)
        finally:
            # The slot first: once released, no eviction can shut down this descriptor.
            self.admission.release(ticket)
            if connection is not request:
                self._close_tls(connection)  # type: ignore[arg-type]
            self.shutdown_request(request)

    def _handshake(self, request: socket.socket, client_address: Any, ticket: _Ticket) -> ssl.SSLSocket | None:
        """The TLS connection, or None (closed here) if its handshake failed, did not finish in time,
        or its slot went to a newer connection."""
        assert self.tls is not None
        # CPython bounds a whole do_handshake() call by the socket timeout, not each read.
        request.settimeout(max(ticket.deadline - time.monotonic(), 0.001))
        try:
            connection = self.tls.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
        except (OSError, ssl.SSLError) as e:
            self._debug_anonymous("TLS with %s not started: %s", client_address[0], e)
            return None
        if not self.admission.track(ticket, connection):
            self._close_tls(connection)
            return None
        try:
            connection.do_handshake()
        except (OSError, ssl.SSLError) as e:
            self._debug_anonymous("TLS handshake with %s failed: %s", client_address[0], e)
            self.admission.release(ticket)
            self._close_tls(connection)
            return None
        return connection

    def _debug_anonymous(self, message: str, *args: Any) -> None:
        self.log_budgets.anonymous.log(logging.DEBUG, message, *(loggable(str(arg)) for arg in args))

    @staticmethod
    def _close_tls(connection: ssl.SSLSocket) -> None:
        """Close a TLS connection as socketserver closes a plain one (half-close, then close)."""
        try:
            connection.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        connection.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """One log line for a connection that failed outside a request (the traceback at DEBUG)."""
        error = sys.exc_info()[1]
        if isinstance(error, TimeoutError | ConnectionError):
            self._debug_anonymous("query connection from %s dropped: %r", client_address[0], error)
            return
        self.log_budgets.anonymous.log(
            logging.WARNING,
            "query connection from %s failed: %s: %s",
            client_address[0],
            type(error).__name__,
            loggable(str(error)),
        )
        logger.debug("query connection failure", exc_info=error)

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self.serve_forever, name="stream-ops-query", daemon=True)
        self._thread.start()
        limits = self.limits
        logger.info(
            "state queries served on %s://%s:%d (%s; %d pending connections, %d per peer, %g s for request line and "
            "headers; %d served at once)",
            "https" if self.tls else "http",
            *self.server_address[:2],
            "bearer token required" if self.token else "unauthenticated",
            limits.max_pending,
            limits.max_pending_per_peer,
            limits.auth_deadline_s,
            limits.max_connections,
        )

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        while self._lingering:
            self.close_request(self._lingering.popleft()[1])
