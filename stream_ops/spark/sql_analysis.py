"""Definition-time analysis of Spark SQL operations (``select_expr``, ``where``).

Spark's own analyser decides the output fields and types of an expression list, on an empty
DataFrame of the input fields in a local session: no data is read and no cluster is asked.
The process's active SparkSession is used when there is one, else a small local one is
started once. Results are cached on disk (``$STREAM_OPS_CACHE`` or ``~/.cache/stream_ops``,
keyed by the Spark version, the input fields and the expressions), so a Dagster code location
that loads the same topologies again does not start Spark again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from stream_ops.errors import TopologyDefinitionError

logger = logging.getLogger(__name__)

SqlKind = Literal["select_expr", "where"]

_TOP_LEVEL = {
    "string": "string",
    "bigint": "long",
    "int": "int",
    "smallint": "int",
    "tinyint": "int",
    "double": "double",
    "float": "float",
    "boolean": "boolean",
}
_LOCK = threading.Lock()


def analyse(fields: Mapping[str, str], kind: SqlKind, exprs: Sequence[str], what: str) -> dict[str, str]:
    """The fields (name -> type) after ``selectExpr(*exprs)`` or ``where(exprs[0])`` on a
    stream of ``fields``.

    Raises:
        TopologyDefinitionError: an expression that does not parse or analyse (an unknown
            column, a type error, a non-boolean condition), naming it, or an output type
            stream_ops cannot carry.
    """
    if not exprs or not all(isinstance(e, str) and e.strip() for e in exprs):
        raise TopologyDefinitionError(f"{what}: give one or more SQL expressions as non-empty strings")
    import pyspark

    key = hashlib.sha256(json.dumps([pyspark.__version__, dict(fields), kind, list(exprs)]).encode()).hexdigest()
    cached = _read_cache(key)
    if cached is not None:
        return cached
    result = _analyse_in_spark(fields, kind, exprs, what)
    _write_cache(key, result)
    return result


def _analyse_in_spark(fields: Mapping[str, str], kind: SqlKind, exprs: Sequence[str], what: str) -> dict[str, str]:
    from pyspark.errors import PySparkException
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession() or _local_session()
    ddl = ", ".join(f"`{name}` {typ}" for name, typ in fields.items())
    try:
        empty = spark.createDataFrame([], ddl)
        out = empty.selectExpr(*exprs) if kind == "select_expr" else empty.where(exprs[0])
        schema = out.schema
    except PySparkException as e:
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        shown = ", ".join(repr(x) for x in exprs)
        raise TopologyDefinitionError(f"{what}: Spark cannot analyse {shown} over fields {dict(fields)}: {first_line}") from None
    types: dict[str, str] = {}
    for field in schema.fields:
        simple = field.dataType.simpleString()
        mapped = _TOP_LEVEL.get(simple) or (simple if simple.split("<")[0] in ("struct", "array", "map") else None)
        if mapped is None:
            raise TopologyDefinitionError(
                f"{what}: output field {field.name!r} is {simple}, which stream_ops does not carry between stages; "
                "cast it to string, long, double or boolean in the expression"
            )
        if field.name in types:
            raise TopologyDefinitionError(f"{what}: two expressions give the field {field.name!r}; name one with AS")
        types[field.name] = mapped
    return types


def _local_session():
    from stream_ops.spark.session import create_spark_session

    logger.info("starting a local SparkSession to analyse SQL operations (cached after the first time)")
    return create_spark_session(master="local[1]", app_name="stream-ops-analysis")


def _cache_file() -> Path:
    root = os.environ.get("STREAM_OPS_CACHE") or str(Path.home() / ".cache" / "stream_ops")
    return Path(root) / "sql-analysis.json"


def _read_cache(key: str) -> dict[str, str] | None:
    try:
        found = json.loads(_cache_file().read_text(encoding="utf-8")).get(key)
    except (OSError, ValueError):
        return None
    return dict(found) if isinstance(found, dict) else None


def _write_cache(key: str, result: dict[str, str]) -> None:
    path = _cache_file()
    with _LOCK:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                cache = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                cache = {}
            cache[key] = result
            temporary = path.with_suffix(f".{os.getpid()}.tmp")
            temporary.write_text(json.dumps(cache), encoding="utf-8")
            temporary.replace(path)
        except OSError as e:  # a read-only home: analysis still works, only uncached
            logger.debug("could not cache the SQL analysis in %s: %s", path, e)
