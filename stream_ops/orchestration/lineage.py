"""Source assets: what a topology reads, upstream of its source stages in the asset graph.

Each source stage reads a Kafka topic, a FileTopic or a directory of landed files. Each of
those is an external asset (:class:`dagster.AssetSpec`, nothing materializes it) whose kinds,
description and metadata come from its source kind (:meth:`stream_ops.sources.SourceKind.asset`,
plain data), keyed by the
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
    >>> from stream_ops.dsl.build_plan import build_plan
    >>> plan = build_plan(build_wordcount("/data/sentences"))
    >>> [spec.key.to_user_string() for spec in source_asset_specs(plan).values()]
    ['stream_ops/topic/data/sentences']
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import dagster as dg

from stream_ops.errors import TopologyDefinitionError
from stream_ops.orchestration.sinks import dagster_metadata
from stream_ops.orchestration.translator import StreamOpsTranslator
from stream_ops.sources import SourceAsset, SourceSpec, source_kind
from stream_ops.topology.plan import Plan

__all__ = ["merge_source_specs", "source_asset_specs", "source_identity"]


def source_identity(source: SourceSpec) -> dict[str, Any]:
    """What identifies the input a source reads (the same for every topology reading it), from
    its kind (:meth:`~stream_ops.sources.SourceKind.identity`).

    Kafka: the bootstrap servers and the topic; file sources: the kind and the path.
    """
    return source_kind(source.kind).identity(source)


def _source_spec(key: dg.AssetKey, source: SourceSpec, asset: SourceAsset, translator: StreamOpsTranslator) -> dg.AssetSpec:
    metadata: dict[str, Any] = {
        "stream_ops/source_kind": dg.MetadataValue.text(source.kind),
        "stream_ops/queues": dg.MetadataValue.int(source.known_queues()),
    }
    if source.path is not None:
        metadata["stream_ops/path"] = dg.MetadataValue.path(source.path)
    metadata.update(dagster_metadata(asset.metadata))
    return dg.AssetSpec(
        key=key,
        description=asset.description,
        group_name=translator.source_group_name(),
        kinds=set(asset.kinds),
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
        asset = source_kind(stage.source.kind).asset(stage.source)
        if key is not None and asset is not None:
            found[stage.index] = _source_spec(key, stage.source, asset, translator)
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
