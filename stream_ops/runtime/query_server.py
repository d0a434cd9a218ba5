"""The state-query endpoint each worker serves on its slot port (HTTP, JSON).

``GET /query?topology=<id>&task=<n>&keys=<json list of key lists>`` returns
``{"values": [...]}`` in key order. ``task`` and ``keys`` may repeat, in pairs, to ask several
tasks of this worker at once (one round trip): the values are then those of each pair's keys,
pair after pair. Requests are bounded in size; malformed ones get 400 and a task that does not
run here 404 (the first such task of the request), so a client can re-route after a move.

With a token (:func:`stream_ops.config.query_token`), ``/query`` requires
``Authorization: Bearer <token>`` and answers 401 without it; ``/health`` stays open. With a TLS
context (:func:`server_tls_context`) every connection is TLS, its handshake made on the
connection's own thread under the same deadline as a request.

Limits (:class:`QueryLimits`), so that no client can starve the worker of threads or file
descriptors (its ZooKeeper session and its tasks need both):

* at most ``max_connections`` connections are served at once, each on its own thread; one
  more is answered ``503`` at once by the accepting thread and closed (a TLS one is closed
  without an answer: its handshake would take a thread);
* a connection has ``request_deadline_s`` in all to finish its TLS handshake and send its
  request line and headers, however slowly it drips them; then it gets ``408`` and is closed;
* ``keys`` is refused (400) beyond ``MAX_KEYS`` keys in all or ``MAX_JSON_DEPTH`` levels of
  nesting, checked before it is parsed.

Every error is a JSON ``{"error": ...}`` response and one log line; no traceback reaches the
log (it is logged at DEBUG).

Example:
    >>> server = QueryServer("127.0.0.1", 6700, lookup, token=token, limits=QueryLimits(max_connections=32))  # doctest: +SKIP
    >>> server.start()  # doctest: +SKIP
"""

from __future__ import annotations

import collections
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
from urllib.parse import parse_qs, urlparse

from pydantic import BaseModel, ConfigDict, Field

from stream_ops.errors import QueryTLSError

logger = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 64 * 1024
MAX_KEYS = 10_000
#: Deepest nesting of ``keys`` accepted: a list of keys, each a list of values that may be lists.
MAX_JSON_DEPTH = 16

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
        >>> QueryLimits(max_connections=16).request_deadline_s
        10.0
    """

    model_config = ConfigDict(frozen=True)

    max_connections: int = Field(
        64,
        ge=1,
        description=(
            "Connections served at once (one thread and one file descriptor each); one more is answered 503 at once. "
            "Keep it well below the worker's open-files limit."
        ),
    )
    request_deadline_s: float = Field(
        10.0,
        gt=0,
        description="Seconds a connection has in all for its TLS handshake, request line and headers; then 408.",
    )


class _RequestRefused(Exception):  # noqa: N818 - control flow inside the handler, never leaves this module
    """An error response to send: HTTP status and what the client should know."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _DeadlinePassed(Exception):  # noqa: N818 - control flow inside the handler, never leaves this module
    """The request line and headers did not arrive before the connection's deadline."""


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


