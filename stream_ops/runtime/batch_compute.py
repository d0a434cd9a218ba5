"""Step 2 of the commit protocol: compute a batch, Spark's part and the driver's part.

Spark's part reads the micro-batch in its stage kind's input format (outside the commit lock:
a stop need not wait for it). The driver's part reads and updates the task's state: a keyed
stage applies its combined partials to its map state (:mod:`.map_state_update`), a join /
process / partition / window stage runs its processor, and record operations left for the
driver run on the result.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pyspark.sql import DataFrame

from stream_ops.compute.decision import keyed_batch, records_batch, source_batch
from stream_ops.operators.record_pipeline import run_batch
from stream_ops.runtime.computed_batch import ComputedBatch
from stream_ops.runtime.map_state_update import MapStateUpdate
from stream_ops.runtime.stage_processors import StageProcessor
from stream_ops.runtime.state_reader import StateReader
from stream_ops.runtime.task_state import TaskState
from stream_ops.topology.plan import ShuffleSpec, StageSpec


def compute_in_spark(df: DataFrame, stage: StageSpec, *, sent_before: Mapping[int, float | None] | None = None) -> ComputedBatch:
    """Step 2, Spark's part: read the micro-batch as its stage kind's input format. A source
    batch may send records that cannot be late at an event-time window stage as partials,
    given ``sent_before`` (:func:`~stream_ops.compute.decision.source_batch`)."""
    reads = stage.kind_info.reads
    if reads == "source":
        result = source_batch(df, stage, sent_before=sent_before)
        batch = ComputedBatch(rows_in=result.input_rows, dead=list(result.dead_letters), window_partials=result.window_partials)
        if result.inputs is not None:
            batch.records, batch.driver_operations = result.inputs, True
        else:
            for index, items in result.outputs.items():
                if isinstance(stage.outputs[index], ShuffleSpec):
                    batch.output_partials[index] = items
                else:
                    batch.outputs[index] = items
        return batch
    if reads == "partials":
        partials, rows_in = keyed_batch(df, stage)
        return ComputedBatch(rows_in=rows_in, partials=partials, driver_operations=stage.state is None)
    rows = records_batch(df)
    return ComputedBatch(rows_in=len(rows), rows=rows, driver_operations=True)


def compute_on_state(
    batch: ComputedBatch,
    txid: int,
    *,
    stage: StageSpec,
    map_update: MapStateUpdate,
    state: TaskState | None,
    processor: StageProcessor | None,
    state_reader: StateReader | None,
    clock: Callable[[], float],
) -> None:
    """Step 2, on the driver: apply the shuffled partials to the map state (Trident's txid
    rules), or run the stage's processor, then the stage's driver-side record operations."""
    if stage.state is not None:
        map_update.apply(batch, txid, state)
    elif processor is not None:
        rows = batch.rows or [("", key, {"value": value}) for key, value in batch.partials]
        result = processor.process(rows, clock())
        batch.records, batch.dead, batch.side = result.records, result.dead, result.side
    if batch.driver_operations:
        taps = [stage.tap_of(output) for output in stage.outputs]
        by_tap, letters = run_batch(batch.records, stage.operations, state_reader, taps, side=batch.side)
        batch.outputs = {index: by_tap[tap] for index, tap in enumerate(taps)}
        batch.dead.extend({"record": d.record, "error": d.error} for d in letters)
