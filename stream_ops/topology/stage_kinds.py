"""The registry of stage kinds: what each kind of stage reads, keeps and runs.

A stage's ``kind`` names one entry here, and every layer asks the entry instead of switching
on the name: the plan (does it keep state?), the layout and the compiler (which topic and
which format does it read?), the runtime (which record processor runs its batches?) and the
Dagster layer (how is it described?). Adding a stage kind is one :func:`register_stage_kind`
call plus its processor class.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from stream_ops.registry import Registry
from stream_ops.topology.windows import WindowDef

if TYPE_CHECKING:
    from stream_ops.topology.plan import StageSpec

StageInput = Literal["source", "partials", "records"]
"""What a stage's input topic holds: the user's source records, partial aggregates shuffled
by key (``key``, ``value``) or whole records shuffled by key (``stream``, ``key``, ``record``)."""


@dataclass(frozen=True)
class StageKind:
    """One kind of stage.

    Attributes:
        name: the ``kind`` in the plan.
        reads: what its input topic holds (the source topic for ``"source"``, the stage's
            shuffle topic otherwise).
        keeps_state: whether its tasks keep state in RocksDB and the state topic (and so are
            rebuilt from it after a move).
        processor: ``"module:Class"`` of the record processor that runs its batches on the
            driver (constructed with the stage and the task's store), or None when the batch
            is computed by Spark alone (sources, keyed aggregates). Imported on the worker only.
        describe: a few words on what a stage of this kind does, for the UI.
    """

    name: str
    reads: StageInput
    keeps_state: bool
    processor: str | None
    describe: Callable[[StageSpec], str]


_KINDS: Registry[StageKind] = Registry("stage kind")


def register_stage_kind(kind: StageKind) -> StageKind:
    """Add ``kind`` to the registry (a name can be registered once)."""
    return _KINDS.register(kind.name, kind)


def stage_kind(name: str) -> StageKind:
    """The registered kind called ``name`` (raises TopologyDefinitionError for an unknown one)."""
    return _KINDS.get(name)


def stage_kinds() -> tuple[StageKind, ...]:
    """Every registered kind, in registration order."""
    return _KINDS.entries()


def _describe_source(stage: StageSpec) -> str:
    from stream_ops.sources import source_kind

    read = source_kind(stage.source.kind).describe(stage.source) if stage.source is not None else "a source"
    return f"reads {read}, applies {len(stage.operations)} record operations"


def _describe_keyed(stage: StageSpec) -> str:
    state = stage.state
    if state is None:
        return "a keyed stage"
    return f"keeps the {state.kind} map state `{state.name}` keyed by {', '.join(state.key_fields)}"


def _describe_aggregate(stage: StageSpec) -> str:
    spec = stage.batch_aggregate
    what = spec.aggregator.get("kind", "an aggregator") if spec is not None else "an aggregator"
    return f"combines each batch of stage(s) {list(stage.from_stages)} with {what} into one record"


def _describe_join(stage: StageSpec) -> str:
    return f"joins the records of stages {list(stage.from_stages)}"


def _describe_process(stage: StageSpec) -> str:
    pe = stage.process.pe_class if stage.process is not None else "a processing element"
    return f"runs `{pe}` per key"


def _describe_window(stage: StageSpec) -> str:
    spec = stage.window_aggregate
    if spec is None:
        return "a windowed aggregate"
    keys = f" per {', '.join(spec.key_fields)}" if spec.key_fields else ""
    return f"aggregates `{spec.value_field}`{keys} over {WindowDef.from_spec(spec.window).describe()}"


def _describe_partition(stage: StageSpec) -> str:
    return f"receives the records of stage(s) {list(stage.from_stages)} partitioned by key"


_PROCESSORS = "stream_ops.runtime.stage_processors"

register_stage_kind(StageKind("source", reads="source", keeps_state=False, processor=None, describe=_describe_source))
register_stage_kind(StageKind("keyed", reads="partials", keeps_state=True, processor=None, describe=_describe_keyed))
register_stage_kind(
    StageKind(
        "aggregate",
        reads="partials",
        keeps_state=False,
        processor=f"{_PROCESSORS}:BatchAggregateProcessor",
        describe=_describe_aggregate,
    )
)
register_stage_kind(
    StageKind("join", reads="records", keeps_state=True, processor=f"{_PROCESSORS}:JoinProcessor", describe=_describe_join)
)
register_stage_kind(
    StageKind(
        "process",
        reads="records",
        keeps_state=True,
        processor="stream_ops.runtime.process_stage:ProcessElementProcessor",
        describe=_describe_process,
    )
)
register_stage_kind(
    StageKind(
        "partition",
        reads="records",
        keeps_state=False,
        processor=f"{_PROCESSORS}:PartitionProcessor",
        describe=_describe_partition,
    )
)
register_stage_kind(
    StageKind(
        "window",
        reads="records",
        keeps_state=True,
        processor="stream_ops.runtime.window_stage:WindowAggregateProcessor",
        describe=_describe_window,
    )
)