class _DeadlineReader(io.RawIOBase):
    """Reads a socket, each read waiting at most until one deadline for the whole request."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise _DeadlinePassed
        self._sock.settimeout(remaining)
        try:
            return self._sock.recv_into(buffer)
        except TimeoutError as e:
            raise _DeadlinePassed from e


class _Handler(BaseHTTPRequestHandler):
    server: QueryServer
    #: socketserver's socket timeout until :meth:`setup` bounds reads by the request's deadline
    #: and :meth:`_reply` bounds writes by ``request_deadline_s``.
    timeout = 10.0

    def __init__(self, request: Any, client_address: Any, server: QueryServer, *, deadline: float) -> None:
        self.deadline = deadline
        super().__init__(request, client_address, server)

    def setup(self) -> None:
        super().setup()
        # What an error reply needs before the request line is parsed (the base sets them later).
        self.requestline, self.command, self.request_version = "", "", "HTTP/1.0"
        # Every read of the request line and headers waits at most until the request's deadline,
        # so a client dripping a byte at a time cannot hold the connection longer than that.
        self.rfile.close()
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, self.deadline))

    # --- logging: one line per error reply, nothing per success ---------------------------------

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - signature from the base class
        logger.debug("query %s", format % args)

    def log_error(self, format: str, *args: Any) -> None:  # noqa: A002 - signature from the base class
        # The base class calls it from send_error (which logs itself, below) and for timeouts.
        logger.debug("query %s", format % args)

    # --- replies ----------------------------------------------------------------------------------

    def _reply(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode("utf-8")
        # Writes are bounded too: a client that stops reading cannot hold the thread.
        self.connection.settimeout(self.server.limits.request_deadline_s)
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
        logger.log(level, "query from %s: %d %s", self.client_address[0], status, message)
        self._reply(status, {"error": message}, headers)

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
            super().handle_one_request()
        except _DeadlinePassed:
            self.close_connection = True
            self._error(408, f"request not complete within {self.server.limits.request_deadline_s:g} s")
        except OSError as e:  # the client went away (the base handles write timeouts itself)
            self.close_connection = True
            logger.debug("query connection from %s dropped: %r", self.client_address[0], e)
        except Exception as e:
            logger.debug("query handler failed", exc_info=True)
            self.close_connection = True
            self._error(500, f"internal error: {type(e).__name__}: {e}")

    def do_GET(self) -> None:
        try:
            self._serve_get()
        except _RequestRefused as refused:
            self._error(refused.status, refused.message)

    def _serve_get(self) -> None:
        if len(self.path) > MAX_REQUEST_BYTES:
            raise _RequestRefused(414, f"request too large: at most {MAX_REQUEST_BYTES} bytes")
        url = urlparse(self.path)
        if url.path == "/health":
            self._reply(200, {"status": "ok"})
            return
        if url.path != "/query":
            raise _RequestRefused(404, f"unknown path {url.path}")
        if not self._authorized():
            self._error(
                401,
                "missing or wrong query token: send 'Authorization: Bearer <token>' "
                "(pass --query-token-file or --zk-auth matching the cluster's)",
                {"WWW-Authenticate": 'Bearer realm="stream-ops"'},
                level=logging.WARNING,
            )
            return
        topology_id, asks = _parse_query(url.query)
        values: list[Any] = []
        for task_id, keys in asks:
            try:
                found = self.server.lookup(topology_id, task_id, keys)
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


def _refusal(limit: int) -> bytes:
    """The whole 503 response sent to a connection over the cap."""
    body = json.dumps({"error": f"the query server is serving its limit of {limit} connections; retry shortly"}).encode("utf-8")
    head = (
        "HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class QueryServer(ThreadingHTTPServer):
    """HTTP(S) server answering state queries for the tasks of one worker.

    Args:
        host: Interface to bind.
        port: Port to bind (0 picks a free one).
        lookup: Answers a query from the worker's tasks.
        token: Bearer token ``/query`` requires; None serves anyone (local development).
        tls: Server TLS context (:func:`server_tls_context`); None serves plain HTTP.
        limits: Connection cap and request deadline (:class:`QueryLimits`).
    """

    daemon_threads = True
    # Connections over the cap are accepted and answered at once, so a deeper queue only lets
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
        super().__init__((host, port), _Handler)  # type: ignore[arg-type]  # finish_request adds the deadline
        self.lookup = lookup
        self.token = token
        self.tls = tls
        self.limits = limits or QueryLimits()
        self._slots = threading.BoundedSemaphore(self.limits.max_connections)
        self._active = 0
        self._active_lock = threading.Lock()
        self._lingering: collections.deque[tuple[float, socket.socket]] = collections.deque()
        self._refused = 0
        self._refusals_logged_at = 0.0
        self._thread: threading.Thread | None = None

    @property
    def active_connections(self) -> int:
        """Connections being served right now (each holds a thread)."""
        return self._active

    # --- connection cap -------------------------------------------------------------------------

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve the connection on its own thread if under the cap, else refuse it at once."""
        if not self._slots.acquire(blocking=False):
            self._refuse(request, client_address)
            return
        with self._active_lock:
            self._active += 1
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release_slot()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release_slot()

    def _release_slot(self) -> None:
        with self._active_lock:
            self._active -= 1
        self._slots.release()

    def _refuse(self, request: socket.socket, client_address: Any) -> None:
        """Answer 503 without blocking (plain HTTP) and close; runs on the accepting thread."""
        self._refused += 1
        now = time.monotonic()
        if now - self._refusals_logged_at >= _REFUSAL_LOG_EVERY_S:
            logger.warning(
                "query server at its limit of %d connections: refused %d connection(s) (latest from %s); "
                "raise QueryLimits.max_connections if legitimate clients need more",
                self.limits.max_connections,
                self._refused,
                client_address[0],
            )
            self._refused = 0
            self._refusals_logged_at = now
        if self.tls is not None:
            self.shutdown_request(request)
            return
        try:
            request.setblocking(False)
            request.send(_refusal(self.limits.max_connections))
            request.shutdown(socket.SHUT_WR)
        except OSError:
            self.close_request(request)
            return
        if len(self._lingering) >= _MAX_LINGERING:
            self.close_request(request)
            return
        self._lingering.append((now + _LINGER_S, request))

    def service_actions(self) -> None:
        """Close refused connections once their client had time to read the 503 (accepting thread)."""
        now = time.monotonic()
        while self._lingering and self._lingering[0][0] <= now:
            _, sock = self._lingering.popleft()
            self.close_request(sock)

    # --- per connection -------------------------------------------------------------------------

    def finish_request(self, request: Any, client_address: Any) -> None:
        """Handle one connection on its own thread (after its TLS handshake when serving TLS)."""
        deadline = time.monotonic() + self.limits.request_deadline_s
        if self.tls is None:
            _Handler(request, client_address, self, deadline=deadline)
            return
        connection = self._handshake(request, client_address, deadline)
        if connection is None:
            return
        try:
            _Handler(connection, client_address, self, deadline=deadline)
        finally:
            self._close_tls(connection)

    def _handshake(self, request: socket.socket, client_address: Any, deadline: float) -> ssl.SSLSocket | None:
        """The TLS connection, or None if its handshake failed or did not finish before ``deadline``."""
        assert self.tls is not None
        # CPython bounds a whole do_handshake() call by the socket timeout, not each read.
        request.settimeout(max(deadline - time.monotonic(), 0.001))
        try:
            return self.tls.wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError) as e:
            logger.debug("TLS handshake with %s failed: %s", client_address[0], e)
            return None

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
            logger.debug("query connection from %s dropped: %r", client_address[0], error)
            return
        logger.warning("query connection from %s failed: %s: %s", client_address[0], type(error).__name__, error)
        logger.debug("query connection failure", exc_info=error)

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self.serve_forever, name="stream-ops-query", daemon=True)
        self._thread.start()
        logger.info(
            "state queries served on %s://%s:%d (%s; at most %d connections, %g s per request)",
            "https" if self.tls else "http",
            *self.server_address[:2],
            "bearer token required" if self.token else "unauthenticated",
            self.limits.max_connections,
            self.limits.request_deadline_s,
        )

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        while self._lingering:
            self.close_request(self._lingering.popleft()[1])
