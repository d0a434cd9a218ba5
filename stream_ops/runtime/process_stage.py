"""What a processing-element stage does with the records of one batch (driver side).

Every live instance is checkpointed under one reserved key of the task's store with the
batch, so it is written to the state topic and rebuilt after a move.
"""

from __future__ import annotations

from stream_ops.errors import TopologyLoadError
from stream_ops.operators.processing_element import PERuntime, ProcessingElement, Trigger
from stream_ops.runtime.stage_processors import TICK_STREAM, ProcessorOutput, Row
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
        trigger = Trigger.from_spec(spec.trigger) if spec.trigger else None
        self.store = store
        saved = store.multi_get([self.STATE_KEY])[0]
        if saved:
            self.runtime = PERuntime.restore(saved, pe_class, spec.key_field, trigger, ttl_seconds=spec.ttl_seconds)
        else:
            self.runtime = PERuntime(pe_class, spec.key_field, trigger, ttl_seconds=spec.ttl_seconds)
        periods = [p for p in (trigger.every_seconds if trigger else None, spec.ttl_seconds) if p]
        self.tick_interval_s = max(min(periods) / 2, 0.2) if periods else None

    def process(self, rows: list[Row], now: float) -> ProcessorOutput:
        records = [record for stream, _, record in rows if stream != TICK_STREAM]
        out = self.runtime.process(records, now)
        out.extend(self.runtime.tick(now))
        dead = [{"record": d.get("record"), "error": d.get("error")} for d in self.runtime.take_dead_letters()]
        self.store.multi_put([self.STATE_KEY], [self.runtime.checkpoint()])
        return ProcessorOutput(out, dead)
