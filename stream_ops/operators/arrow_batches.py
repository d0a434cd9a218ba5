"""``map_batches``: a user function over whole Arrow record batches, with bad rows isolated.

``fn(pyarrow.RecordBatch) -> pyarrow.RecordBatch | pyarrow.Table`` may return any number of
rows; its result must have the declared fields (extra columns are dropped, types are cast
safely). When ``fn`` raises, or returns something that does not fit, the batch is split in
halves and each half tried again, down to single rows: the rows that still fail go to the
dead letters with the error, every other row's output comes out once. So ``fn`` must be a
function of its rows (the output for a batch is the outputs for its parts, concatenated).

Example:
    >>> import pyarrow as pa, pyarrow.compute as pc
    >>> def words(batch):
    ...     return pa.table({"word": pc.list_flatten(pc.split_pattern(batch["sentence"], " "))})
    >>> out, dead = apply_isolating(words, pa.record_batch({"sentence": ["a b", "c"]}), pa.schema({"word": pa.string()}), "words")
    >>> out[0].to_pydict(), dead
    ({'word': ['a', 'b', 'c']}, [])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from stream_ops.arrow_types import ARROW_TYPES

BatchFunction = Callable[[pa.RecordBatch], Any]


def arrow_schema(fields: dict[str, str]) -> pa.Schema:
    """The Arrow schema of declared ``map_batches`` output fields (scalar types only)."""
    return pa.schema([(name, ARROW_TYPES[typ]) for name, typ in fields.items()])


def conform(result: Any, schema: pa.Schema) -> pa.RecordBatch:
    """``result`` as one record batch of ``schema`` (columns selected by name, cast safely).

    Raises:
        ValueError: not a RecordBatch or Table, a declared column missing, or a value that
            does not cast.
    """
    if isinstance(result, pa.RecordBatch):
        table = pa.Table.from_batches([result])
    elif isinstance(result, pa.Table):
        table = result
    else:
        raise ValueError(f"returned a {type(result).__name__}, not a pyarrow.RecordBatch or Table")
    missing = [name for name in schema.names if name not in table.column_names]
    if missing:
        raise ValueError(f"returned columns {table.column_names}, missing the declared {missing}")
    try:
        table = table.select(schema.names).cast(schema, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise ValueError(f"returned values that do not fit {schema}: {e}") from e
    return table.combine_chunks().to_batches()[0] if table.num_rows else pa.RecordBatch.from_pylist([], schema=schema)


def apply_isolating(
    fn: BatchFunction, batch: pa.RecordBatch, schema: pa.Schema, ref: str
) -> tuple[list[pa.RecordBatch], list[dict[str, Any]]]:
    """``fn`` over ``batch``: (output batches, dead letters ``{"record", "error"}``)."""
    try:
        return [conform(fn(batch), schema)], []
    except Exception as e:  # noqa: BLE001 - user code may raise anything; bad rows are isolated
        if batch.num_rows <= 1:
            rows = batch.to_pylist()
            return [], [{"record": row, "error": f"map_batches {ref}: {type(e).__name__}: {e}"} for row in rows]
    middle = batch.num_rows // 2
    first = apply_isolating(fn, batch.slice(0, middle), schema, ref)
    second = apply_isolating(fn, batch.slice(middle), schema, ref)
    return first[0] + second[0], first[1] + second[1]
