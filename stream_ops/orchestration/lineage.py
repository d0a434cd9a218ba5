"""Source assets: what a topology reads, upstream of its source stages in the asset graph.

Each source stage reads a Kafka topic, a FileTopic or a directory of landed files. Each of
those is an external asset (:class:`dagster.AssetSpec`, nothing materializes it), keyed by the
translator (:meth:`~stream_ops.orchestration.translator.StreamOpsTranslator.source_asset_key`:
``stream_ops/kafka/<topic>``, ``stream_ops/topic/<parent>/<directory>``,
``stream_ops/files/<parent>/<directory>``),
and the source stage's stream asset depends on it. With the stages' dependencies on the stages
they read, the state assets' on their stage and the sinks' on the stages writing them, the
asset graph draws the topology: inputs, stages, state and outputs.

The key names the topic or directory, not the topology, so topologies reading the same input
share its asset; :func:`merge_source_specs` keeps one spec per key and refuses two different
inputs that would get the same key (e.g. ``/a/input/sentences`` and ``/b/input/sentences``).

Example:
    >>> from stream_ops.examples.wordcount import build_wordcount
    >>> from stream_ops.topology.plan import build_plan
    >>> plan = build_plan(build_wordcount("/data/sentences"))
    >>> [spec.key.to_user_string() for spec in source_asset_specs(plan).values()]
    ['stream_ops/topic/data/sentences']
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import dagster as dg

from stream_ops.errors import TopologyDefinitionError
from stream_ops.orchestration.translator import StreamOpsTranslator
from stream_ops.sources import SourceSpec
from stream_ops.topology.plan import Plan

__all__ = ["merge_source_specs", "source_asset_specs", "source_identity"]

#: Source kind -> the asset kinds (icons in the UI) of its asset.
_KINDS: Mapping[str, set[str]] = {
    "kafka_topic": {"kafka"},
    "file_topic": {"files"},
    "parquet_files": {"parquet"},
    "csv_files": {"csv"},
    "json_files": {"json"},
}


def source_identity(source: SourceSpec) -> dict[str, Any]:
    """What identifies the input a source reads (the same for every topology reading it).

    Kafka: the bootstrap servers and the topic; file sources: the kind and the path.
    """
    if source.kind == "kafka_topic":
        return {"kind": source.kind, "bootstrap": source.options.get("bootstrap"), "topic": source.options.get("topic")}
    return {"kind": source.kind, "path": source.path}


def _description(source: SourceSpec) -> str:
    if source.kind == "kafka_topic":
        return (
            f"Kafka topic `{source.options.get('topic')}` on `{source.options.get('bootstrap')}` ({source.queues} "
            "partitions), read by the stream_ops topologies downstream (one task per partition)."
        )
    if source.kind == "file_topic":
        return (
            f"FileTopic `{source.path}` ({source.queues} queues): JSON-lines files the stream_ops topologies "
            "downstream read, one task per queue."
        )
    return f"Directory `{source.path}` of landed {source.kind.removesuffix('_files')} files read by the stream_ops topologies downstream."


def _source_spec(key: dg.AssetKey, source: SourceSpec, translator: StreamOpsTranslator) -> dg.AssetSpec:
    identity = source_identity(source)
    metadata: dict[str, Any] = {
        "stream_ops/source_kind": dg.MetadataValue.text(source.kind),
        "stream_ops/queues": dg.MetadataValue.int(source.known_queues()),
    }
    if source.path is not None:
        metadata["stream_ops/path"] = dg.MetadataValue.path(source.path)
    if source.kind == "kafka_topic":
        metadata["stream_ops/kafka_topic"] = dg.MetadataValue.text(str(identity["topic"]))
        metadata["stream_ops/kafka_bootstrap"] = dg.MetadataValue.text(str(identity["bootstrap"]))
    return dg.AssetSpec(
        key=key,
        description=_description(source),
        group_name=translator.source_group_name(),
        kinds=_KINDS.get(source.kind, set()),
        metadata=metadata,
    )


def source_asset_specs(plan: Plan, translator: StreamOpsTranslator | None = None) -> dict[int, dg.AssetSpec]:
    """Stage index -> the external asset of what that source stage reads (stages with one only).

    Args:
        plan: The topology's plan.
        translator: Naming of keys and groups; default :class:`StreamOpsTranslator`.

    Raises:
        TopologyDefinitionError: Two source stages of the plan read different inputs that the
            translator gives the same key.
    """
    translator = translator or StreamOpsTranslator()
    found: dict[int, dg.AssetSpec] = {}
    for stage in plan.stages:
        if stage.source is None:
            continue
        key = translator.source_asset_key(plan.topology, stage.source)
        if key is not None:
            found[stage.index] = _source_spec(key, stage.source, translator)
    merge_source_specs(found.values())  # refuses clashing inputs within one topology
    return found


def merge_source_specs(specs: Iterable[dg.AssetSpec]) -> list[dg.AssetSpec]:
    """One spec per key, in first-seen order (topologies reading the same input share it).

    Raises:
        TopologyDefinitionError: Two specs have the same key but describe different inputs.
    """
    merged: dict[dg.AssetKey, dg.AssetSpec] = {}
    for spec in specs:
        seen = merged.get(spec.key)
        if seen is None:
            merged[spec.key] = spec
        elif seen != spec:
            raise TopologyDefinitionError(
                f"two different inputs get the source asset key {spec.key.to_user_string()!r}: "
                f"{seen.description!r} and {spec.description!r}; rename a directory or override "
                "StreamOpsTranslator.source_asset_key"
            )
    return list(merged.values())
