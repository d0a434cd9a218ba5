"""What a windowed aggregate stage does with the records of one batch (driver side).

The open windows are entries of the task's RocksDB store, written with the batch (only those
the batch changed) and so appended to the state topic and restored after a move like any
keyed state; a window that spans a crash emits once, from the batch that commits.
"""

from __future__ import annotations

import logging

from stream_ops.operators.aggregators import aggregator_from_spec
from stream_ops.operators.window_aggregation import WindowedAggregation
from stream_ops.runtime.stage_processors import (
    ProcessorOutput,
    Row,
    data_rows,
    late_letters,
    progress_reports,
    window_partials,
)
from stream_ops.state.rocksdb_backing import RocksDBBackingMap
from stream_ops.topology.plan import StageSpec
from stream_ops.topology.windows import WindowDef

logger = logging.getLogger(__name__)


class WindowAggregateProcessor:
    """``window(...).group_by(...).aggregate(...)``: per-key partial aggregates per window."""

    def __init__(self, stage: StageSpec, store: RocksDBBackingMap | None, now: float) -> None:
        assert stage.window_aggregate is not None and store is not None
        spec = stage.window_aggregate
        self.window = WindowDef.from_spec(spec.window)
        self.store = store
        self.aggregation = WindowedAggregation(
            self.window,
            spec.key_fields,
            aggregator_from_spec(spec.aggregator),
            spec.value_field,
            now,
            channels=stage.progress_channels,
        )
        restored = self.aggregation.restore(store.items(), now)
        if restored:
            logger.info("stage %s: restored %d open window entries", stage.name, restored)
        self.tick_interval_s = self.window.tick_interval_s

    def process(self, rows: list[Row], now: float) -> ProcessorOutput:
        batch = self.aggregation.process(
            [record for _, record in data_rows(rows)], now, progress=progress_reports(rows), partials=window_partials(rows)
        )
        puts, deletes = self.aggregation.changes()
        if puts:
            self.store.multi_put([key for key, _ in puts], [value for _, value in puts])
        if deletes:
            self.store.delete(deletes)
        output = ProcessorOutput(batch.results, list(batch.dead))
        late_letters(output, self.window, batch.late)
        return output
