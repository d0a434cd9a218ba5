"""Pure parts of the query server's limits: JSON depth before parsing, the open-files limit,
the peer a connection counts against, escaped log text, the pending and served slots, the log
budget."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys

import pytest

from stream_ops.runtime import query_server
from stream_ops.runtime.query_admission import peer_of
from stream_ops.runtime.query_log import loggable
from stream_ops.runtime.query_request import json_depth_exceeds
from stream_ops.runtime.query_server import QueryLimits


@pytest.mark.parametrize(
    ("text", "limit", "exceeds"),
    [
        ('[["the"], ["cow"]]', 2, False),
        ("[[[1]]]", 2, True),
        ("[" * 30_000 + "]" * 30_000, 16, True),
        ('[["[[[[[", "{{{{"]]', 2, False),  # brackets in strings do not nest
        ('[["a\\"[[[["]]', 2, False),  # nor after an escaped quote
        ('[{"a": [1]}]', 2, True),
        ("not json [[[", 2, True),  # judged by brackets; the parser rejects it anyway
    ],
)
def test_json_depth_is_judged_without_parsing(text: str, limit: int, exceeds: bool) -> None:
    assert json_depth_exceeds(text, limit) is exceeds


def test_query_limits_validate() -> None:
    limits = QueryLimits()
    assert (limits.max_connections, limits.max_pending, limits.max_pending_per_peer) == (64, 32, 8)
    assert (limits.auth_deadline_s, limits.max_header_lines, limits.max_header_bytes) == (2.0, 32, 8192)
    assert (limits.log_lines, limits.log_interval_s) == (20, 60.0)
    for wrong in (
        {"max_connections": 0},
        {"request_deadline_s": 0},
        {"max_pending": 0},
        {"auth_deadline_s": 0},
        {"max_header_bytes": 10},
    ):
        with pytest.raises(ValueError):
            QueryLimits(**wrong)


@pytest.mark.parametrize(
    ("address", "peer"),
    [
        (("192.0.2.7", 5000), "192.0.2.7"),
        (("2001:db8:1:2:aaaa::1", 5000, 0, 0), "2001:db8:1:2::/64"),
        (("2001:db8:1:2:bbbb::9", 5000, 0, 0), "2001:db8:1:2::/64"),  # same /64: one peer
        (("::ffff:192.0.2.7", 5000, 0, 0), "192.0.2.7"),
        (("not an address", 1), "not an address"),
    ],
)
def test_a_connection_counts_against_its_address_or_its_ipv6_slash_64(address: tuple[object, ...], peer: str) -> None:
    assert peer_of(address) == peer


def test_what_a_client_sent_is_logged_cut_and_escaped() -> None:
    assert loggable("/health") == "/health"
    shown = loggable("/\x1b[2J\r\nERROR forged line\x07\x9b\u2028" + "x" * 100_000)
    assert shown.isprintable() and len(shown) < 250
    assert shown.startswith("/\\x1b[2J\\r\\nERROR forged line\\x07\\x9b\\u2028") and shown.endswith("(100027 characters)")


def test_a_full_pending_pool_evicts_the_oldest_of_the_peer_holding_most() -> None:
    admission = query_server._Admission(QueryLimits(max_connections=1, max_pending=4, max_pending_per_peer=3))
    pairs = [socket.socketpair() for _ in range(7)]
    try:
        socks = iter(ours for ours, _ in pairs)
        tickets = [admission.admit(next(socks), peer) for peer in ("a", "a", "a", "b")]
        assert all(isinstance(t, query_server._Ticket) for t in tickets)
        a1, a2, a3, b1 = tickets
        assert admission.admit(next(socks), "a") == "peer"  # a holds its 3
        c1 = admission.admit(next(socks), "c")  # all 4 taken: a holds the most, its oldest goes
        assert isinstance(c1, query_server._Ticket) and a1.evicted and not a2.evicted
        assert a1.sock.recv(1) == b""  # shut down: its handler reads the end
        assert admission.evictions == 1 and admission.pending == 4
        assert admission.admit(next(socks), "a") == "full"  # a holds 2, as many as anyone: nobody is evicted for it
        # Promotion frees the pending slot; the served slots have their own cap.
        assert admission.promote(b1) == "served" and (admission.pending, admission.served) == (3, 1)
        assert admission.promote(c1) == "full" and (admission.pending, admission.served) == (2, 1)
        assert admission.promote(a1) == "evicted"
        for ticket in (a1, a2, a3, b1, c1):
            admission.release(ticket)
            admission.release(ticket)  # twice: no slot is given back twice
        assert (admission.pending, admission.served) == (0, 0)
    finally:
        for ours, theirs in pairs:
            ours.close()
            theirs.close()


def test_the_log_budget_drops_lines_over_it_and_counts_them(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="stream_ops.runtime.query_server")
    budget = query_server._LogBudget("without the query token", lines=3, interval_s=60.0)
    for i in range(10):
        budget.log(logging.INFO, "line %d", i)
    budget.log(logging.DEBUG, "not logged, not counted")
    assert [r.getMessage() for r in caplog.records] == ["line 0", "line 1", "line 2"]
    budget.flush(now=float("inf"))
    assert caplog.records[-1].getMessage() == (
        "query server: 7 more log line(s) about requests without the query token suppressed (at most 3 per 60 s)"
    )


def test_the_open_files_soft_limit_is_raised_to_the_hard_limit() -> None:
    script = (
        "import resource\n"
        "from stream_ops.runtime.process_limits import raise_open_files_limit\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))\n"
        "now = raise_open_files_limit()\n"
        "assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == now\n"
        "print(now == (hard if hard != resource.RLIM_INFINITY else 1 << 20), raise_open_files_limit() == now)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["True", "True"]
