"""The lines of a text file, as a JSON-lines reader counts them."""

from __future__ import annotations

from pathlib import Path


def count_lines(path: Path) -> int:
    """Lines of a text file: its newlines, plus one for a last line without one."""
    lines = 0
    last = b"\n"
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return lines + (last != b"\n")
