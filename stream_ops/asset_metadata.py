"""One metadata entry of a connector's Dagster asset, as plain data.

Sources (:class:`~stream_ops.sources.SourceAsset`) and sinks (:class:`~stream_ops.topology.sink_kinds.SinkAsset`)
describe themselves with it; only :mod:`stream_ops.orchestration` imports dagster and turns it
into a ``dagster.MetadataValue``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["AssetMetadata"]


@dataclass(frozen=True)
class AssetMetadata:
    """One metadata entry of a connector's Dagster asset, as plain data.

    Attributes:
        type: how Dagster shows it (``dagster.MetadataValue.text``, ``path``, ``int``, ``json``).
        value: the value.
    """

    type: Literal["text", "path", "int", "json"]
    value: Any
