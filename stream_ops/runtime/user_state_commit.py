"""A ``partition_persist`` stage's user State through the commit protocol.

Step 3 stages a batch's tuples, like every output, then applies them to the State with
``begin_commit(n)``: the State keeps them uncommitted (e.g. in a database transaction) until
step 6, so no reader sees a batch before ZooKeeper commits it, and a zombie's never. Step 6
commits the State, then deletes the staged tuples. A crash between the ZooKeeper commit and
that deletion is finished when the task starts again, or when Spark re-delivers the batch:
the staged tuples are applied and committed again.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from stream_ops.helpers.field_paths import value_or_none
from stream_ops.operators.record_pipeline import as_fields
from stream_ops.operators.trident_state import Collector, State
from stream_ops.topics.file_topic import batch_file_name
from stream_ops.topology.functions import resolve_object
from stream_ops.topology.layout import TopologyLayout
from stream_ops.topology.plan import PersistSpec, StageSpec, TaskSpec

logger = logging.getLogger(__name__)


class UserStateCommits:
    """Steps 3 and 6 of one task's ``partition_persist`` State (the State itself is the task's:
    each call is given it)."""

    def __init__(self, *, layout: TopologyLayout, stage: StageSpec, task: TaskSpec) -> None:
        self.layout = layout
        self.stage = stage
        self.task = task

    def stage_batch(
        self,
        state: State | None,
        txid: int,
        epoch: int,
        persist: PersistSpec,
        records: list[dict[str, Any]],
        dead: list[dict[str, Any]],
    ) -> list[dict[str, Any]]:
        """Step 3 for a partition_persist: stage the tuples, then update the user State; returns
        the records its updater emitted (an emitted value that does not fit ``out=`` is a dead letter)."""
        tuples = [{f: value_or_none(record, f) for f in persist.fields} for record in records]
        # The tuples are staged so that a crash between the ZooKeeper commit and the
        # State's commit (step 6) can apply them again; see finish_commit.
        self.layout.persist_topic(self.stage).stage_batch(self.task.queue, self.task.task_id, txid, epoch, tuples)
        collector = self._update(state, txid, tuples)
        out = list(persist.emit_fields or {})
        emitted: list[dict[str, Any]] = []
        for value in collector.emitted if out else ():
            try:
                emitted.append(as_fields(value, out, f"{persist.name} updater"))
            except ValueError as e:
                dead.append({"record": {"emitted": value}, "error": str(e)})
        return emitted

    def commit(self, state: State | None, txid: int, epoch: int) -> None:
        """Step 6: commit the State, then delete the batch's staged tuples (none to commit
        without a State)."""
        if state is not None:
            state.commit(txid)
            self._tuples_path(txid, epoch).unlink(missing_ok=True)

    def finish_commit(self, state: State | None, txid: int, epoch: int) -> None:
        """Apply committed batch ``txid``'s tuples to the user State again if its commit may not
        have happened (their staged file is deleted only after ``State.commit``).

        A transactional or opaque State recognises the txid; a plain State may count the batch
        twice if the crash fell between its commit and the deletion (Trident's non-transactional
        state is at-least-once too).
        """
        if state is None:
            return
        path = self._tuples_path(txid, epoch)
        if not path.exists():
            return
        tuples = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        logger.info(
            "task %s/%d: applying committed txid %d to its State again (%d tuples)",
            self.layout.topology_id,
            self.task.task_id,
            txid,
            len(tuples),
        )
        self._update(state, txid, tuples)
        state.commit(txid)
        path.unlink(missing_ok=True)

    def _update(self, state: State | None, txid: int, tuples: list[dict[str, Any]]) -> Collector:
        """Apply a batch's tuples to the partition_persist State, without committing it."""
        assert self.stage.persist is not None and state is not None
        state.begin_commit(txid)
        collector = Collector(tuple(self.stage.persist.emit_fields or ()))
        resolve_object(self.stage.persist.updater).update_state(state, tuples, collector)
        return collector

    def _tuples_path(self, txid: int, epoch: int) -> Path:
        return self.layout.persist_topic(self.stage).pending_path(self.task.queue) / batch_file_name(
            self.task.task_id, txid, epoch
        )
