"""Path 1: a source batch read in Arrow, computed on the driver's thread (no Spark job).

The batch (:mod:`stream_ops.compute.arrow_read`: its files read, its SQL operations done) is
counted per key by one ``Table.group_by`` when nothing runs per record; a batch for an
event-time window stage goes partly as partials per (window, key)
(:mod:`stream_ops.operators.window_partials`); any other is handed to the stage's function on
this thread, as a batch collected to the driver is.
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from stream_ops.compute.results import SourceBatchResult, rows_on_this_thread, source_result, stage_run
from stream_ops.compute.stage_function import HEAD_OPERATIONS, count_output, run_batch_operations, window_partials_output
from stream_ops.hashing import encode_key
from stream_ops.operators.arrow_batches import arrow_schema
from stream_ops.operators.record_pipeline import BATCH_OPERATIONS
from stream_ops.operators.window_partials import lateness_threshold, split_window_partials
from stream_ops.topology.functions import resolve_function
from stream_ops.topology.plan import StageSpec
from stream_ops.topology.windows import WindowDef


def arrow_batch(
    batches: list[pa.RecordBatch], stage: StageSpec, *, sent_before: Mapping[int, float | None] | None = None
) -> SourceBatchResult:
    """The source batch ``batches`` (read in Arrow, :func:`~stream_ops.compute.arrow_read.table_batches`)
    counted per key in Arrow when the stage's operations are all SQL or batch functions, sent
    partly as partials per (window, key) to an event-time window stage when ``sent_before`` is
    known (:func:`_window_partials`), else the stage's function over it on this thread.

    ``sent_before``: per window stage index, the largest event time this task sent it in its
    batches before this one (None: none), or None when that is not known."""
    counted = _arrow_partials(batches, stage)
    if counted is not None:
        return counted
    windowed = _window_partials(batches, stage, sent_before)
    if windowed is not None:
        return windowed
    run = stage_run(stage)
    return source_result(rows_on_this_thread(batches, run.rows, run.aggregator), stage, run)


def _window_partials(
    batches: list[pa.RecordBatch], stage: StageSpec, sent_before: Mapping[int, float | None] | None
) -> SourceBatchResult | None:
    """The batch with its records that cannot be late at the window stage
    (:func:`~stream_ops.operators.window_partials.lateness_threshold`) aggregated per (window,
    key) in Arrow, and the others through the stage's function as whole records; None when the
    stage does not feed such a window stage, the bound is not known or the batch cannot be cut
    exactly."""
    output = window_partials_output(stage)
    if output is None or sent_before is None or not batches:
        return None
    assert output.window_partials is not None
    window = WindowDef.from_spec(output.window_partials["window"])
    split = split_window_partials(
        pa.Table.from_batches(batches),
        window=window,
        key_fields=output.key_fields,
        aggregator=output.window_partials["aggregator"],
        threshold=lateness_threshold(sent_before.get(output.to_stage), window.lag),
    )
    if split is None:
        return None
    run = stage_run(stage)
    whole = split.whole.combine_chunks().to_batches() if split.whole.num_rows else []
    result = source_result(rows_on_this_thread(whole, run.rows, run.aggregator), stage, run)
    return dataclasses.replace(result, input_rows=result.input_rows + split.partials.records, window_partials={0: split.partials})


def _arrow_partials(batches: list[pa.RecordBatch], stage: StageSpec) -> SourceBatchResult | None:
    """The batch's partial counts per key by one ``Table.group_by`` over the output of the
    stage's batch functions (run per batch, bad rows isolated as in Spark's workers), when
    nothing runs per record; keys encoded as the Python path encodes them."""
    output = count_output(stage, HEAD_OPERATIONS)
    if output is None or not batches:
        return None
    keys = list(output.key_fields)
    operations = [
        (op, resolve_function(op.function, scope=op.code), arrow_schema(op.out))
        for op in stage.operations
        if op.kind in BATCH_OPERATIONS
    ]
    schema = operations[-1][2] if operations else batches[0].schema
    if any(k not in schema.names or pa.types.is_nested(schema.field(k).type) for k in keys):
        return None  # the Python path dead-letters what it cannot key
    input_rows = sum(batch.num_rows for batch in batches)
    letters: list[dict[str, Any]] = []
    if operations:
        produced = []
        for batch in batches:
            out, dead = run_batch_operations(batch, operations)
            produced.append(out)
            letters += [json.loads(json.dumps(letter, default=str)) for letter in dead]
        batches = produced
    grouped = pa.Table.from_batches(batches, schema=schema).select(keys).group_by(keys).aggregate([([], "count_all")])
    counts: dict[str, int] = defaultdict(int)
    values = zip(*(grouped.column(k).to_pylist() for k in keys), strict=True)
    for key_values, n in zip(values, grouped.column("count_all").to_pylist(), strict=True):
        counts[encode_key(list(key_values))] += n  # merges keys that encode alike (0.0 and -0.0)
    return SourceBatchResult({0: list(counts.items())}, letters, input_rows)
