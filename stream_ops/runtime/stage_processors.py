"""What records stages do with the records of one batch (driver side): the protocol, and the
join, aggregate and partition processors (windowed aggregates: :mod:`.window_stage`;
processing elements: :mod:`.process_stage`).

Each processor keeps its operator state (a join's window buffer, the open windows, the
processing elements of every key) in the task's RocksDB store, so it is written to the state
topic with the batch and restored after a move like any keyed state. Besides its records, a
processor may emit *side streams* by name (late records, a processing element's named output
streams); the stage's ``side`` operations read them.
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from stream_ops.operators.aggregators import aggregator_from_spec
from stream_ops.operators.join_bolt import JoinBolt
from stream_ops.operators.window_partials import PartialRow
from stream_ops.state.rocksdb_backing import RocksDBBackingMap
from stream_ops.topology.plan import StageSpec
from stream_ops.topology.windows import WindowDef

logger = logging.getLogger(__name__)

TICK_STREAM = "__tick__"
"""Stream tag of the tick records a task writes into its own input so time-based windows and
triggers fire when no data arrives (a micro-batch only runs when a file arrives)."""

PROGRESS_STREAM = "__progress__"
"""Stream tag of the rows in which an upstream task reports the largest event time it sent to
an event-time window stage (see :class:`~stream_ops.topology.windows.Watermark`)."""

WINDOW_PARTIALS_STREAM = "__window_partials__"
"""Stream tag of the row in which an upstream source task sends an event-time window stage's
queue the partial aggregates of one batch per (time window, key) (see
:mod:`stream_ops.operators.window_partials`): its record holds them as columns, ``{"start",
"end", "key", "partial"}`` (one JSON text for the batch, not a line per partial)."""

Row = tuple[str, str | None, dict[str, Any]]
"""One shuffled row: (input stream tag, encoded key, record)."""

_NOT_RECORDS = (TICK_STREAM, PROGRESS_STREAM, WINDOW_PARTIALS_STREAM)


def progress_row(stage: int, queue: int, max_event: float) -> dict[str, Any]:
    """The shuffle line reporting that the task of ``queue`` of upstream ``stage`` sent
    records up to event time ``max_event``."""
    return {"stream": PROGRESS_STREAM, "key": None, "record": json.dumps({"channel": f"{stage}/{queue}", "max_event": max_event})}


def window_partials_row(partials: Sequence[PartialRow]) -> dict[str, Any]:
    """The shuffle line carrying ``partials`` (start, end, encoded key, partial) to one queue."""
    columns: dict[str, list[Any]] = {"start": [], "end": [], "key": [], "partial": []}
    for start, end, key, partial in partials:
        columns["start"].append(start)
        columns["end"].append(end)
        columns["key"].append(key)
        columns["partial"].append(partial)
    return {"stream": WINDOW_PARTIALS_STREAM, "key": None, "record": json.dumps(columns)}


def data_rows(rows: Sequence[Row]) -> list[tuple[str, dict[str, Any]]]:
    """The (stream tag, record) of the rows that carry records (not ticks, progress reports or
    window partials)."""
    return [(stream, record) for stream, _, record in rows if stream not in _NOT_RECORDS]


def window_partials(rows: Sequence[Row]) -> list[PartialRow]:
    """The (start, end, encoded key, partial) window partials the rows among ``rows`` carry."""
    found: list[PartialRow] = []
    for stream, _, record in rows:
        if stream == WINDOW_PARTIALS_STREAM:
            found.extend(zip(record["start"], record["end"], record["key"], record["partial"], strict=True))
    return found


def progress_reports(rows: Sequence[Row]) -> list[tuple[str, float]]:
    """The (channel, largest event time) progress reports among ``rows``; a channel is an
    upstream task, ``"<stage>/<queue>"``."""
    return [(str(record["channel"]), float(record["max_event"])) for stream, _, record in rows if stream == PROGRESS_STREAM]


@dataclass
class ProcessorOutput:
    """What a processor made of one batch."""

    records: list[dict[str, Any]]
    dead: list[dict[str, Any]] = field(default_factory=list)
    """``{"record", "error"}`` for the dead-letter topic."""
    side: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Records of named side streams (late records, named output streams)."""


