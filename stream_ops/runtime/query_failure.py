"""Why a task's Spark streaming query stopped, in one line."""

from __future__ import annotations

import re

from pyspark.sql.streaming import StreamingQuery

_RAISED = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception): ")


def query_failure(query: StreamingQuery) -> str | None:
    """The error ``query`` stopped with (at most 1,000 characters), None if it has none.

    A ``foreachBatch`` error comes wrapped in Py4J's and Spark's text; the Python one is named.
    """
    exc = query.exception()
    if exc is None:
        return None
    lines = str(exc).splitlines()
    raised = next((line for line in reversed(lines) if _RAISED.match(line)), None)
    return (raised or lines[0])[:1000]
