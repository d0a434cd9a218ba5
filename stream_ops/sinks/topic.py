"""The ``topic`` sink kind (``Stream.to_topic``): records into a FileTopic another topology reads,
spread over its queues by a hash of each record, published after the commit."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import TYPE_CHECKING

from stream_ops.errors import TopologyDefinitionError
from stream_ops.hashing import partition_for
from stream_ops.topics.file_topic import FileTopic
from stream_ops.topology.sink_kinds import Record, SinkContext, SinkKind, SinkWriter
from stream_ops.topology.sink_paths import sink_owner

if TYPE_CHECKING:
    from stream_ops.topics.staged_output import StagedOutput
    from stream_ops.topology.plan import SinkSpec


class TopicWriter(SinkWriter):
    """One task's files in the sink's topic (named ``<topology id>.<sink>``, task, txid, epoch)."""

    def __init__(self, spec: SinkSpec, context: SinkContext) -> None:
        assert spec.path is not None and spec.queues is not None  # checked by TopicKind.check_spec
        self.task_id = context.task.task_id
        self.topic = FileTopic(
            spec.path, spec.queues, durable=context.durable, owner=sink_owner(context.layout.topology_id, spec.name)
        )

    def staged_outputs(self) -> list[StagedOutput]:
        return [self.topic]

    def stage_batch(self, txid: int, epoch: int, records: list[Record]) -> None:
        by_queue: dict[int, list[Record]] = defaultdict(list)
        for record in records:
            by_queue[partition_for([json.dumps(record, sort_keys=True, default=str)], self.topic.queues)].append(record)
        for queue, lines in sorted(by_queue.items()):
            self.topic.stage_batch(queue, self.task_id, txid, epoch, lines)


class TopicKind(SinkKind):
    """A FileTopic of ``spec.queues`` queues at ``spec.path``."""

    name = "topic"
    writes_directory = True
    asset_kinds = frozenset({"file"})

    def check_spec(self, spec: SinkSpec) -> None:
        super().check_spec(spec)
        if spec.path is None or spec.queues is None:
            raise TopologyDefinitionError(f"topic sink {spec.name!r}: needs a path and a number of queues")

    def writer(self, spec: SinkSpec, context: SinkContext) -> SinkWriter:
        return TopicWriter(spec, context)
