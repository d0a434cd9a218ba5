"""Which connections the query server takes on: pending and served slots, and the refused.

A new connection takes a *pending* slot (capped in all and per peer address, the oldest of the
peer holding the most evicted when all are taken) until its token is checked, then a *served*
one (:class:`Admission`). A connection refused a slot is answered ``503`` at once, counted and
reported at most every ``_REFUSAL_LOG_EVERY_S`` (:class:`RefusedConnections`).
"""

from __future__ import annotations

import collections
import ipaddress
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from stream_ops.runtime.query_limits import QueryLimits
from stream_ops.runtime.query_log import loggable

#: Refused connections kept half-closed at most this long, so the client reads its 503 before
#: the close (closing with unread request bytes would reset the connection and lose the answer).
_LINGER_S = 1.0
#: Refused connections lingering at once; beyond that they are closed at once.
_MAX_LINGERING = 32
#: Seconds between two log lines about refused connections.
_REFUSAL_LOG_EVERY_S = 10.0


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
class Ticket:
    """One connection's slot: pending until its token is checked, then served."""

    peer: str
    deadline: float
    sock: socket.socket
    served: bool = False
    evicted: bool = False


Refusal = Literal["peer", "full"]
"""Why a connection gets no slot: its peer holds its cap, or all are taken and no peer holds more than its own."""


class Admission:
    """The pending and served slots of a server's connections (thread-safe).

    A pending ticket's socket is shut down only under the lock and only while the ticket is
    pending: a handler releases its ticket before it closes the socket, so a shutdown never
    reaches a file descriptor the kernel gave to another connection meanwhile.

    Args:
        limits: The caps on pending slots (in all and per peer) and served ones, and the deadline.
    """

    def __init__(self, limits: QueryLimits) -> None:
        self._limits = limits
        self._lock = threading.Lock()
        self._pending: dict[Ticket, None] = {}  # oldest first
        self._per_peer: collections.Counter[str] = collections.Counter()
        self._served = 0
        self.evictions = 0

    @property
    def pending(self) -> int:
        """Connections holding a pending slot."""
        return len(self._pending)

    @property
    def served(self) -> int:
        """Connections holding a served slot."""
        return self._served

    def admit(self, sock: socket.socket, peer: str) -> Ticket | Refusal:
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
            ticket = Ticket(peer, time.monotonic() + limits.auth_deadline_s, sock)
            self._pending[ticket] = None
            self._per_peer[peer] += 1
            return ticket

    def track(self, ticket: Ticket, sock: socket.socket) -> bool:
        """Follow the connection's new socket (TLS); False if it was evicted meanwhile."""
        with self._lock:
            ticket.sock = sock
            return not ticket.evicted

    def promote(self, ticket: Ticket) -> Literal["served", "evicted", "full"]:
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

    def release(self, ticket: Ticket) -> None:
        """Give back whichever slot the connection holds (before its socket is closed)."""
        with self._lock:
            if ticket in self._pending:
                self._unpend(ticket)
            elif ticket.served:
                ticket.served = False
                self._served -= 1

    def _unpend(self, ticket: Ticket) -> None:
        if ticket not in self._pending:
            return
        del self._pending[ticket]
        self._per_peer[ticket.peer] -= 1
        if not self._per_peer[ticket.peer]:
            del self._per_peer[ticket.peer]

    def _evict(self, ticket: Ticket) -> None:
        self._unpend(ticket)
        ticket.evicted = True
        self.evictions += 1
        try:
            # The plain socket method: an SSLSocket's own shutdown would unwrap its TLS
            # object under its handler thread.
            socket.socket.shutdown(ticket.sock, socket.SHUT_RDWR)
        except OSError:
            pass  # a socket being wrapped in TLS: its handler sees ``evicted`` when it tracks it


class RefusedConnections:
    """The connections refused a slot: counted, reported, and those answered kept a moment.

    Args:
        limits: The server's limits, which the answers and the report name.
        admission: The server's slots, whose use the report gives.
        log: The logger the report goes to (the query server's, whose name operators configure).
        close: Closes a connection (the server's ``close_request``).
    """

    def __init__(
        self, limits: QueryLimits, admission: Admission, *, log: logging.Logger, close: Callable[[socket.socket], None]
    ) -> None:
        self._limits = limits
        self._admission = admission
        self._logger = log
        self._close = close
        self._lingering: collections.deque[tuple[float, socket.socket]] = collections.deque()
        self.count = 0
        """Connections refused since the start."""
        self._unreported = 0
        self._reported_at = float("-inf")
        self._lock = threading.Lock()

    def note(self, client_address: Any) -> None:
        """Count a refused connection; log the count at most every ``_REFUSAL_LOG_EVERY_S``."""
        now = time.monotonic()
        with self._lock:
            self.count += 1
            self._unreported += 1
            if now - self._reported_at < _REFUSAL_LOG_EVERY_S:
                return
            refused, self._unreported, self._reported_at = self._unreported, 0, now
        limits = self._limits
        self._logger.warning(
            "query server busy: refused %d connection(s) since the last report (latest from %s): %d pending of at most %d "
            "(%d per peer), %d served of at most %d; raise QueryLimits.max_pending / max_connections if legitimate "
            "clients need more",
            refused,
            loggable(str(client_address[0])),
            self._admission.pending,
            limits.max_pending,
            limits.max_pending_per_peer,
            self._admission.served,
            limits.max_connections,
        )

    def answer(self, request: socket.socket, why: Refusal) -> None:
        """Answer 503 without blocking, then half-close the connection or close it (accepting thread)."""
        if why == "peer":
            message = f"{self._limits.max_pending_per_peer} connections from your address are still sending their request; retry shortly"
        else:
            message = f"the query server is handling its limit of {self._limits.max_pending} new connections; retry shortly"
        try:
            request.setblocking(False)
            request.send(_refusal(message))
            request.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(request)
            return
        if len(self._lingering) >= _MAX_LINGERING:
            self._close(request)
            return
        self._lingering.append((time.monotonic() + _LINGER_S, request))

    def close_lingering(self, now: float) -> None:
        """Close the answered connections whose client had time to read the 503 (accepting thread)."""
        while self._lingering and self._lingering[0][0] <= now:
            _, sock = self._lingering.popleft()
            self._close(sock)

    def close_all(self) -> None:
        """Close every answered connection still lingering (the server stopped)."""
        while self._lingering:
            self._close(self._lingering.popleft()[1])


def _refusal(message: str) -> bytes:
    """The whole 503 response sent to a connection refused by the accepting thread."""
    body = json.dumps({"error": message}).encode("utf-8")
    head = (
        "HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body
