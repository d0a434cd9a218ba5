"""From a topology graph to stages and tasks (RocketMQ Streams' second and third builds).

A stage is cut at every shuffle. A stage reads a source topic or a shuffle topic, runs its
processor (none, a keyed aggregate, a windowed join or a processing element), then its record
operations, which form a tree: each operation reads the stage's input or one earlier operation
(a stream with two consumers is two operations reading the same one). Every output of the
stage *taps* one point of that tree: partial aggregates per key to a keyed stage, whole
records keyed by fields to a join/process/partition stage (both partitioned by
``stable_hash(key) % queues``), a partition_persist State, or a sink (Parquet files, a topic,
a user function, the log, a Kafka topic). Stages and their shuffles form a DAG; a merge of
streams is a stage read by several upstream stages. One task per (stage, queue); task ids are
integers over the whole topology, in stage order. The plan is plain data (JSON) so workers
rebuild it without the user's topology object.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from stream_ops.errors import TopologyDefinitionError
from stream_ops.kafka.sink_options import KafkaSinkSpec
from stream_ops.sources import SourceSpec
from stream_ops.topology.code_scope import CodeScope
from stream_ops.topology.sink_kinds import SinkKind, sink_kind
from stream_ops.topology.stage_kinds import StageKind, stage_kind


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


ShuffleFormat = Literal["json", "parquet"]
"""The formats of a stage's shuffle files: JSON lines (records) or Parquet (partial aggregates)."""


def shuffle_format_of(kind: str) -> ShuffleFormat:
    """The shuffle-file format a stage of ``kind`` reads: Parquet partials for a stage reading
    partial aggregates, JSON lines of records otherwise."""
    return "parquet" if stage_kind(kind).reads == "partials" else "json"


INPUT = -1
"""The tap of a stage's input records (for a records stage: what its processor emits)."""


class OperationSpec(_Frozen):
    """One record operation: ``each``, ``map``, ``filter``, ``peek`` of a referenced function,
    a ``state_query`` (``query`` names the state and the query function), or ``side``: the
    records of the stage processor's side stream ``side`` (late records, a named output
    stream), which operations and outputs read like any tap."""

    kind: Literal["each", "map", "filter", "peek", "state_query", "side", "select_expr", "where", "map_batches"]
    function: str
    side: str | None = None
    exprs: tuple[str, ...] = ()
    """``select_expr`` / ``where``: Spark SQL expressions, run in the JVM before the stage's
    Python operations (which see them as done)."""
    fields: tuple[str, ...] | None
    out: dict[str, str]
    query: dict[str, Any] | None = None
    input: int | None = None
    """Index of the operation whose output this one reads, :data:`INPUT` for the stage's input,
    None for the operation before it (a chain)."""
    code: CodeScope | None = Field(None, exclude=True)
    """The verified archive ``function`` resolves in (set by a worker, never in plan.json)."""


class ShuffleSpec(_Frozen):
    """How a stage partially aggregates and shuffles its records to a keyed stage."""

    kind: Literal["partials"] = "partials"
    tap: int | None = None
    """The operation whose output goes out (:data:`INPUT`: the stage's input; None: the last)."""
    to_stage: int
    queues: int
    key_fields: tuple[str, ...]
    aggregator: dict[str, Any]
    value_type: str


