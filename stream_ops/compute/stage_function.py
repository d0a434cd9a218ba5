"""A source stage's ``mapInArrow`` function: its operations and partial aggregation over Arrow batches.

Every path a source batch takes (:mod:`stream_ops.compute.decision`) runs this same function:
in Spark's Python workers (``mapInArrow``), on the driver's thread, or in local row processes.
It yields rows of one schema (``out``, ``key``, ``value``, ``dead``, ``inputs``, ``record``):
per output its records or pre-aggregated partials, bad records as dead letters, and one row
per Arrow batch with its input count (:mod:`stream_ops.compute.results` turns them into a
:class:`~stream_ops.compute.results.SourceBatchResult`).
"""

from __future__ import annotations

import json
import operator
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from stream_ops.arrow_types import ARROW_TYPES
from stream_ops.hashing import encode_key
from stream_ops.helpers.field_paths import value_at
from stream_ops.operators.aggregators import aggregator_from_spec
from stream_ops.operators.arrow_batches import apply_isolating, arrow_schema
from stream_ops.operators.record_pipeline import (
    BATCH_OPERATIONS,
    SQL_OPERATIONS,
    ColumnValues,
    RecordPipeline,
    needs_driver,
)
from stream_ops.sources import CORRUPT_COLUMN
from stream_ops.topology.functions import resolve_function
from stream_ops.topology.plan import OperationSpec, RecordsSpec, ShuffleSpec, StageSpec

HEAD_OPERATIONS = SQL_OPERATIONS + BATCH_OPERATIONS

UNPARSED_ERROR = "does not parse against the source schema"
"""The dead-letter error of an input line that does not parse (its text is the record)."""

StageRows = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]
"""A source stage's ``mapInArrow`` function (:func:`stage_rows`)."""

ROW_COLUMNS = "out int, key string, value {}, dead string, inputs long, record string"
"""The Spark DDL of the rows :func:`stage_rows` yields (``value``'s type filled in)."""

_MISSING = object()


@dataclass(frozen=True)
class OutputPlan:
    """What the executors compute for one stage output."""

    index: int
    tap: int
    key_fields: tuple[str, ...] | None
    """Key fields of a partials output (pre-aggregated per key); None: whole records."""
    aggregator: dict[str, Any] | None


def output_plans(stage: StageSpec) -> list[OutputPlan]:
    """What the executors compute for each of the stage's outputs, in output order."""
    plans = []
    for index, output in enumerate(stage.outputs):
        tap = stage.tap_of(output)
        if isinstance(output, ShuffleSpec):
            plans.append(OutputPlan(index, tap, output.key_fields, output.aggregator))
        else:
            plans.append(OutputPlan(index, tap, None, None))
    return plans


def _combine_into(partial: dict[Any, Any], aggregator: Any, key_values: tuple[Any, ...], value: Any) -> None:
    """Combine ``value`` into ``partial[key]`` (keys that cannot be hashed are encoded)."""
    try:
        slot: Any = key_values
        previous = partial.get(slot, _MISSING)
    except TypeError:  # unhashable key values (lists, dicts)
        slot = encode_key(list(key_values))
        previous = partial.get(slot, _MISSING)
    partial[slot] = value if previous is _MISSING else aggregator.combine(previous, value)


