"""The raw contents of a RocksDB store, for tests that compare restores byte for byte."""

from __future__ import annotations

from pathlib import Path

from rocksdict import Options, Rdict


def raw_items(path: Path) -> list[tuple[bytes, bytes]]:
    """Every (key, value) of the closed store at ``path`` as raw bytes, in key order, marker included."""
    db = Rdict(str(path), Options(raw_mode=True))
    try:
        return list(db.items())
    finally:
        db.close()