class StageProcessor(Protocol):
    """Turns a batch of shuffled rows into output records and updates its own state.

    Constructed with ``(stage, store, now)``: the stage, the task's store (None for stateless
    kinds) and the processing time, then restores its state from the store.
    """

    tick_interval_s: float | None

    def process(self, rows: list[Row], now: float) -> ProcessorOutput:
        """The batch's output; stages the state change in the store."""
        ...


def late_letters(output: ProcessorOutput, window: WindowDef, late: Sequence[Mapping[str, Any]]) -> None:
    """Send late records to the window's late stream, or to the dead letters with the reason."""
    if not late:
        return
    if window.late_stream is not None:
        output.side.setdefault(window.late_stream, []).extend(dict(r) for r in late)
        return
    output.dead.extend(
        {"record": dict(r), "error": f"late: event time in {window.timestamp_field!r} is before the watermark"} for r in late
    )


class PartitionProcessor:
    """``partition_by``: records pass through unchanged."""

    tick_interval_s: float | None = None

    def __init__(self, stage: StageSpec, store: RocksDBBackingMap | None, now: float) -> None:
        pass

    def process(self, rows: list[Row], now: float) -> ProcessorOutput:
        return ProcessorOutput([record for _, record in data_rows(rows)])


class BatchAggregateProcessor:
    """``Stream.aggregate``: the batch's partial aggregates (one key) combined into one record."""

    tick_interval_s: float | None = None

    def __init__(self, stage: StageSpec, store: RocksDBBackingMap | None, now: float) -> None:
        assert stage.batch_aggregate is not None
        self.spec = stage.batch_aggregate
        self.aggregator = aggregator_from_spec(self.spec.aggregator)

    def process(self, rows: list[Row], now: float) -> ProcessorOutput:
        values = [record["value"] for _, _, record in rows if record.get("value") is not None]
        if not values:
            return ProcessorOutput([])
        try:
            total = self.aggregator.apply(None, functools.reduce(self.aggregator.combine, values))
        except Exception as e:  # noqa: BLE001 - reported as a dead letter, the batch goes on
            return ProcessorOutput([], [{"record": {"partials": values}, "error": f"combine: {type(e).__name__}: {e}"}])
        return ProcessorOutput([{self.spec.value_field: total}])


class JoinProcessor:
    """A Storm JoinBolt over its windows; the window buffer is task state."""

    STATE_KEY = ("__join_window__",)

    def __init__(self, stage: StageSpec, store: RocksDBBackingMap | None, now: float) -> None:
        assert stage.join is not None and store is not None
        self.bolt = JoinBolt.from_spec(stage.join.bolt_spec())
        self.store = store
        self.buffer = self.bolt.window_buffer(now, channels=stage.progress_channels)
        saved = store.multi_get([self.STATE_KEY])[0]
        if saved:
            self.buffer.restore(saved, now)
        self.tick_interval_s = self.bolt.tick_interval_s

    def process(self, rows: list[Row], now: float) -> ProcessorOutput:
        batch = self.buffer.add(data_rows(rows), now, progress=progress_reports(rows))
        fields = self.bolt.output_fields
        out = [dict(zip(fields, row, strict=True)) for window in batch.windows for row in self.bolt.execute(window)]
        self.store.multi_put([self.STATE_KEY], [self.buffer.state(now)])
        output = ProcessorOutput(out, list(batch.dead))
        window = self.bolt.window
        assert window is not None
        late = [{"stream": stream, "record": json.dumps(record, default=str)} for stream, record in batch.late]
        late_letters(output, window, late)
        return output


def make_processor(stage: StageSpec, store: RocksDBBackingMap | None, now: float) -> StageProcessor | None:
    """The record processor of ``stage``'s kind (see :mod:`stream_ops.topology.stage_kinds`),
    or None for kinds whose batches Spark computes alone."""
    ref = stage.kind_info.processor
    if ref is None:
        return None
    module, _, name = ref.partition(":")
    processor_class = getattr(importlib.import_module(module), name)
    processor: StageProcessor = processor_class(stage, store, now)
    return processor
