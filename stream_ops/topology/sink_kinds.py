"""The sink seam: what a kind of sink does with a plan's :class:`~stream_ops.topology.plan.SinkSpec`.

A sink spec is plain data in the plan; the :class:`SinkKind` registered under its ``format``
checks it, opens one task's :class:`SinkWriter` (which stages each batch's records under
(task, txid, epoch) and delivers what the published batches owe after the commit, see
:mod:`stream_ops.topics.staged_output`) and describes the sink to Dagster as plain data
(:class:`SinkAsset`; only :mod:`stream_ops.orchestration` imports dagster). Adding a sink is
one module with its kind and writer plus its registration in :mod:`stream_ops.sinks`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stream_ops.asset_metadata import AssetMetadata
from stream_ops.errors import TopologyDefinitionError
from stream_ops.registry import Registry

if TYPE_CHECKING:
    from stream_ops.topics.delivery_topic import DeliveryTopic
    from stream_ops.topics.staged_output import StagedOutput
    from stream_ops.topology.layout import TopologyLayout
    from stream_ops.topology.plan import SinkSpec, StageSpec, TaskSpec

Record = dict[str, Any]


@dataclass(frozen=True)
class SinkAsset:
    """How a sink describes itself to Dagster; the asset key and group are the translator's
    (:meth:`~stream_ops.orchestration.translator.StreamOpsTranslator.sink_asset_key`).

    Attributes:
        kinds: the asset's kinds (icons in the UI).
        where: what the sink writes, completing "The <format> sink `<name>` of topology `<t>`".
        metadata: kind-specific entries, after ``stream_ops/topology`` and ``stream_ops/sink_format``.
        committed_files_at: the directory of a sink whose committed files the heartbeat sensor
            materializes (a Parquet sink's ``_committed`` markers), None for the others.
    """

    kinds: frozenset[str]
    where: str = ""
    metadata: Mapping[str, AssetMetadata] = field(default_factory=dict)
    committed_files_at: str | None = None


@dataclass(frozen=True)
class SinkContext:
    """Where one task's writer of a sink writes: the task, its stage and the topology's layout."""

    layout: TopologyLayout
    stage: StageSpec
    task: TaskSpec

    @property
    def durable(self) -> bool:
        """Whether staged files are fsynced (``ClusterConfig.fsync``)."""
        return self.layout.cluster.fsync

    def delivery_topic(self, spec: SinkSpec) -> DeliveryTopic:
        """The task's queue of staged batches of a sink delivered after the commit."""
        return self.layout.sink_delivery_topic(self.stage, spec.name)


@dataclass(frozen=True)
class AfterPublish:
    """What a writer delivers after a publish: batches up to the task's committed txid.

    Attributes:
        committed_txid: the txid the caller, the owner, committed; a batch above it is a newer
            owner's.
        epoch: the caller's owner epoch, under which delivery markers are written (None: unfenced).
        verify_owner: raises (``OwnershipLostError``) once the caller no longer owns the task;
            for output no marker can fence (the log), called before the first line.
    """

    committed_txid: int
    epoch: int | None
    verify_owner: Callable[[], None]


class SinkWriter(ABC):
    """One task's writer of one sink: steps 3 and 6 of the commit protocol (DESIGN section 5).

    Attributes:
        delivers_unfenced: whether :meth:`after_publish` writes output no marker fences (the
            log); such writers deliver after the fenced ones.
    """

    delivers_unfenced: bool = False

    @abstractmethod
    def staged_outputs(self) -> list[StagedOutput]:
        """The outputs this writer stages files in (their sizes go into the commit)."""

    @abstractmethod
    def stage_batch(self, txid: int, epoch: int, records: list[Record]) -> None:
        """Stage a non-empty batch's records where no reader sees them, under (task, txid, epoch)."""

    def after_publish(self, publish: AfterPublish) -> None:
        """Deliver what the published batches owe (default: nothing; the publish shows them)."""

    def close(self) -> None:
        """Release the writer's clients (none mid-transaction between batches)."""


class SinkKind(ABC):
    """One kind of sink: how its spec is checked, written by a task and shown in Dagster.

    Attributes:
        name: the ``format`` in :class:`~stream_ops.topology.plan.SinkSpec`.
        writes_directory: whether the sink writes files under ``spec.path`` of its own, which
            no other sink may share (:mod:`stream_ops.topology.sink_paths`).
        asset_kinds: the kinds of its Dagster asset.
    """

    name: str
    writes_directory: bool = False
    asset_kinds: frozenset[str] = frozenset()

    def check_spec(self, spec: SinkSpec) -> None:
        """Raise :class:`TopologyDefinitionError` unless ``spec`` has what this kind needs.

        The default checks the format; kinds add their own fields.
        """
        if spec.format != self.name:
            raise TopologyDefinitionError(f"sink kind {self.name!r} was given a spec of format {spec.format!r}")

    def check_tasks(self, spec: SinkSpec, tasks: int, *, what: str, writers: str) -> None:
        """Raise :class:`TopologyDefinitionError` if ``tasks`` tasks may not write the sink, once
        the plan knows its counts. Default: any number may.

        Args:
            spec: the sink.
            tasks: how many tasks write it (of one stage).
            what: the sink, to start a message (``topology 't': sink 's'``).
            writers: the stage and its count, for a message (``stage 'x' runs 2 tasks (...)``).
        """

    @abstractmethod
    def writer(self, spec: SinkSpec, context: SinkContext) -> SinkWriter:
        """The writer of one task (created once per task, before its first batch)."""

    def asset(self, spec: SinkSpec) -> SinkAsset:
        """The sink's Dagster description (default: its kinds and path)."""
        where = f" at `{spec.path}`" if spec.path else ""
        metadata = {"stream_ops/path": AssetMetadata("path", spec.path)} if spec.path else {}
        return SinkAsset(kinds=self.asset_kinds, where=where, metadata=metadata)

    def summary(self, spec: SinkSpec) -> str:
        """What a stage writing the sink does, in a few words."""
        return f"writes the {self.name} sink `{spec.name}`"


# --- the registry --------------------------------------------------------------------------

_KINDS: Registry[SinkKind] = Registry("sink kind")


def register_sink_kind(kind: SinkKind) -> SinkKind:
    """Add ``kind`` to the registry under ``kind.name`` (a name can be registered once)."""
    return _KINDS.register(kind.name, kind)


def sink_kind(name: str) -> SinkKind:
    """The registered kind called ``name`` (raises TopologyDefinitionError for an unknown one)."""
    return _KINDS.get(name)


def sink_kinds() -> tuple[SinkKind, ...]:
    """Every registered kind, in registration order."""
    return _KINDS.entries()
