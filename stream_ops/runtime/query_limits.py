"""What one worker's query server grants its clients: connection slots, time, header bytes, log lines.

Shared by the server and the parts it is made of (:mod:`~stream_ops.runtime.query_admission`
among them), and set by operators through ``WorkerSettings.query_limits``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


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
