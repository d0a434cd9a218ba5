"""What the query server logs about its clients: their text cut and escaped, their lines rationed.

Anything a client sent (a path, a header, an error it caused) goes into a log line through
:func:`loggable`, and every such line through a :class:`LogBudget`, so that no client can forge
log lines, reach an operator's terminal or fill the disk.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

#: Characters of anything a client sent (a path, a header) that go into a log line or an error.
LOGGED_CHARS = 200


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


class LogBudget:
    """At most ``lines`` log lines per ``interval_s`` about one kind of client; the rest counted.

    A line over the budget is dropped and counted; when the interval ends (noticed by the next
    line or by :meth:`flush`), one line says how many were dropped.

    Args:
        who: The kind of client, as the line about dropped lines names it ("without the query token").
        lines: Lines logged at most per interval.
        interval_s: The interval, in seconds.
        log: The logger the lines go to (the query server's, whose name operators configure).
    """

    def __init__(self, who: str, lines: int, interval_s: float, *, log: logging.Logger) -> None:
        self._logger = log
        self._who = who
        self._lines = lines
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._window_end = float("-inf")
        self._used = 0
        self._suppressed = 0

    def log(self, level: int, message: str, *args: Any) -> None:
        """Log ``message % args`` at ``level`` if the interval's budget allows, else count it."""
        if not self._logger.isEnabledFor(level):
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
            self._logger.log(level, message, *args)

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
        self._logger.warning(
            "query server: %d more log line(s) about requests %s suppressed (at most %d per %g s)",
            suppressed,
            self._who,
            self._lines,
            self._interval_s,
        )


@dataclass(frozen=True)
class LogBudgets:
    """The log budget of clients without the token and that of clients with it."""

    anonymous: LogBudget
    authenticated: LogBudget
