"""What a processing-element stage does with the records of one batch (driver side).

Every live instance is checkpointed under one reserved key of the task's store with the
batch, so it is written to the state topic and rebuilt after a move. Records of a stage with
several input streams reach the runtime stream by stream, in arrival order, so a PE can tell
them apart (``on_<stream>`` or ``on_event(event, stream)``); what instances emit to named
output streams becomes the stage's side streams.
"""

from __future__ import annotations

from itertools import groupby
from typing import Any

from stream_ops.errors import TopologyLoadError
from stream_ops.operators.processing_element import PERuntime, ProcessingElement, Trigger, prototype_from_spec
from stream_ops.runtime.stage_processors import ProcessorOutput, Row, data_rows
from stream_ops.state.rocksdb_backing import RocksDBBackingMap
from stream_ops.topology.functions import resolve_function
from stream_ops.topology.plan import StageSpec


class ProcessElementProcessor:
    """S4 processing elements, one per key; every instance is checkpointed with the batch."""

    STATE_KEY = ("__processing_elements__",)

    def __init__(self, stage: StageSpec, store: RocksDBBackingMap | None, now: float) -> None:
        assert stage.process is not None and store is not None
        spec = stage.process
        pe_class = resolve_function(spec.pe_class, scope=spec.code)
        if not (isinstance(pe_class, type) and issubclass(pe_class, ProcessingElement)):
            raise TopologyLoadError(f"{spec.pe_class} is not a ProcessingElement subclass")
        pe: type[ProcessingElement] | ProcessingElement = (
            prototype_from_spec(pe_class, spec.prototype) if spec.prototype is not None else pe_class
        )
        trigger = Trigger.from_spec(spec.trigger) if spec.trigger else None
        options: dict[str, Any] = dict(
            ttl_seconds=spec.ttl_seconds,
            timer_interval=spec.timer_interval,
            max_instances=spec.max_instances,
            singleton=spec.singleton,
        )
        self.store = store
        self.outputs = frozenset(spec.outputs)
        self.by_stream = isinstance(spec.key_field, dict)
        saved = store.multi_get([self.STATE_KEY])[0]
        if saved:
            self.runtime = PERuntime.restore(saved, pe, spec.key_field, trigger, **options)
        else:
            self.runtime = PERuntime(pe, spec.key_field, trigger, **options)
        periods = [p for p in (trigger.every_seconds if trigger else None, spec.ttl_seconds, spec.timer_interval) if p]
        self.tick_interval_s = max(min(periods) / 2, 0.2) if periods else None

    def process(self, rows: list[Row], now: float) -> ProcessorOutput:
        out: list[dict[str, Any]] = []
        items = data_rows(rows)
        if self.by_stream:
            for stream, group in groupby(items, key=lambda item: item[0]):
                out.extend(self.runtime.process([record for _, record in group], now, stream=stream))
        else:
            out.extend(self.runtime.process([record for _, record in items], now))
        out.extend(self.runtime.tick(now))
        dead = [{"record": d.get("record"), "error": d.get("error")} for d in self.runtime.take_dead_letters()]
        side: dict[str, list[dict[str, Any]]] = {}
        for name, records in self.runtime.take_side_outputs().items():
            if name in self.outputs:
                side[name] = records
            else:
                error = (
                    f"emitted to stream {name!r}, which process(outputs=...) does not declare (declared: {sorted(self.outputs)})"
                )
                dead.extend({"record": record, "error": error} for record in records)
        self.store.multi_put([self.STATE_KEY], [self.runtime.checkpoint()])
        return ProcessorOutput(out, dead, side)
