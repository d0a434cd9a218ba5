"""The state-query endpoint each worker serves on its slot port (HTTP, JSON).

``GET /query?topology=<id>&task=<n>&keys=<json list of key lists>`` returns
``{"values": [...]}`` in key order. Requests are bounded in size; malformed ones get 400 and a
task that does not run here 404, so a client can re-route after a move.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

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

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode("utf-8")
        self.send_response(status)
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


class QueryServer(ThreadingHTTPServer):
    """HTTP server answering state queries for the tasks of one worker."""

    daemon_threads = True

    def __init__(self, host: str, port: int, lookup: Lookup) -> None:
        super().__init__((host, port), _Handler)
        self.lookup = lookup
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.serve_forever, name="stream-ops-query", daemon=True)
        self._thread.start()
        logger.info("state queries served on %s:%d", *self.server_address[:2])

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
