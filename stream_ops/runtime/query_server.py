"""The state-query endpoint each worker serves on its slot port (HTTP, JSON).

``GET /query?topology=<id>&task=<n>&keys=<json list of key lists>`` returns
``{"values": [...]}`` in key order. Requests are bounded in size; malformed ones get 400 and a
task that does not run here 404, so a client can re-route after a move.

With a token (:func:`stream_ops.config.query_token`), ``/query`` requires
``Authorization: Bearer <token>`` and answers 401 without it; ``/health`` stays open. With a TLS
context (:func:`server_tls_context`) every connection is TLS, its handshake made on the
connection's own thread under the same idle timeout as a request.
"""

from __future__ import annotations

import hmac
import json
import logging
import socket
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from stream_ops.errors import QueryTLSError

logger = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 64 * 1024
MAX_KEYS = 10_000

Lookup = Callable[[str, int, list[tuple[Any, ...]]], list[Any] | None]
"""(topology id, task id, keys) -> values, or None when the task does not run here."""


class _Handler(BaseHTTPRequestHandler):
    server: QueryServer
    #: Seconds a client may stay silent before its connection is closed (socketserver applies
    #: it to the socket): idle or slow connections must not hold a server thread forever.
    timeout = 10.0

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - signature from the base class
        logger.debug("query %s", format % args)

    def _reply(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode("utf-8")
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - name from the base class
        if len(self.path) > MAX_REQUEST_BYTES:
            self._reply(414, {"error": "request too large"})
            return
        url = urlparse(self.path)
        if url.path == "/health":
            self._reply(200, {"status": "ok"})
            return
        if url.path != "/query":
            self._reply(404, {"error": f"unknown path {url.path}"})
            return
        if not self._authorized():
            logger.warning("refused a state query from %s: missing or wrong bearer token", self.client_address[0])
            self._reply(
                401,
                {"error": "missing or wrong query token: send 'Authorization: Bearer <token>' "
                          "(pass --query-token-file or --zk-auth matching the cluster's)"},
                {"WWW-Authenticate": 'Bearer realm="stream-ops"'},
            )
            return
        params = parse_qs(url.query)
        try:
            topology_id = params["topology"][0]
            task_id = int(params["task"][0])
            keys = json.loads(params["keys"][0])
            if not isinstance(keys, list) or len(keys) > MAX_KEYS or not all(isinstance(k, list) for k in keys):
                raise ValueError(f"keys must be a JSON list of at most {MAX_KEYS} key lists")
        except (KeyError, IndexError, ValueError) as e:
            self._reply(400, {"error": f"bad query: {e}; expected topology, task and keys parameters"})
            return
        try:
            values = self.server.lookup(topology_id, task_id, [tuple(k) for k in keys])
        except Exception as e:  # noqa: BLE001 - report to the client instead of killing the thread
            logger.warning("query of %s/%d failed: %s", topology_id, task_id, e)
            self._reply(500, {"error": str(e)})
            return
        if values is None:
            self._reply(404, {"error": f"task {topology_id}/{task_id} does not run on this worker"})
            return
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
    """

    daemon_threads = True

    def __init__(
        self, host: str, port: int, lookup: Lookup, *, token: str | None = None, tls: ssl.SSLContext | None = None
    ) -> None:
        super().__init__((host, port), _Handler)
        self.lookup = lookup
        self.token = token
        self.tls = tls
        self._thread: threading.Thread | None = None

    def finish_request(self, request: Any, client_address: Any) -> None:
        """Handle one connection on its own thread, after its TLS handshake when serving TLS."""
        if self.tls is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(_Handler.timeout)
        try:
            connection = self.tls.wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError) as e:
            logger.debug("TLS handshake with %s failed: %s", client_address[0], e)
            return
        try:
            super().finish_request(connection, client_address)
        finally:
            self._close_tls(connection)

    @staticmethod
    def _close_tls(connection: ssl.SSLSocket) -> None:
        """Close a TLS connection as socketserver closes a plain one (half-close, then close)."""
        try:
            connection.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        connection.close()

    def start(self) -> None:
        self._thread = threading.Thread(target=self.serve_forever, name="stream-ops-query", daemon=True)
        self._thread.start()
        logger.info(
            "state queries served on %s://%s:%d (%s)", "https" if self.tls else "http", *self.server_address[:2],
            "bearer token required" if self.token else "unauthenticated",
        )

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
