"""Step 3 of the commit protocol: a batch's outputs written where no reader sees them.

Every output is staged named (task, txid, owner epoch) and fsynced
(:meth:`~stream_ops.runtime.stage_outputs.StageOutputs.stage_batch`); a ``partition_persist``
output's tuples go to its user State uncommitted (:mod:`.user_state_commit`); the records that
could not be processed go to the dead-letter topic with the reason (DESIGN invariant 7).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from stream_ops.operators.trident_state import State
from stream_ops.runtime.computed_batch import ComputedBatch
from stream_ops.runtime.stage_outputs import StageOutputs
from stream_ops.runtime.task_stats import TaskStats
from stream_ops.runtime.user_state_commit import UserStateCommits
from stream_ops.topology.layout import TopologyLayout
from stream_ops.topology.plan import PersistSpec, StageSpec, TaskSpec

logger = logging.getLogger(__name__)


class BatchStaging:
    """Stages one task's batches (step 3)."""

    def __init__(
        self, *, layout: TopologyLayout, stage: StageSpec, task: TaskSpec, user_states: UserStateCommits, stats: TaskStats
    ) -> None:
        self.layout = layout
        self.stage = stage
        self.task = task
        self.user_states = user_states
        self.stats = stats

    def stage_batch(self, batch: ComputedBatch, txid: int, epoch: int, *, outputs: StageOutputs, user_state: State | None) -> int:
        """Update the partition_persist State (uncommitted), write the batch's output files
        (unpublished); returns the number of output rows."""
        staging_started = time.perf_counter()
        rows_out = batch.updated_keys
        emitted: dict[int, list[dict[str, Any]]] = {}
        for index, output in enumerate(self.stage.outputs):
            if isinstance(output, PersistSpec):
                records = batch.outputs.get(index, [])
                emitted[index] = self.user_states.stage_batch(user_state, txid, epoch, output, records, batch.dead)
                rows_out += len(batch.outputs.get(index, []))
        rows_out += outputs.stage_batch(
            txid, epoch, batch.outputs, batch.output_partials, batch.dead, emitted, window_partials=batch.window_partials
        )
        self._stage_dead_letters(txid, epoch, batch.dead)
        self.stats.stage_ms_total += (time.perf_counter() - staging_started) * 1000.0
        return rows_out

    def _stage_dead_letters(self, txid: int, epoch: int, dead: list[dict[str, Any]]) -> None:
        """The records of a batch that could not be processed, to the dead-letter topic."""
        if not dead:
            return
        topology_id = self.layout.topology_id
        letters = [{**d, "topology": topology_id, "task": self.task.task_id, "txid": txid, "epoch": epoch} for d in dead]
        self.layout.dead_letter_topic().stage_batch(0, self.task.task_id, txid, epoch, letters)
        self.stats.dead_letters += len(letters)
        logger.warning(
            "task %s/%d txid %d: %d records to the dead-letter topic", topology_id, self.task.task_id, txid, len(letters)
        )