def stage_rows(
    operations: tuple[OperationSpec, ...],
    outputs: list[OutputPlan],
    mode: str,
    value_type: str,
) -> StageRows:
    """The ``mapInArrow`` function of a source stage (runs in Spark's Python workers).

    ``mode`` is ``"typed"`` (one partials output: its partial aggregate in the typed ``value``
    column, for Spark to combine), ``"outputs"`` (per output: a partials output's pre-aggregated
    partial as JSON, or each record as JSON, in ``record``, tagged with ``out``) or ``"raw"``
    (the parsed input record as JSON, for stages whose operations run on the driver). Trident
    combines partial aggregates before it shuffles: per Arrow batch, one row per output and
    distinct key instead of one per record. Bad records come out as ``dead``; one extra row per
    Arrow batch carries the input count.
    """
    out_schema = pa.schema(
        [
            ("out", pa.int32()),
            ("key", pa.string()),
            ("value", ARROW_TYPES[value_type]),
            ("dead", pa.string()),
            ("inputs", pa.int64()),
            ("record", pa.string()),
        ]
    )

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        pipeline = RecordPipeline(operations if mode != "raw" else (), [o.tap for o in outputs] if mode != "raw" else None)
        aggregators = {o.index: aggregator_from_spec(o.aggregator) for o in outputs if o.aggregator is not None}
        batch_operations = [
            (op, resolve_function(op.function, scope=op.code), arrow_schema(op.out))
            for op in operations
            if op.kind in BATCH_OPERATIONS
        ]
        counted = _arrow_count(operations, outputs, mode) if batch_operations else None
        tallied = _python_count(outputs, mode)
        # counting per the field the chain's last operation emits: its values alone, no records
        values_of = pipeline.field_values(tallied.fields[0]) if tallied is not None and tallied.single else None
        by_column = pipeline.column_values(tallied.fields[0]) if values_of is not None and tallied is not None else None
        for batch in batches:
            columns: tuple[list[Any], ...] = ([], [], [], [], [])

            def add(out: int | None, key: str | None, value: Any, letter: str | None, rec: str | None) -> None:
                # called only within this iteration, so the lists of this batch are the ones bound
                for column, item in zip(columns, (out, key, value, letter, rec), strict=True):  # noqa: B023
                    column.append(item)

            rows_read = batch.num_rows
            if batch_operations:
                batch, letters = run_batch_operations(batch, batch_operations)
                for dead_letter in letters:
                    add(None, None, None, json.dumps(dead_letter, default=str), None)
            slots: list[Any] = []  # the key of each record a tallied output counts
            records: list[dict[str, Any]] = []
            if counted is not None:  # count per key in Arrow: no Python per record
                index, key_fields = counted
                grouped = pa.Table.from_batches([batch]).group_by(list(key_fields)).aggregate([([], "count_all")])
                for group in grouped.to_pylist():
                    add(index, encode_key([group[k] for k in key_fields]), group["count_all"], None, None)
            elif by_column is not None and by_column.field in batch.schema.names:  # no record per row
                slots, dead_texts = _column_slots(batch, by_column)
                for text in dead_texts:
                    add(None, None, None, text, None)
            else:
                records = batch.to_pylist()
            partials: dict[int, dict[Any, Any]] = {o.index: {} for o in outputs if o.key_fields is not None}
            for record in records:
                corrupt = record.pop(CORRUPT_COLUMN, None)
                if corrupt is not None:
                    error = {"record": corrupt, "error": UNPARSED_ERROR}
                    add(None, None, None, json.dumps(error), None)
                    continue
                if mode == "raw":
                    add(None, None, None, None, json.dumps(record, default=str))
                    continue
                if values_of is not None:
                    values, letter = values_of(record)
                    if letter is not None:
                        add(None, None, None, json.dumps({"record": record, "error": letter.error}, default=str), None)
                    else:
                        slots += values
                    continue
                by_tap, letter = pipeline.run_taps(record)
                if letter is not None:
                    add(None, None, None, json.dumps({"record": record, "error": letter.error}, default=str), None)
                    continue
                if tallied is not None:
                    try:
                        slots += [tallied.key_of(out) for out in by_tap[tallied.tap]]
                    except Exception as e:  # noqa: BLE001 - a missing key field must not stop the task
                        error = {"record": record, "error": f"partials: {type(e).__name__}: {e}"}
                        add(None, None, None, json.dumps(error, default=str), None)
                    continue
                # A record whose outputs fail to aggregate is dead-lettered whole, from every output.
                staged: list[tuple[int, Any, Any]] = []
                try:
                    for o in outputs:
                        for out in by_tap[o.tap]:
                            if o.key_fields is None:
                                staged.append((o.index, None, out))
                            else:
                                staged.append(
                                    (o.index, tuple(value_at(out, f) for f in o.key_fields), aggregators[o.index].init(out))
                                )
                except Exception as e:  # noqa: BLE001 - a bad field value must not stop the task
                    error = {"record": record, "error": f"partials: {type(e).__name__}: {e}"}
                    add(None, None, None, json.dumps(error, default=str), None)
                    continue
                for index, key_values, item in staged:
                    if key_values is None:
                        add(index, None, None, None, json.dumps(item, default=str))
                    else:
                        _combine_into(partials[index], aggregators[index], key_values, item)
            if tallied is not None:
                for slot, n in _tally(slots, partials[tallied.index], aggregators[tallied.index], tallied).items():
                    add(tallied.index, encode_key(list(tallied.values(slot))), n, None, None)
            for index, partial in partials.items():
                for slot, value in partial.items():
                    key = slot if isinstance(slot, str) else encode_key(list(slot))
                    if mode == "typed":
                        add(index, key, value, None, None)
                    else:
                        add(index, key, None, None, json.dumps(value, default=str))
            add(None, None, None, None, None)
            inputs: list[int | None] = [None] * (len(columns[0]) - 1) + [rows_read]
            out_col, keys, values, dead, recs = columns
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array(out_col, pa.int32()),
                    pa.array(keys, pa.string()),
                    pa.array(values, ARROW_TYPES[value_type]),
                    pa.array(dead, pa.string()),
                    pa.array(inputs, pa.int64()),
                    pa.array(recs, pa.string()),
                ],
                schema=out_schema,
            )

    return run