class RecordsSpec(_Frozen):
    """How a stage shuffles whole records to a join / process / partition stage."""

    kind: Literal["records"] = "records"
    tap: int | None = None
    to_stage: int
    queues: int
    key_fields: tuple[str, ...]
    stream: str
    broadcast_unkeyed: bool = False
    """A record whose key fields are all null goes to every queue (S4's broadcast of key-less
    events to a processing element's instances)."""
    progress: dict[str, str] | None = None
    """For an event-time window stage: ``{"timestamp_field", "timestamp_unit"}``; each batch
    then also tells every queue the largest event time it sent (a progress row), from which
    the window tasks take their watermark."""
    window_partials: dict[str, Any] | None = None
    """For an event-time tumbling or sliding window stage without ``idle_timeout``:
    ``{"window", "aggregator"}`` (the window stage's window and aggregator specs), so a
    source task may send partial aggregates per (window, key) of records it proves cannot be
    late there (:mod:`stream_ops.operators.window_partials`); None: whole records only."""

    @model_serializer(mode="wrap")
    def _without_no_partials(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # None is left out of the plan JSON (read back as None): plans without partials stay as they were.
        data: dict[str, Any] = handler(self)
        if self.window_partials is None:
            data.pop("window_partials", None)
        return data


class PersistSpec(_Frozen):
    """A partition_persist sink: a user State per task."""

    kind: Literal["persist"] = "persist"
    tap: int | None = None
    name: str
    factory: dict[str, Any]
    fields: tuple[str, ...]
    updater: dict[str, Any]
    emit_fields: dict[str, str] | None = None
    """The fields of the records the updater emits (``out=``)."""
    emits: RecordsSpec | None = None
    """Where the emitted records go (the stage of the state's ``new_values()``), if used."""


class SinkSpec(_Frozen):
    """Where a stream's records leave the topology, exactly once per txid.

    ``parquet``: files under ``path`` (hive-partitioned by ``partition_by``); ``topic``: a
    FileTopic of ``queues`` queues at ``path`` that another topology can read; ``function``:
    a user function called after each commit with the batch (``function`` is its reference,
    ``arity`` 2 for ``fn(txid, records)`` or 3 for ``fn(txid, records, partition)``);
    ``print``: records to the worker log after each commit; ``kafka``: each committed batch in
    one Kafka transaction (``kafka`` holds the options, see :mod:`stream_ops.kafka.sink`).
    ``format`` is a registered sink kind (:func:`stream_ops.topology.sink_kinds.sink_kind`), which checks the
    spec; a kind's own settings beyond these fields go in ``options`` (JSON values only).
    """

    kind: Literal["sink"] = "sink"
    tap: int | None = None
    name: str
    format: str
    fields: dict[str, str]
    path: str | None = None
    partition_by: tuple[str, ...] = ()
    queues: int | None = None
    function: str | None = None
    arity: int = 2
    kafka: KafkaSinkSpec | None = None
    options: dict[str, JsonValue] = {}
    code: CodeScope | None = Field(None, exclude=True)
    """The verified archive ``function`` resolves in (set by a worker, never in plan.json)."""

    @field_validator("format")
    @classmethod
    def _registered(cls, name: str) -> str:
        sink_kind(name)
        return name

    @model_validator(mode="after")
    def _checked_by_kind(self) -> SinkSpec:
        self.sink_kind.check_spec(self)
        return self

    @model_serializer(mode="wrap")
    def _without_empty_options(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # An empty ``options`` is left out of the plan JSON (read back as empty).
        data: dict[str, Any] = handler(self)
        if not self.options:
            data.pop("options", None)
        return data

    @property
    def sink_kind(self) -> SinkKind:
        """The registered kind of this sink (its ``format``)."""
        return sink_kind(self.format)


OutputSpec = Annotated[ShuffleSpec | RecordsSpec | PersistSpec | SinkSpec, Field(discriminator="kind")]


class ProcessSpec(_Frozen):
    """An S4 processing element stage."""

    pe_class: str
    key_field: str | dict[str, str | None] | None
    """The key field of the one input stream, or per input stream (None: key-less, broadcast)."""
    trigger: dict[str, Any] | None
    ttl_seconds: float | None
    timer_interval: float | None = None
    """Seconds between ``on_time()`` calls of each instance (S4's ``setTimerInterval``)."""
    max_instances: int | None = None
    """S4's PE cache size: the least recently used instance is removed beyond it."""
    singleton: bool = False
    """One instance for every record (S4's singleton PE)."""
    prototype: dict[str, Any] | None = None
    """The configured instance new keys' instances are copied from (its public fields)."""
    outputs: tuple[str, ...] = ()
    """Named output streams the instances may ``emit(..., stream=name)`` to."""
    code: CodeScope | None = Field(None, exclude=True)
    """The verified archive ``pe_class`` resolves in (set by a worker, never in plan.json)."""


class AggregateSpec(_Frozen):
    """A stage that combines each batch's partials into one value (``Stream.aggregate``)."""

    aggregator: dict[str, Any]
    value_field: str
    value_type: str


class WindowAggregateSpec(_Frozen):
    """A windowed aggregate stage (see :class:`stream_ops.topology.windows.WindowDef`)."""

    window: dict[str, Any]
    key_fields: tuple[str, ...]
    aggregator: dict[str, Any]
    value_field: str
    value_type: str


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
    window: dict[str, Any] | None = None
    null_keys: Literal["keep", "drop"] = "keep"
    output_stream: str | None = None

    def bolt_spec(self) -> dict[str, Any]:
        """The description :meth:`JoinBolt.from_spec` rebuilds the bolt from."""
        return self.model_dump(exclude_none=True) | {"window": self.window, "output_stream": self.output_stream}


RECORDS_FIELDS: dict[str, str] = {"stream": "string", "key": "string", "record": "string"}
"""What a records shuffle carries per line: input stream tag, encoded key, record as JSON."""


class StageSpec(_Frozen):
    """A stage: what it reads, what it does per record and where its results go.

    ``outputs`` are where its records go (see the module docstring); a keyed stage keeps its
    results in ``state``.
    """

    index: int
    name: str
    kind: str
    """A registered stage kind (:mod:`stream_ops.topology.stage_kinds`)."""
    queues: int
    source: SourceSpec | None = None
    """What a source stage reads (:mod:`stream_ops.sources`)."""
    input_fields: dict[str, str]
    fields: dict[str, str] = {}
    from_stages: tuple[int, ...] = ()
    operations: tuple[OperationSpec, ...] = ()
    outputs: tuple[OutputSpec, ...] = ()
    state: StateSpec | None = None
    batch_aggregate: AggregateSpec | None = None
    join: JoinSpec | None = None
    process: ProcessSpec | None = None
    window_aggregate: WindowAggregateSpec | None = None
    progress_channels: tuple[str, ...] = ()
    """An event-time window stage's upstream tasks (``"<stage>/<queue>"``): its watermark is
    the least event time they all reported (see :class:`~stream_ops.topology.windows.Watermark`)."""
    shuffle_format: ShuffleFormat
    """The format of the shuffle files the stage reads: ``parquet`` for a stage reading partial
    aggregates (:mod:`stream_ops.topics.shuffle_files`), ``json`` (JSON lines of records) for
    any other stage (see :func:`shuffle_format_of`)."""

    @field_validator("kind")
    @classmethod
    def _registered(cls, kind: str) -> str:
        stage_kind(kind)
        return kind

    @model_validator(mode="after")
    def _shuffle_format_of_kind(self) -> StageSpec:
        expected = shuffle_format_of(self.kind)
        if self.shuffle_format != expected:
            raise ValueError(
                f"stage {self.name!r} (kind {self.kind!r}) reads {expected} shuffle files, but the plan says "
                f"{self.shuffle_format!r}; this plan was not built by this stream_ops: resubmit the topology"
            )
        return self

    @model_validator(mode="after")
    def _event_time_channels_listed(self) -> StageSpec:
        if self.event_time and not self.progress_channels:
            raise ValueError(
                f"stage {self.name!r} (kind {self.kind!r}) has event-time windows, but the plan lists no "
                "progress_channels for its watermark; this plan was not built by this stream_ops: resubmit the topology"
            )
        return self

    @property
    def event_time(self) -> bool:
        """Whether the stage keeps an event-time watermark (an event-time window, or a JoinBolt
        ``with_timestamp_field``), so its upstream tasks report progress to it."""
        if self.window_aggregate is not None:
            return self.window_aggregate.window.get("time") == "event"
        window = (self.join.window if self.join is not None else None) or {}
        return window.get("timestamp_field") is not None

    @field_validator("source")
    @classmethod
    def _source_queues_known(cls, source: SourceSpec | None) -> SourceSpec | None:
        if source is not None and source.queues is None:
            raise ValueError("a plan's source spec gives its number of queues (build_plan learns it)")
        return source

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

    def input_of(self, op_index: int) -> int:
        """The tap operation ``op_index`` reads (:data:`INPUT` or an earlier operation)."""
        op = self.operations[op_index]
        return op_index - 1 if op.input is None else op.input

    def tap_of(self, output: OutputSpec) -> int:
        """The operation whose records ``output`` takes (:data:`INPUT` for the stage's input)."""
        return len(self.operations) - 1 if output.tap is None else output.tap

    def outputs_of(self, kind: type[Any]) -> list[Any]:
        """The outputs of one spec class, e.g. ``stage.outputs_of(SinkSpec)``."""
        return [o for o in self.outputs if isinstance(o, kind)]

    @property
    def persist(self) -> PersistSpec | None:
        """The stage's partition_persist output (a stage persists into at most one State)."""
        return next(iter(self.outputs_of(PersistSpec)), None)

    @property
    def shuffles(self) -> list[ShuffleSpec | RecordsSpec]:
        """Every shuffle out of this stage (a partition_persist's emitted records included)."""
        found: list[ShuffleSpec | RecordsSpec] = [o for o in self.outputs if isinstance(o, ShuffleSpec | RecordsSpec)]
        found += [o.emits for o in self.outputs if isinstance(o, PersistSpec) and o.emits is not None]
        return found

    @property
    def downstream(self) -> tuple[int, ...]:
        """Indices of the stages this stage's shuffles feed."""
        return tuple(sorted({o.to_stage for o in self.shuffles}))

    @property
    def source_path(self) -> str | None:
        """The path a source stage reads (None for sources without one, and other stages)."""
        return self.source.path if self.source is not None else None

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

    @model_validator(mode="after")
    def _a_dag(self) -> Plan:
        check_stage_graph(self.topology, self.stages)
        return self

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


def check_stage_graph(topology: str, stages: tuple[StageSpec, ...]) -> None:
    """Refuse a plan whose stages do not form a DAG or whose operations and outputs point
    nowhere (a hand-edited or corrupted plan; the DSL cannot build one).

    Raises:
        TopologyDefinitionError: naming the stage and the problem (for a cycle, its stages).
    """
    for position, stage in enumerate(stages):
        where = f"topology {topology!r} stage {stage.name!r}"
        if stage.index != position:
            raise TopologyDefinitionError(f"{where}: has index {stage.index} at position {position}")
        for i in range(len(stage.operations)):
            if not INPUT <= stage.input_of(i) < i:
                raise TopologyDefinitionError(f"{where}: operation {i} reads operation {stage.input_of(i)}, not an earlier one")
        for output in stage.outputs:
            if not INPUT <= stage.tap_of(output) < len(stage.operations):
                raise TopologyDefinitionError(f"{where}: an output taps operation {stage.tap_of(output)}, which is not there")
        for target in stage.downstream:
            if not 0 <= target < len(stages):
                raise TopologyDefinitionError(f"{where}: shuffles to stage {target}, which is not there")
    visiting: list[int] = []
    done: set[int] = set()

    def visit(index: int) -> None:
        if index in done:
            return
        if index in visiting:
            cycle = [stages[i].name for i in visiting[visiting.index(index) :]] + [stages[index].name]
            raise TopologyDefinitionError(f"topology {topology!r}: its stages form a cycle: {' -> '.join(cycle)}")
        visiting.append(index)
        for target in stages[index].downstream:
            visit(target)
        visiting.pop()
        done.add(index)

    for stage in stages:
        visit(stage.index)
