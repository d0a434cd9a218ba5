"""What a task's predecessors left unpublished, dropped when the task starts under a new owner
epoch: staged files no commit will ever publish, and temp files a crashed writer left.

Only epochs below the new owner's are touched, and the caller checks it still owns the task
first: a stale owner that resumes here never deletes a newer owner's files (DESIGN invariant 2).
"""

from __future__ import annotations

import time

from stream_ops.spark.shuffle_queue import tick_file_prefix
from stream_ops.topics.staged_output import StagedOutput
from stream_ops.topology.layout import TopologyLayout
from stream_ops.topology.plan import StageSpec, TaskSpec


def discard_unpublished(
    layout: TopologyLayout,
    stage: StageSpec,
    task: TaskSpec,
    outputs: list[StagedOutput],
    *,
    epoch: int,
    keep: tuple[int, int] | None,
) -> None:
    """Drop ``task``'s staged files of epochs below ``epoch`` in its ``outputs``, state topic and
    persisted tuples, except the committed batch ``keep`` (txid, epoch), which is published
    next; and the stale temp files of its shuffle queue."""
    topics = list(outputs)
    if stage.keeps_state:
        topics.append(layout.state_topic(stage))
    if stage.persist is not None:
        topics.append(layout.persist_topic(stage))
    for topic in topics:
        topic.discard_staged(task.task_id, below_epoch=epoch, keep=keep)
    if not stage.reads_source:
        layout.shuffle_topic(stage).discard_stale_temp_files(
            task.queue, tick_file_prefix(task.task_id), older_than_s=60.0, now=time.time()
        )
