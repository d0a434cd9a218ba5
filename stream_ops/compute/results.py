"""What a source batch produced, assembled from the rows its stage function yielded.

Whichever path computed them, the rows of :func:`~stream_ops.compute.stage_function.stage_rows`
are grouped as Spark's ``groupBy().agg()`` groups them (:func:`grouped_rows`, for the paths that
have them on the driver) and then read into one :class:`SourceBatchResult` (:func:`source_result`),
so every path gives the same outputs, partials, dead letters and input count.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from stream_ops.compute.stage_function import StageRows, output_plans, stage_rows, typed_partials
from stream_ops.operators.aggregators import CombinerAggregator, aggregator_from_spec
from stream_ops.operators.partials_combine import combine_partials
from stream_ops.operators.record_pipeline import needs_driver
from stream_ops.operators.window_partials import WindowPartials
from stream_ops.topology.plan import ShuffleSpec, StageSpec


@dataclass(frozen=True)
class SourceBatchResult:
    """What a source-stage batch produced, collected to the driver."""

    outputs: dict[int, list[Any]]
    """Stage output index -> its records (dicts), or for a partials output its (encoded key,
    partial aggregate) pairs. Empty when ``inputs`` is set."""
    dead_letters: list[dict[str, Any]]
    """{"record": ..., "error": ...} per bad record (repeated records repeated)."""
    input_rows: int
    inputs: list[dict[str, Any]] | None = None
    """The parsed input records, when the stage's operations must run on the driver."""
    window_partials: dict[int, WindowPartials] = field(default_factory=dict)
    """Stage output index -> the partials per (window, key) it sends an event-time window stage
    besides its whole records (:mod:`stream_ops.operators.window_partials`)."""


@dataclass(frozen=True)
class StageRun:
    """How a stage's function runs over a batch, the same on every path."""

    rows: StageRows
    """The stage's ``mapInArrow`` function."""
    typed: ShuffleSpec | None
    """The one output whose partials come out typed (:func:`~stream_ops.compute.stage_function.typed_partials`)."""
    aggregator: CombinerAggregator | None
    """That output's aggregator (None without a typed output)."""
    value_type: str
    """The type of the ``value`` column of the rows (``string`` without a typed output)."""


def stage_run(stage: StageSpec) -> StageRun:
    """The function a source stage runs over its batch: typed partials when Spark can combine
    them, else every output as JSON, or the parsed records themselves (``raw``) for a stage whose
    operations run on the driver."""
    typed = typed_partials(stage)
    if typed is not None:
        rows = stage_rows(stage.operations, output_plans(stage), "typed", typed.value_type)
        return StageRun(rows, typed, aggregator_from_spec(typed.aggregator), typed.value_type)
    mode = "raw" if needs_driver(stage.operations) else "outputs"
    return StageRun(stage_rows(stage.operations, output_plans(stage), mode, "string"), None, None, "string")


def grouped_rows(table: pa.Table, aggregator: CombinerAggregator | None) -> list[dict[str, Any]]:
    """The rows a stage function produced (``table``), grouped as Spark's ``groupBy().agg()``
    groups them for the Spark path: with ``aggregator`` (typed partials) by (``out``, ``key``,
    ``dead``), the values by the aggregator's Spark function with Spark's semantics
    (:func:`~stream_ops.operators.partials_combine.combine_partials`), ``n`` counting the rows,
    ``inputs`` summed; without, every row is one row with ``n`` = 1."""
    if aggregator is None:
        return [{**row, "n": 1} for row in table.to_pylist()]
    empty = dict.fromkeys(table.column_names)
    dead = pc.is_valid(table.column("dead"))
    letters = Counter(table.filter(dead).column("dead").to_pylist())
    rows = [{**empty, "dead": text, "n": n} for text, n in letters.items()]
    counts = table.filter(pc.is_valid(table.column("inputs"))).column("inputs").to_pylist()
    if counts:
        rows.append({**empty, "inputs": sum(counts), "n": len(counts)})
    keyed = table.filter(pc.and_(pc.is_valid(table.column("key")), pc.invert(dead)))
    for out in pc.unique(keyed.column("out")).to_pylist():
        group = keyed.filter(pc.equal(keyed.column("out"), out)).select(["key", "value"])
        partials, _ = combine_partials(group, aggregator)
        rows.extend({**empty, "out": out, "key": key, "value": value} for key, value in partials)
    return rows


def rows_on_this_thread(
    batches: Iterable[pa.RecordBatch], function: StageRows, aggregator: CombinerAggregator | None
) -> list[dict[str, Any]]:
    """The stage's ``function`` over ``batches`` on the calling thread, its rows grouped
    (:func:`grouped_rows`)."""
    produced = list(function(iter(batches)))
    return grouped_rows(pa.Table.from_batches(produced), aggregator) if produced else []


def source_result(rows: Sequence[Any], stage: StageSpec, run: StageRun) -> SourceBatchResult:
    """The batch's result from its grouped rows (dicts or Spark ``Row``s, each with its count ``n``)."""
    outputs: dict[int, list[Any]] = {index: [] for index in range(len(stage.outputs))}
    combined: dict[int, dict[str, Any]] = defaultdict(dict)
    raw: list[dict[str, Any]] = []
    dead_letters: list[dict[str, Any]] = []
    input_rows = 0
    for row in rows:
        if row["dead"] is not None:
            dead_letters.extend([json.loads(row["dead"])] * int(row["n"]))
        elif row["inputs"] is not None:
            input_rows += int(row["inputs"] or 0)
        elif row["out"] is None and row["record"] is not None:
            raw.append(json.loads(row["record"]))
        elif row["key"] is not None and run.typed is not None:
            outputs[row["out"]].append((row["key"], row["value"]))
        elif row["key"] is not None:
            # a partial pre-aggregated per Arrow batch: combine the batches' partials per key
            index, value = row["out"], json.loads(row["record"])
            aggregator = aggregator_from_spec(stage.outputs[index].aggregator)
            partial = combined[index]
            partial[row["key"]] = aggregator.combine(partial[row["key"]], value) if row["key"] in partial else value
        elif row["record"] is not None:
            outputs[row["out"]].append(json.loads(row["record"]))
    for index, partial in combined.items():
        outputs[index].extend(partial.items())
    if run.typed is None and needs_driver(stage.operations):
        return SourceBatchResult(outputs={}, dead_letters=dead_letters, input_rows=input_rows, inputs=raw)
    return SourceBatchResult(outputs=outputs, dead_letters=dead_letters, input_rows=input_rows)