def _column_slots(batch: pa.RecordBatch, column: ColumnValues) -> tuple[list[Any], list[str]]:
    """The tallied key values a batch's records give when the chain's one per-record operation
    reads one input column (:meth:`RecordPipeline.column_values`), and its dead letters (JSON),
    in row order: what the record loop of :func:`stage_rows` gives, without a record per row."""
    values_of = column.values_of
    names = batch.schema.names
    unparsed = batch.column(CORRUPT_COLUMN) if CORRUPT_COLUMN in names else None
    corrupt = unparsed.to_pylist() if unparsed is not None and unparsed.null_count < len(unparsed) else None
    slots: list[Any] = []
    letters: list[str] = []
    for i, value in enumerate(batch.column(column.field).to_pylist()):
        if corrupt is not None and corrupt[i] is not None:
            letters.append(json.dumps({"record": corrupt[i], "error": UNPARSED_ERROR}))
            continue
        try:
            slots += values_of(value)
        except Exception as e:  # noqa: BLE001 - user code may raise anything; it must not stop the task
            record = batch.slice(i, 1).to_pylist()[0]
            record.pop(CORRUPT_COLUMN, None)
            letters.append(json.dumps({"record": record, "error": column.dead_letter(record, e).error}, default=str))
    return slots, letters


def _tally(slots: list[Any], partial: dict[Any, Any], aggregator: Any, tallied: _Tally) -> dict[Any, int]:
    """The count of each key in ``slots``; keys that cannot be hashed (lists, dicts) are
    combined into ``partial`` instead, as any other partial."""
    try:
        return Counter(slots)
    except TypeError:
        tally: dict[Any, int] = {}
        for slot in slots:
            try:
                tally[slot] = tally.get(slot, 0) + 1
            except TypeError:
                _combine_into(partial, aggregator, tallied.values(slot), 1)
        return tally


@dataclass(frozen=True)
class _Tally:
    """A stage's one partials output when it counts per top-level key fields: the Python path
    then counts key values in a dict (no ``init``/``combine`` call per record)."""

    index: int
    tap: int
    key_of: Callable[[Any], Any]
    """The key of an output record: the value of the one key field, or a tuple of them."""
    fields: tuple[str, ...]

    @property
    def single(self) -> bool:
        return len(self.fields) == 1

    def values(self, slot: Any) -> tuple[Any, ...]:
        return (slot,) if self.single else tuple(slot)


