"""What join, process and partition stages do with the records of one batch (driver side).

Each processor keeps its operator state (a join's window buffer, the processing elements of
every key) in the task's RocksDB store under one reserved key, so it is written to the state
topic with the batch and restored after a move like any keyed state.
"""

from __future__ import annotations

import functools
import importlib
import logging
from typing import Any, Protocol

from stream_ops.errors import TopologyLoadError
from stream_ops.operators.aggregators import aggregator_from_spec
from stream_ops.operators.join_bolt import JoinBolt, TumblingWindow
from stream_ops.operators.processing_element import PERuntime, ProcessingElement, Trigger
from stream_ops.state.rocksdb_backing import RocksDBBackingMap
from stream_ops.topology.functions import resolve_function
from stream_ops.topology.plan import StageSpec

logger = logging.getLogger(__name__)

TICK_STREAM = "__tick__"
"""Stream tag of the tick records a task writes into its own input so time-based windows and
triggers fire when no data arrives (a micro-batch only runs when a file arrives)."""

Row = tuple[str, str | None, dict[str, Any]]


class StageProcessor(Protocol):
    """Turns a batch of shuffled rows into output records and updates its own state."""

    tick_interval_s: float | None

    def process(self, rows: list[Row], now: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(output records, dead letters) for one batch; stages the state change in the store."""
        ...


class PartitionProcessor:
    """``partition_by``: records pass through unchanged."""

    tick_interval_s: float | None = None

    def __init__(self, stage: StageSpec, store: RocksDBBackingMap | None) -> None:
        pass

    def process(self, rows: list[Row], now: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return [record for stream, _, record in rows if stream != TICK_STREAM], []


class BatchAggregateProcessor:
    """``Stream.aggregate``: the batch's partial aggregates (one key) combined into one record."""

    tick_interval_s: float | None = None

    def __init__(self, stage: StageSpec, store: RocksDBBackingMap | None) -> None:
        assert stage.batch_aggregate is not None
        self.spec = stage.batch_aggregate
        self.aggregator = aggregator_from_spec(self.spec.aggregator)

    def process(self, rows: list[Row], now: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        values = [record["value"] for _, _, record in rows if record.get("value") is not None]
        if not values:
            return [], []
        try:
            total = self.aggregator.apply(None, functools.reduce(self.aggregator.combine, values))
        except Exception as e:  # noqa: BLE001 - reported as a dead letter, the batch goes on
            return [], [{"record": {"partials": values}, "error": f"combine: {type(e).__name__}: {e}"}]
        return [{self.spec.value_field: total}], []


class JoinProcessor:
    """A Storm JoinBolt over tumbling windows; the window buffer is task state."""

    STATE_KEY = ("__join_window__",)

    def __init__(self, stage: StageSpec, store: RocksDBBackingMap | None) -> None:
        assert stage.join is not None and store is not None
        self.bolt = JoinBolt.from_spec(stage.join.bolt_spec())
        self.store = store
        saved = store.multi_get([self.STATE_KEY])[0]
        self.window: TumblingWindow = TumblingWindow.from_state(saved) if saved else self.bolt.tumbling_window()
        seconds = self.bolt.window.seconds if self.bolt.window else None
        self.tick_interval_s = max(seconds / 2, 0.2) if seconds else None

    def process(self, rows: list[Row], now: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        windows = []
        for stream, _, record in rows:
            if stream != TICK_STREAM:
                windows.extend(self.window.add(stream, record, now))
        windows.extend(self.window.flush(now))
        fields = self.bolt.output_fields
        out = [dict(zip(fields, row, strict=True)) for window in windows for row in self.bolt.execute(window)]
        self.store.multi_put([self.STATE_KEY], [self.window.state()])
        return out, []


class ProcessElementProcessor:
    """S4 processing elements, one per key; every instance is checkpointed with the batch."""

    STATE_KEY = ("__processing_elements__",)

    def __init__(self, stage: StageSpec, store: RocksDBBackingMap | None) -> None:
        assert stage.process is not None and store is not None
        spec = stage.process
        pe_class = resolve_function(spec.pe_class, scope=spec.code)
        if not (isinstance(pe_class, type) and issubclass(pe_class, ProcessingElement)):
            raise TopologyLoadError(f"{spec.pe_class} is not a ProcessingElement subclass")
        trigger = Trigger.from_spec(spec.trigger) if spec.trigger else None
        self.store = store
        saved = store.multi_get([self.STATE_KEY])[0]
        if saved:
            self.runtime = PERuntime.restore(saved, pe_class, spec.key_field, trigger, ttl_seconds=spec.ttl_seconds)
        else:
            self.runtime = PERuntime(pe_class, spec.key_field, trigger, ttl_seconds=spec.ttl_seconds)
        periods = [p for p in (trigger.every_seconds if trigger else None, spec.ttl_seconds) if p]
        self.tick_interval_s = max(min(periods) / 2, 0.2) if periods else None

    def process(self, rows: list[Row], now: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        records = [record for stream, _, record in rows if stream != TICK_STREAM]
        out = self.runtime.process(records, now)
        out.extend(self.runtime.tick(now))
        dead = [{"record": d.get("record"), "error": d.get("error")} for d in self.runtime.take_dead_letters()]
        self.store.multi_put([self.STATE_KEY], [self.runtime.checkpoint()])
        return out, dead


def make_processor(stage: StageSpec, store: RocksDBBackingMap | None) -> StageProcessor | None:
    """The record processor of ``stage``'s kind (see :mod:`stream_ops.topology.stage_kinds`),
    or None for kinds whose batches Spark computes alone."""
    ref = stage.kind_info.processor
    if ref is None:
        return None
    module, _, name = ref.partition(":")
    processor_class = getattr(importlib.import_module(module), name)
    processor: StageProcessor = processor_class(stage, store)
    return processor
