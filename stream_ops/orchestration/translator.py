"""How stream_ops objects are named and described in Dagster: the one translator.

Every asset key, group name and description the Dagster layer produces comes from
:class:`StreamOpsTranslator`; subclass it to change the naming scheme (e.g. a key prefix per
deployment) and pass the instance to :func:`~stream_ops.orchestration.assets.topology_assets`,
:func:`~stream_ops.orchestration.sensors.build_heartbeat_sensor` and
:func:`~stream_ops.orchestration.definitions.build_definitions`. Names are deterministic:
they depend only on the topology and stage names, never on a submission's id.

Example:
    >>> class Prefixed(StreamOpsTranslator):
    ...     def submission_asset_key(self, topology_name: str) -> dg.AssetKey:
    ...         return dg.AssetKey(["prod", topology_name, "submission"])
    >>> Prefixed().submission_asset_key("wordcount").to_user_string()
    'prod/wordcount/submission'
"""

from __future__ import annotations

import re

import dagster as dg

from stream_ops.sources import SourceSpec, source_kind
from stream_ops.topology.plan import PersistSpec, Plan, RecordsSpec, ShuffleSpec, StageSpec

__all__ = ["StreamOpsTranslator", "python_identifier", "source_key", "stage_summary"]

_NOT_IDENTIFIER = re.compile(r"[^A-Za-z0-9_]")


def python_identifier(text: str) -> str:
    """``text`` with every character Dagster does not allow in names replaced by ``_``."""
    return _NOT_IDENTIFIER.sub("_", text)


def source_key(prefix: tuple[str, ...] | list[str], source: SourceSpec) -> dg.AssetKey | None:
    """The default key of a source's asset under ``prefix`` (see :class:`StreamOpsTranslator`):
    the key parts of its kind's :meth:`~stream_ops.sources.SourceKind.asset`, None without one.

    Example:
        >>> from stream_ops.sources import SourceSpec
        >>> source_key(("stream_ops",), SourceSpec(kind="file_topic", path="/data/sentences", fields={"s": "string"}))
        AssetKey(['stream_ops', 'topic', 'data', 'sentences'])
    """
    asset = source_kind(source.kind).asset(source)
    return dg.AssetKey([*prefix, *asset.key_parts]) if asset is not None else None


def stage_summary(stage: StageSpec) -> str:
    """What a stage does, in a few words (for descriptions and plan tables)."""
    parts = [stage.kind_info.describe(stage)]
    for output in stage.outputs:
        if isinstance(output, ShuffleSpec):
            parts.append(f"shuffles partial aggregates to stage {output.to_stage}")
        elif isinstance(output, RecordsSpec):
            parts.append(f"shuffles records to stage {output.to_stage}")
        elif isinstance(output, PersistSpec):
            parts.append(f"persists into `{output.name}`")
        else:
            parts.append(output.sink_kind.summary(output))
    return ", ".join(parts)


class StreamOpsTranslator:
    """Maps topologies and their stages to Dagster asset keys, groups and descriptions.

    Defaults:

    * submission asset: ``stream_ops/<topology>/submission``
    * stream asset of a stage: ``stream_ops/<topology>/<stage>``
    * state asset of a stage that keeps state: ``stream_ops/<topology>/<stage>_state``
      (partitioned by queue)
    * health overview of a topology: ``stream_ops/<topology>/health``
    * source of a source stage (an external asset, shared by every topology reading it):
      ``stream_ops/kafka/<topic>`` for a Kafka topic, ``stream_ops/topic/<parent>/<directory>``
      for a FileTopic (its directory and the one above), ``stream_ops/files/<parent>/<directory>``
      for landed Parquet/CSV/JSON files (the key parts of :meth:`stream_ops.sources.SourceKind.asset`);
      a generated source (``RateSource``) has none
    * group: the topology name with ``-`` replaced by ``_``; sources: ``stream_ops_sources``

    Subclasses must keep keys unique per (topology, stage) and stable across deployments,
    since observation history in Dagster is keyed by them.
    """

    key_prefix: tuple[str, ...] = ("stream_ops",)

    def submission_asset_key(self, topology_name: str) -> dg.AssetKey:
        """Key of the asset whose materialization submits ``topology_name``."""
        return dg.AssetKey([*self.key_prefix, topology_name, "submission"])

    def stream_asset_key(self, topology_name: str, stage_name: str) -> dg.AssetKey:
        """Key of the observed stream asset of one stage of ``topology_name``."""
        return dg.AssetKey([*self.key_prefix, topology_name, stage_name])

    def sink_asset_key(self, topology_name: str, sink_name: str) -> dg.AssetKey:
        """Key of the external asset of one sink of ``topology_name``."""
        return dg.AssetKey([*self.key_prefix, topology_name, "sinks", sink_name])

    def state_asset_key(self, topology_name: str, stage_name: str) -> dg.AssetKey:
        """Key of the queue-partitioned state snapshot asset of one stage that keeps state."""
        return dg.AssetKey([*self.key_prefix, topology_name, f"{stage_name}_state"])

    def health_asset_key(self, topology_name: str) -> dg.AssetKey:
        """Key of the health overview asset of ``topology_name`` (tasks table, one-word health)."""
        return dg.AssetKey([*self.key_prefix, topology_name, "health"])

    def source_asset_key(self, topology_name: str, source: SourceSpec) -> dg.AssetKey | None:
        """Key of the external asset a source stage of ``topology_name`` reads; None: no asset.

        The key does not name the topology, so every topology reading the same topic or
        directory depends on the same asset.
        """
        return source_key(self.key_prefix, source)

    def group_name(self, topology_name: str) -> str | None:
        """Asset group holding all assets of ``topology_name`` (must be a valid Dagster name)."""
        return python_identifier(topology_name)

    def source_group_name(self) -> str | None:
        """Asset group of the source assets (shared by topologies, so not a topology's group)."""
        return "stream_ops_sources"

    def state_description(self, plan: Plan, stage: StageSpec) -> str:
        """Description of the state snapshot asset of ``stage`` (a stage that keeps state)."""
        state = stage.state
        kind = f"{state.kind} map state `{state.name}`" if state is not None else f"{stage.kind} state"
        return (
            f"Compacted snapshot of the {kind} of stage `{stage.name}` of topology `{plan.topology}`, one "
            f"partition per queue ({stage.queues}). Materializing a partition replays that queue's state topic "
            "up to the task's committed txid into a Parquet table (columns key, value; readable by Spark, DuckDB "
            "or pandas); a backfill over all partitions rebuilds every snapshot."
        )

    def description(self, plan: Plan, stage: StageSpec | None = None) -> str:
        """Description of the submission asset (``stage`` is None) or of one stage's stream asset."""
        if stage is None:
            stages = ", ".join(f"{s.name} ({s.kind}, {s.queues} queues)" for s in plan.stages)
            return (
                f"Submission of topology `{plan.topology}` to the stream_ops cluster: {len(plan.stages)} stages "
                f"({stages}), {len(plan.tasks)} tasks. Materializing submits it if no live submission of that "
                "name exists, and otherwise reports the running one."
            )
        what = stage_summary(stage)
        return (
            f"Stage {stage.index} `{stage.name}` of topology `{plan.topology}` ({stage.kind}, {stage.queues} queues): "
            f"{what}. Observed by the heartbeat sensor: health, heartbeat ages, committed txids, rows/s, lag, "
            "dead letters."
        )
