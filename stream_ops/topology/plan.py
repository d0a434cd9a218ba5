"""From a topology graph to stages and tasks (RocketMQ Streams' second and third builds).

A stage is cut at every shuffle. A stage reads a source topic or a shuffle topic, runs its
processor (none, a keyed aggregate, a windowed join or a processing element), then its record
operations, and ends in one output: partial aggregates per key to a keyed stage, whole
records keyed by a field to a join/process/partition stage (both partitioned by
``stable_hash(key) % queues``), or a partition_persist sink. Keyed stages end in their state. One task per (stage, queue); task ids are integers over the whole topology, in stage
order. The plan is plain data (JSON) so workers rebuild it without the user's topology object.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from stream_ops.errors import TopologyDefinitionError
from stream_ops.topology.code_scope import CodeScope
from stream_ops.topology.dsl import Segment, Topology
from stream_ops.topology.stage_kinds import StageKind, stage_kind


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class OperationSpec(_Frozen):
    """One record operation: ``each``, ``map``, ``filter`` of a referenced function, or a
    ``state_query`` (``query`` names the state and the query function)."""

    kind: Literal["each", "map", "filter", "state_query"]
    function: str
    fields: tuple[str, ...] | None
    out: dict[str, str]
    query: dict[str, Any] | None = None
    code: CodeScope | None = Field(None, exclude=True)
    """The verified archive ``function`` resolves in (set by a worker, never in plan.json)."""


class ShuffleSpec(_Frozen):
    """How a stage partially aggregates and shuffles its records to a keyed stage."""

    to_stage: int
    queues: int
    key_fields: tuple[str, ...]
    aggregator: dict[str, Any]
    value_type: str


class RecordsSpec(_Frozen):
    """How a stage shuffles whole records to a join / process / partition stage."""

    to_stage: int
    queues: int
    key_fields: tuple[str, ...]
    stream: str


class PersistSpec(_Frozen):
    """A partition_persist sink: a user State per task."""

    name: str
    factory: dict[str, Any]
    fields: tuple[str, ...]
    updater: dict[str, Any]


class ProcessSpec(_Frozen):
    """An S4 processing element stage."""

    pe_class: str
    key_field: str
    trigger: dict[str, Any] | None
    ttl_seconds: float | None
    code: CodeScope | None = Field(None, exclude=True)
    """The verified archive ``pe_class`` resolves in (set by a worker, never in plan.json)."""


class StateSpec(_Frozen):
    """The keyed map state a stage keeps."""

    name: str
    kind: Literal["transactional", "opaque", "non-transactional"]
    key_fields: tuple[str, ...]
    value_field: str
    aggregator: dict[str, Any]
    value_type: str


class JoinClauseSpec(_Frozen):
    """One stream of a JoinBolt: the first names only its field, the others how they join."""

    stream: str
    field: str
    prior: str | None = None
    how: str | None = None


class JoinSpec(_Frozen):
    """A JoinBolt stage (see :meth:`stream_ops.operators.join_bolt.JoinBolt.to_spec`)."""

    kind: Literal["JoinBolt"] = "JoinBolt"
    streams: tuple[JoinClauseSpec, ...]
    select: tuple[str, ...]
    window: dict[str, float | int | None] | None = None
    output_stream: str | None = None

    def bolt_spec(self) -> dict[str, Any]:
        """The description :meth:`JoinBolt.from_spec` rebuilds the bolt from."""
        return self.model_dump(exclude_none=True) | {"window": self.window, "output_stream": self.output_stream}


RECORDS_FIELDS: dict[str, str] = {"stream": "string", "key": "string", "record": "string"}
"""What a records shuffle carries per line: input stream tag, encoded key, record as JSON."""


class StageSpec(_Frozen):
    """A stage: what it reads, what it does per record and where its results go.

    Exactly one output is set for stages that are not keyed: ``shuffle`` (partial aggregates
    to a keyed stage), ``records`` (records to a join/process/partition stage) or ``persist``.
    """

    index: int
    name: str
    kind: str
    """A registered stage kind (:mod:`stream_ops.topology.stage_kinds`)."""
    queues: int
    source_path: str | None = None
    input_fields: dict[str, str]
    fields: dict[str, str] = {}
    from_stages: tuple[int, ...] = ()
    operations: tuple[OperationSpec, ...] = ()
    shuffle: ShuffleSpec | None = None
    records: RecordsSpec | None = None
    persist: PersistSpec | None = None
    state: StateSpec | None = None
    join: JoinSpec | None = None
    process: ProcessSpec | None = None

    @field_validator("kind")
    @classmethod
    def _registered(cls, kind: str) -> str:
        stage_kind(kind)
        return kind

    @property
    def kind_info(self) -> StageKind:
        """The registry entry of this stage's kind."""
        return stage_kind(self.kind)

    @property
    def from_stage(self) -> int | None:
        return self.from_stages[0] if self.from_stages else None

    @property
    def keeps_state(self) -> bool:
        """Whether the stage's tasks keep state in RocksDB + the state topic."""
        return self.kind_info.keeps_state

    @property
    def reads_source(self) -> bool:
        """Whether the stage reads a user source topic (else its shuffle topic)."""
        return self.kind_info.reads == "source"


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
    states: dict[str, int] = {}
    """State name -> index of the stage that keeps it (for state_query)."""
    code: CodeScope | None = Field(None, exclude=True)
    """The verified code archive every reference of this plan is bound to (see
    :func:`stream_ops.topology.plan_code.bind_plan`); None for a plan as submitted."""

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


