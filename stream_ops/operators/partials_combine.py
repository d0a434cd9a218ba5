"""Combine a keyed batch's shuffled partial aggregates per key in Arrow, on the driver.

What a keyed stage's ``groupBy("key").agg(<spark_function>("value"))`` computes, without a
Spark job: ``Table.group_by("key").aggregate`` for the built-in combiners (and user combiners
that name a ``spark_function``), with Spark's semantics (nulls skipped, null when a key has no
non-null partial, a ``max`` over floats is NaN when one partial is), and the aggregator's own
``combine`` per row for every other combiner. Rows with a null key are counted as read and
dropped, as Spark's grouping does.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from stream_ops.operators.aggregators import CombinerAggregator

Partials = list[tuple[str, Any]]


def combine_partials(table: pa.Table, aggregator: CombinerAggregator) -> tuple[Partials, int]:
    """((encoded key, combined partial) per key, rows read) of a ``key``/``value`` table."""
    rows = table.num_rows
    spark_function = aggregator.spark_function
    if spark_function is None:
        return _combine_rows(table, aggregator), rows
    aggregations: list[tuple[str, str]] = [("value", spark_function)]
    value_type = table.schema.field("value").type
    nan_wins = spark_function == "max" and pa.types.is_floating(value_type)
    if nan_wins:  # Spark orders NaN above every number; Arrow's max skips it
        table = table.append_column("nan", pc.is_nan(table.column("value")))
        aggregations.append(("nan", "any"))
    grouped = table.group_by("key", use_threads=False).aggregate(aggregations)
    values = grouped.column(f"value_{spark_function}")
    if nan_wins:
        values = pc.if_else(pc.fill_null(grouped.column("nan_any"), False), pa.scalar(float("nan"), values.type), values)
    keys = grouped.column("key").to_pylist()
    return [(k, v) for k, v in zip(keys, values.to_pylist(), strict=True) if k is not None], rows


def _combine_rows(table: pa.Table, aggregator: CombinerAggregator) -> Partials:
    """A user combiner's partials combined with its ``combine``, in row order."""
    combined: dict[str, Any] = {}
    for key, value in zip(table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True):
        if key is None:
            continue
        combined[key] = aggregator.combine(combined[key], value) if key in combined else value
    return list(combined.items())
