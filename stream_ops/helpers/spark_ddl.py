"""Spark DDL of a stream's fields."""

from __future__ import annotations

from collections.abc import Mapping


def schema_ddl(fields: Mapping[str, str]) -> str:
    """Spark DDL such as ``sentence string, n long``.

    Example:
        >>> schema_ddl({"sentence": "string", "n": "long"})
        '`sentence` string, `n` long'
    """
    return ", ".join(f"`{name}` {typ}" for name, typ in fields.items())