def _stage(segment: Segment, topology: Topology) -> StageSpec:
    operations = tuple(
        OperationSpec(kind=op.kind, function=op.function, fields=op.fields, out=op.out, query=op.query)
        for op in segment.operations
    )
    out = segment.output or {}
    shuffle = records = persist = None
    if out.get("kind") == "partials":
        agg = topology.segments[out["to_stage"]].aggregate
        assert agg is not None
        shuffle = ShuffleSpec(
            to_stage=out["to_stage"],
            queues=out["queues"],
            key_fields=tuple(out["key_fields"]),
            aggregator=agg.aggregator.to_spec(),
            value_type=agg.value_type,
        )
    elif out.get("kind") == "records":
        records = RecordsSpec(
            to_stage=out["to_stage"], queues=out["queues"], key_fields=tuple(out["key_fields"]), stream=out["stream"]
        )
    elif out.get("kind") == "persist":
        persist = PersistSpec(name=out["name"], factory=out["factory"], fields=tuple(out["fields"]), updater=out["updater"])
    state = None
    if segment.aggregate is not None:
        agg = segment.aggregate
        state = StateSpec(
            name=agg.name,
            kind=agg.state_kind,
            key_fields=agg.group_fields,
            value_field=agg.out,
            aggregator=agg.aggregator.to_spec(),
            value_type=agg.value_type,
        )
    if segment.kind == "source":
        assert segment.source is not None
        input_fields = dict(segment.source.schema)
    elif segment.kind == "keyed":
        assert segment.aggregate is not None
        input_fields = {"key": "string", "value": segment.aggregate.value_type}
    else:
        input_fields = dict(RECORDS_FIELDS)
    process = None
    if segment.process is not None:
        p = segment.process
        process = ProcessSpec(pe_class=p.pe_class, key_field=p.key_field, trigger=p.trigger, ttl_seconds=p.ttl_seconds)
    return StageSpec(
        index=segment.index,
        name=segment.name,
        kind=segment.kind,
        queues=segment.queues,
        source_path=str(segment.source.topic.path) if segment.source else None,
        input_fields=input_fields,
        fields=dict(segment.fields),
        from_stages=tuple(i for i, _ in segment.inputs),
        operations=operations,
        shuffle=shuffle,
        records=records,
        persist=persist,
        state=state,
        join=JoinSpec.model_validate(segment.join) if segment.join is not None else None,
        process=process,
    )


def build_plan(topology: Topology) -> Plan:
    """Cut ``topology`` into stages and tasks.

    Raises:
        TopologyDefinitionError: the topology has no source, or a stream ends without
            anything that keeps its results.
    """
    segments = topology.segments
    if not any(s.kind == "source" for s in segments):
        raise TopologyDefinitionError(f"topology {topology.name!r} has no source; add one with topology.source(...)")
    for segment in segments:
        if segment.kind != "keyed" and segment.output is None:
            raise TopologyDefinitionError(
                f"topology {topology.name!r}: the stream of stage {segment.name!r} ends without persistent_aggregate "
                "or partition_persist, so nothing would be kept; group_by(...).persistent_aggregate(...) or "
                "partition_persist(...) it"
            )
    stages = tuple(_stage(segment, topology) for segment in segments)
    tasks: list[TaskSpec] = []
    for stage in stages:
        for queue in range(stage.queues):
            tasks.append(TaskSpec(task_id=len(tasks), stage=stage.index, queue=queue))
    queries = {
        name: QuerySpec(name=name, stage=handle.stage, key_fields=handle.keys) for name, handle in topology.queries.items()
    }
    states = {name: handle.stage for name, handle in topology.states.items()}
    return Plan(topology=topology.name, stages=stages, tasks=tuple(tasks), queries=queries, states=states)