def _python_count(outputs: list[OutputPlan], mode: str) -> _Tally | None:
    if mode != "typed" or len(outputs) != 1:
        return None
    output = outputs[0]
    fields = output.key_fields
    if not fields or (output.aggregator or {}).get("kind") != "Count" or any("." in f for f in fields):
        return None
    return _Tally(output.index, output.tap, operator.itemgetter(*fields), fields)


def _arrow_count(
    operations: tuple[OperationSpec, ...], outputs: list[OutputPlan], mode: str
) -> tuple[int, tuple[str, ...]] | None:
    """(output index, key fields) when the batch operations end the stage and its one output
    counts per top-level key: then Arrow counts each batch (``Table.group_by``)."""
    if mode != "typed" or len(outputs) != 1 or any(op.kind not in HEAD_OPERATIONS for op in operations):
        return None
    output = outputs[0]
    if output.key_fields is None or (output.aggregator or {}).get("kind") != "Count" or output.tap != len(operations) - 1:
        return None
    if not output.key_fields or any(k not in operations[-1].out for k in output.key_fields):
        return None
    return output.index, output.key_fields


def run_batch_operations(
    batch: pa.RecordBatch, operations: list[tuple[OperationSpec, Any, pa.Schema]]
) -> tuple[pa.RecordBatch, list[dict[str, Any]]]:
    """The stage's ``map_batches`` functions over one Arrow batch, in order: (the batch they
    give, dead letters for lines that did not parse and rows a function fails on)."""
    letters: list[dict[str, Any]] = []
    if CORRUPT_COLUMN in batch.schema.names:
        parsed = pc.is_null(batch.column(CORRUPT_COLUMN))
        bad = batch.filter(pc.invert(parsed)).column(CORRUPT_COLUMN).to_pylist()
        letters += [{"record": text, "error": UNPARSED_ERROR} for text in bad]
        batch = batch.filter(parsed)
        batch = batch.select([name for name in batch.schema.names if name != CORRUPT_COLUMN])
    for op, fn, schema in operations:
        outputs, dead = apply_isolating(fn, batch, schema, op.function)
        letters += dead
        table = pa.Table.from_batches(outputs, schema=schema).combine_chunks()
        batch = table.to_batches()[0] if table.num_rows else pa.RecordBatch.from_pylist([], schema=schema)
    return batch, letters


def typed_partials(stage: StageSpec) -> ShuffleSpec | None:
    """The stage's one output when Spark can combine its partials itself (the fast path): its
    partials then come out typed in ``value`` (:func:`stage_rows` mode ``"typed"``)."""
    if len(stage.outputs) != 1 or needs_driver(stage.operations):
        return None
    output = stage.outputs[0]
    if not isinstance(output, ShuffleSpec) or aggregator_from_spec(output.aggregator).spark_function is None:
        return None
    return output


def window_partials_output(stage: StageSpec) -> RecordsSpec | None:
    """The stage's one output when every operation is SQL (done by the Arrow read) and the
    output sends whole records to an event-time window stage that takes partials
    (``RecordsSpec.window_partials``): its batch may then go partly as partials."""
    if any(op.kind not in SQL_OPERATIONS for op in stage.operations) or len(stage.outputs) != 1:
        return None
    output = stage.outputs[0]
    if not isinstance(output, RecordsSpec) or output.window_partials is None or output.broadcast_unkeyed:
        return None
    if stage.tap_of(output) != len(stage.operations) - 1:
        return None
    return output


def count_output(stage: StageSpec, kinds: tuple[str, ...] = SQL_OPERATIONS) -> ShuffleSpec | None:
    """The stage's one output when every operation is of ``kinds`` and the output counts per
    key after them (Spark alone, or Arrow alone, can then compute the batch)."""
    if any(op.kind not in kinds for op in stage.operations) or len(stage.outputs) != 1:
        return None
    output = stage.outputs[0]
    if not isinstance(output, ShuffleSpec) or output.aggregator.get("kind") != "Count":
        return None
    if stage.tap_of(output) != len(stage.operations) - 1 or not output.key_fields:
        return None
    return output
