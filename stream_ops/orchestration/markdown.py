"""Markdown tables of Dagster metadata, built from values the cluster does not control.

State keys and values, sink rows, error texts, worker ids and stage names reach the Dagster UI
as Markdown (``MetadataValue.md``), which the UI renders: a value holding ``|``, a newline,
``[text](url)``, ``![](...)``, HTML or a backtick would otherwise add columns, rows, links,
images or code to the page. :func:`cell` makes any value one literal table cell.

Example:
    >>> table(["key", "value"], [["a|b", "[x](http://evil)"]])
    '| key | value |\\n|---|---|\\n| a\\\\|b | \\\\[x\\\\](http://evil) |'
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

__all__ = ["cell", "table"]

#: Characters that start Markdown or HTML inside a table cell (emphasis, code, links, images,
#: HTML, entities, strikethrough, cell breaks), escaped with a backslash.
_SPECIAL = re.compile(r"([\\`*_\[\]!|~<>&])")
#: Control characters (ANSI escapes, NUL, ...), shown as their code instead of acted on.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")

#: Longest cell text, in characters of the value (before escaping).
CELL_LIMIT = 200


def cell(value: object, limit: int = CELL_LIMIT) -> str:
    """``value`` as the literal text of one Markdown table cell: one line, escaped, at most ``limit`` characters.

    Example:
        >>> cell("line 1\\nline 2 <b>bold</b>")
        'line 1 line 2 \\\\<b\\\\>bold\\\\</b\\\\>'
        >>> cell("x" * 300, limit=5)
        'xxxxx…'
    """
    text = " ".join(str(value).split())
    shortened = len(text) > limit
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text[:limit])
    return _SPECIAL.sub(r"\\\1", text) + ("…" if shortened else "")


def table(header: Sequence[str], rows: Iterable[Sequence[object]], align: Sequence[str] | None = None) -> str:
    """A Markdown table: ``header`` (our own text) and ``rows`` of any values, each cell escaped.

    Args:
        header: Column titles, written as given.
        rows: One sequence of values per row.
        align: Per column ``---``, ``---:`` or ``:---:``; default left-aligned.
    """
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align or ["---"] * len(header)) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
