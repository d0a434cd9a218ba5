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
  nesting, checked before it is parsed (:mod:`~stream_ops.runtime.query_request`).

Every error is a JSON ``{"error": ...}`` response and at most one log line, with what the
client sent cut to ``LOGGED_CHARS`` characters and control characters escaped
(:func:`~stream_ops.runtime.query_log.loggable`). At most ``log_lines`` such lines are logged
per ``log_interval_s`` for the clients without the token and as many for those with it; the
rest are counted, and one line per interval says how many were suppressed. No traceback reaches
the log (it is logged at DEBUG).

The slots are kept by :mod:`~stream_ops.runtime.query_admission`, the log budgets by
:mod:`~stream_ops.runtime.query_log`; this module reads, checks and answers the requests.

Example:
    >>> server = QueryServer("127.0.0.1", 6700, lookup, token=token, limits=QueryLimits(max_connections=32))  # doctest: +SKIP
    >>> server.start()  # doctest: +SKIP
"""

from __future__ import annotations

import hmac
import io
import json
import logging
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from stream_ops.errors import QueryTLSError, TransientError
from stream_ops.runtime.query_admission import Admission as _Admission
from stream_ops.runtime.query_admission import Refusal as _Refusal
from stream_ops.runtime.query_admission import RefusedConnections as _RefusedConnections
from stream_ops.runtime.query_admission import Ticket as _Ticket
from stream_ops.runtime.query_admission import peer_of
from stream_ops.runtime.query_limits import QueryLimits
from stream_ops.runtime.query_log import LOGGED_CHARS, LogBudget, loggable
from stream_ops.runtime.query_log import LogBudgets as _LogBudgets
from stream_ops.runtime.query_request import MAX_JSON_DEPTH, MAX_KEYS, MAX_REQUEST_BYTES, parse_query

__all__ = [
    "LOGGED_CHARS",
    "MAX_JSON_DEPTH",
    "MAX_KEYS",
    "MAX_REQUEST_BYTES",
    "Lookup",
    "QueryLimits",
    "QueryServer",
    "server_tls_context",
]

logger = logging.getLogger(__name__)

Lookup = Callable[[str, int, list[tuple[Any, ...]]], list[Any] | None]
"""(topology id, task id, keys) -> values, or None when the task does not run here."""


class _LogBudget(LogBudget):
    """A log budget whose lines go to this module's logger, the name operators configure."""

    def __init__(self, who: str, lines: int, interval_s: float) -> None:
        super().__init__(who, lines, interval_s, log=logger)


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
        try:
            topology_id, asks = parse_query(url.query)
        except ValueError as e:
            raise _RequestRefused(400, str(e)) from e
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
        self._refused = _RefusedConnections(self.limits, self.admission, log=logger, close=self.close_request)
        self._thread: threading.Thread | None = None

    @property
    def refusals(self) -> int:
        """Connections answered 503 (or closed unanswered, with TLS) since the start."""
        return self._refused.count

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
        """Count a refused connection; the count is logged at most every few seconds."""
        self._refused.note(client_address)

    def _refuse(self, request: socket.socket, client_address: Any, why: _Refusal) -> None:
        """Answer 503 without blocking (plain HTTP) and close; runs on the accepting thread."""
        self.note_refusal(client_address)
        if self.tls is not None:
            self.shutdown_request(request)
            return
        self._refused.answer(request, why)

    def service_actions(self) -> None:
        """Close refused connections once their client had time to read the 503; end log intervals
        (accepting thread, every poll)."""
        now = time.monotonic()
        self._refused.close_lingering(now)
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
        self._refused.close_all()
