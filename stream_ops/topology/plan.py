"""From a topology graph to stages and tasks (RocketMQ Streams' second and third builds).

A stage is cut at every shuffle: the stage that reads a source applies the record operations,
partially aggregates per key and writes a shuffle topic partitioned by
``stable_hash(key) % queues``; the keyed stage reads one shuffle queue per task and keeps the
state. One task per (stage, queue); task ids are integers over the whole topology, in stage
order. The plan is plain data (JSON) so workers rebuild it without the user's topology object.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from stream_ops.errors import TopologyDefinitionError
from stream_ops.topology.dsl import Topology


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class OperationSpec(_Frozen):
    """One record operation: ``each``, ``map`` or ``filter`` of a referenced function."""

    kind: Literal["each", "map", "filter"]
    function: str
    fields: tuple[str, ...] | None
    out: dict[str, str]


class ShuffleSpec(_Frozen):
    """How a stage partially aggregates and shuffles its records to a keyed stage."""

    to_stage: int
    queues: int
    key_fields: tuple[str, ...]
    aggregator: dict[str, Any]
    value_type: str


class StateSpec(_Frozen):
    """The keyed map state a stage keeps."""

    name: str
    kind: Literal["transactional", "opaque", "non-transactional"]
    key_fields: tuple[str, ...]
    value_field: str
    aggregator: dict[str, Any]
    value_type: str


class StageSpec(_Frozen):
    """A stage: what it reads, what it does per record and where its results go."""

    index: int
    name: str
    kind: Literal["source", "keyed"]
    queues: int
    source_path: str | None = None
    input_fields: dict[str, str]
    operations: tuple[OperationSpec, ...] = ()
    shuffle: ShuffleSpec | None = None
    state: StateSpec | None = None
    from_stage: int | None = None


class TaskSpec(_Frozen):
    """One task: a (stage, queue) pair, run as one Spark streaming query."""

    task_id: int
    stage: int
    queue: int


class QuerySpec(_Frozen):
    """A state query: which stage's state it reads."""

    name: str
    stage: int
    key_fields: tuple[str, ...]


class Plan(_Frozen):
    """The physical plan of a topology."""

    topology: str
    stages: tuple[StageSpec, ...]
    tasks: tuple[TaskSpec, ...]
    queries: dict[str, QuerySpec]

    def stage(self, index: int) -> StageSpec:
        return self.stages[index]

    def task(self, task_id: int) -> TaskSpec:
        for task in self.tasks:
            if task.task_id == task_id:
                return task
        raise KeyError(f"plan of {self.topology!r} has no task {task_id}")

    def task_for(self, stage: int, queue: int) -> TaskSpec:
        for task in self.tasks:
            if task.stage == stage and task.queue == queue:
                return task
        raise KeyError(f"plan of {self.topology!r} has no task for stage {stage} queue {queue}")

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    @classmethod
    def from_json(cls, text: str | bytes) -> Plan:
        return cls.model_validate_json(text)


def build_plan(topology: Topology) -> Plan:
    """Cut ``topology`` into stages and tasks.

    Raises:
        TopologyDefinitionError: the topology has no source, or a stream ends without
            anything that keeps its results.
    """
    chains = topology.chains
    if not chains:
        raise TopologyDefinitionError(f"topology {topology.name!r} has no source; add one with topology.source(...)")
    stages: list[StageSpec] = []
    state_stage: dict[str, int] = {}
    for chain in chains:
        agg = chain.aggregate
        if agg is None:
            raise TopologyDefinitionError(
                f"topology {topology.name!r}: the stream of source {chain.source.name!r} ends without "
                "persistent_aggregate, so nothing would be kept; group_by(...).persistent_aggregate(...) it"
            )
        source_index = len(stages)
        keyed_index = source_index + 1
        operations = tuple(
            OperationSpec(kind=op.kind, function=op.function, fields=op.fields, out=op.out)  # type: ignore[arg-type]
            for op in chain.operations
        )
        aggregator_spec = agg.aggregator.to_spec()
        stages.append(
            StageSpec(
                index=source_index,
                name=chain.source.name,
                kind="source",
                queues=chain.source.topic.queues,
                source_path=str(chain.source.topic.path),
                input_fields=chain.source.schema,
                operations=operations,
                shuffle=ShuffleSpec(
                    to_stage=keyed_index,
                    queues=agg.queues,
                    key_fields=agg.group_fields,
                    aggregator=aggregator_spec,
                    value_type=agg.value_type,
                ),
            )
        )
        stages.append(
            StageSpec(
                index=keyed_index,
                name=agg.name,
                kind="keyed",
                queues=agg.queues,
                input_fields={"key": "string", "value": agg.value_type},
                from_stage=source_index,
                state=StateSpec(
                    name=agg.name,
                    kind=agg.state_kind,  # type: ignore[arg-type]
                    key_fields=agg.group_fields,
                    value_field=agg.out,
                    aggregator=aggregator_spec,
                    value_type=agg.value_type,
                ),
            )
        )
        state_stage[agg.name] = keyed_index
    tasks: list[TaskSpec] = []
    for stage in stages:
        for queue in range(stage.queues):
            tasks.append(TaskSpec(task_id=len(tasks), stage=stage.index, queue=queue))
    queries = {
        name: QuerySpec(name=name, stage=state_stage[handle.name], key_fields=handle.keys)
        for name, handle in topology.queries.items()
    }
    return Plan(topology=topology.name, stages=tuple(stages), tasks=tuple(tasks), queries=queries)
