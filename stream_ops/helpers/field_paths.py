"""Field names and nested field paths (``user.id``), checked at definition time and read at run time.

A stream's fields have Spark SQL types: the scalars of :data:`SCALAR_TYPES`, or nested types
written as Spark DDL (``struct<id:long,name:string>``, ``map<string,long>``, ``array<string>``),
which a JSON source parses into nested records. Everywhere a field name is accepted, a dotted
path into a ``struct`` or ``map`` field is accepted too; its type is read from the struct's
DDL (``string`` for a map's or an unknown member).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from stream_ops.errors import TopologyDefinitionError

SCALAR_TYPES = ("string", "long", "int", "double", "float", "boolean")
_NESTED = re.compile(r"^(struct|map|array)<.*>$", re.DOTALL)


def is_known_type(typ: Any) -> bool:
    """Whether ``typ`` is a scalar type name or nested DDL (checked by Spark when it parses)."""
    return isinstance(typ, str) and (typ in SCALAR_TYPES or bool(_NESTED.match(typ.strip())))


def _struct_members(ddl: str) -> dict[str, str]:
    """``struct<a:long,b:struct<c:int>>`` -> {"a": "long", "b": "struct<c:int>"} (top level only)."""
    body = ddl.strip()[len("struct<") : -1]
    members: dict[str, str] = {}
    depth, start = 0, 0
    for i, ch in enumerate(body + ","):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "," and depth == 0:
            name, _, typ = body[start:i].partition(":")
            if name.strip():
                members[name.strip().strip("`")] = typ.strip()
            start = i + 1
    return members


def path_type(fields: Mapping[str, str], name: str, what: str) -> str:
    """The type of field ``name`` (a field, or a dotted path into a struct or map field).

    Raises:
        TopologyDefinitionError: the field is unknown, or a path steps into a field that is
            neither a struct nor a map, or into a struct member that does not exist.
    """
    if name in fields:
        return fields[name]
    head, *rest = name.split(".")
    if head not in fields or not rest:
        raise TopologyDefinitionError(f"{what}: unknown field {name!r}; the stream has {list(fields)}")
    typ = fields[head]
    walked = head
    for part in rest:
        stripped = typ.strip()
        if stripped.startswith("struct<"):
            members = _struct_members(stripped)
            if part not in members:
                raise TopologyDefinitionError(f"{what}: {walked!r} ({stripped}) has no member {part!r}")
            typ = members[part]
        elif stripped.startswith("map<"):
            typ = "string"
        else:
            raise TopologyDefinitionError(
                f"{what}: field {name!r} steps into {walked!r}, a {stripped} field; only struct and map fields "
                "have members (declare it as struct<...> in the schema)"
            )
        walked = f"{walked}.{part}"
    return typ


def value_at(record: Mapping[str, Any], name: str) -> Any:
    """``record[name]``, or the value at a dotted path through nested mappings (None where a
    step is missing). A top-level field whose name has dots (a JoinBolt's ``a.b`` output) wins.

    Raises:
        KeyError: a plain field name the record does not have.
    """
    if "." not in name or name in record:
        return record[name]
    return lookup(record, name.split("."))


def lookup(record: Mapping[str, Any] | None, path: Sequence[str]) -> Any:
    """The value at ``path`` in nested mappings, or ``None`` when any step is missing."""
    current: Any = record
    for part in path:
        if not isinstance(current, Mapping):
            return None
        current = current.get(part)
        if current is None:
            return None
    return current


def value_or_none(record: Mapping[str, Any], name: str) -> Any:
    """:func:`value_at`, but None for a missing field too."""
    try:
        return value_at(record, name)
    except KeyError:
        return None
