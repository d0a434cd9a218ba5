"""Dagster assets of a topology's sinks, and the materializations the heartbeat sensor records.

Every sink of a plan (``to_parquet``, ``to_topic``, ``to_kafka``, ``sink``, ``print``, any
registered kind) is an external asset (:class:`dagster.AssetSpec`) downstream of the stream
assets of the stages that write it, so the lineage graph runs from sources to sinks. Its kinds,
description and metadata come from its sink kind (:meth:`stream_ops.topology.sink_kinds.SinkKind.asset`);
its key and group from the translator. A Parquet sink is *materialized* by the
heartbeat sensor whenever a task committed new files: the metadata gives the committed rows
and files, the last txid per task and a preview of the newest file, read from the sink's
``_committed`` markers (only committed files count). A Kafka sink's asset (kind ``kafka``) names
its topic, bootstrap servers, progress topic and transactional-id prefix, and the names of the
client settings it passes, never their values (they may hold secrets).

Note: this module does not use ``from __future__ import annotations`` for symmetry with the
other Dagster modules (Dagster reads annotations of decorated functions at definition time).
"""

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg

from stream_ops.asset_metadata import AssetMetadata
from stream_ops.kafka.sink_options import KafkaSinkSpec
from stream_ops.orchestration.markdown import cell
from stream_ops.orchestration.markdown import table as markdown_table
from stream_ops.orchestration.translator import StreamOpsTranslator
from stream_ops.sinks import committed_files, committed_markers
from stream_ops.sinks.kafka import kafka_asset_metadata
from stream_ops.topology.plan import Plan, SinkSpec

__all__ = [
    "ParquetSinkWatch",
    "dagster_metadata",
    "kafka_sink_metadata",
    "observe_parquet_sinks",
    "parquet_sink_metadata",
    "sink_asset_specs",
]

logger = logging.getLogger(__name__)

_PREVIEW_ROWS = 5
_METADATA_VALUES: dict[str, Callable[[Any], dg.MetadataValue]] = {
    "text": dg.MetadataValue.text,
    "path": dg.MetadataValue.path,
    "int": dg.MetadataValue.int,
    "json": dg.MetadataValue.json,
}


@dataclass(frozen=True)
class ParquetSinkWatch:
    """A Parquet sink the heartbeat sensor materializes: its asset key and directory."""

    asset_key: dg.AssetKey
    path: str


def sink_asset_specs(plan: Plan, translator: StreamOpsTranslator) -> tuple[list[dg.AssetSpec], list[ParquetSinkWatch]]:
    """One external asset per sink of ``plan`` (a merged stream's sink is written by several
    stages: one asset, depending on each), and the Parquet sinks to watch."""
    writers: dict[str, list[str]] = {}
    sinks: dict[str, SinkSpec] = {}
    for stage in plan.stages:
        for sink in stage.outputs_of(SinkSpec):
            sinks.setdefault(sink.name, sink)
            writers.setdefault(sink.name, []).append(stage.name)
    specs: list[dg.AssetSpec] = []
    watches: list[ParquetSinkWatch] = []
    for name, sink in sinks.items():
        key = translator.sink_asset_key(plan.topology, name)
        asset = sink.sink_kind.asset(sink)
        specs.append(
            dg.AssetSpec(
                key=key,
                deps=[translator.stream_asset_key(plan.topology, stage) for stage in dict.fromkeys(writers[name])],
                description=(
                    f"The {sink.format} sink `{name}` of topology `{plan.topology}`{asset.where}, written by stage(s) "
                    f"{', '.join(dict.fromkeys(writers[name]))} exactly once per committed batch."
                ),
                group_name=translator.group_name(plan.topology),
                kinds=set(asset.kinds),
                metadata={
                    "stream_ops/topology": dg.MetadataValue.text(plan.topology),
                    "stream_ops/sink_format": dg.MetadataValue.text(sink.format),
                    **dagster_metadata(asset.metadata),
                    "stream_ops/schema": dg.MetadataValue.table_schema(
                        dg.TableSchema(columns=[dg.TableColumn(name=f, type=t) for f, t in sink.fields.items()])
                    ),
                },
            )
        )
        if asset.committed_files_at is not None:
            watches.append(ParquetSinkWatch(asset_key=key, path=asset.committed_files_at))
    return specs, watches


def dagster_metadata(entries: Mapping[str, AssetMetadata]) -> dict[str, dg.MetadataValue]:
    """A sink kind's plain metadata (:class:`~stream_ops.sinks.AssetMetadata`) as Dagster's."""
    return {key: _METADATA_VALUES[entry.type](entry.value) for key, entry in entries.items()}


def kafka_sink_metadata(spec: KafkaSinkSpec) -> dict[str, Any]:
    """Definition metadata of a ``to_kafka`` sink: where it writes; of its client settings only
    the names (values may be secrets, or ``env:NAME`` references).

    Example:
        >>> meta = kafka_sink_metadata(KafkaSinkSpec(bootstrap="k:9092", topic="out", config={"sasl.password": "x"}))
        >>> meta["stream_ops/kafka_topic"].value, meta["stream_ops/kafka_client_settings"].value
        ('out', ['sasl.password'])
    """
    return dagster_metadata(kafka_asset_metadata(spec))


def parquet_sink_metadata(path: str | Path) -> dict[str, Any] | None:
    """Metadata of a Parquet sink's committed files, or None before its first commit.

    Keys: ``rows``, ``files``, ``last_txids`` (``<topology id>.<sink>/<task>`` -> last committed txid), ``preview``
    (the first rows of the newest committed file, as Markdown).
    """
    import pyarrow.parquet as pq

    root = Path(path)
    markers = committed_markers(root)
    if not markers:
        return None
    files = committed_files(root)
    last_txids: dict[str, int] = {}
    for marker in markers:
        # Per submission and task: a resubmitted topology's txids start again at 0.
        task = f"{marker['owner']}/{marker['task']}" if marker.get("owner") else str(marker["task"])
        last_txids[task] = max(last_txids.get(task, -1), int(marker["txid"]))
    rows = 0
    for file in files:
        try:
            rows += pq.ParquetFile(file).metadata.num_rows
        except (OSError, ValueError) as e:
            logger.warning("parquet sink %s: cannot read the footer of %s: %s", root, file, e)
    newest = max(files, key=lambda f: f.stat().st_mtime if f.exists() else 0.0, default=None)
    preview = ""
    if newest is not None and newest.exists():
        table = pq.read_table(newest).slice(0, _PREVIEW_ROWS)
        columns = table.column_names
        preview = markdown_table([cell(c) for c in columns], [[row[c] for c in columns] for row in table.to_pylist()])
    return {
        "rows": rows,
        "files": len(files),
        "last_txids": last_txids,
        "preview": preview,
    }


def observe_parquet_sinks(
    watches: Sequence[ParquetSinkWatch], previous_txids: Callable[[dg.AssetKey], dict[str, int] | None]
) -> list[dg.AssetMaterialization]:
    """A materialization for each watched sink whose tasks committed since ``previous_txids``
    (the ``last_txids`` of its latest materialization)."""
    events: list[dg.AssetMaterialization] = []
    for watch in watches:
        try:
            found = parquet_sink_metadata(watch.path)
        except OSError as e:
            logger.warning("cannot read the parquet sink %s: %s", watch.path, e)
            continue
        if found is None or found["last_txids"] == previous_txids(watch.asset_key):
            continue
        events.append(
            dg.AssetMaterialization(
                asset_key=watch.asset_key,
                description=f"{found['rows']} committed rows in {found['files']} files",
                metadata={
                    "rows": dg.MetadataValue.int(found["rows"]),
                    "files": dg.MetadataValue.int(found["files"]),
                    "last_txids": dg.MetadataValue.json(found["last_txids"]),
                    "last_txid": dg.MetadataValue.int(max(found["last_txids"].values(), default=-1)),
                    "preview": dg.MetadataValue.md(found["preview"]),
                    "path": dg.MetadataValue.path(watch.path),
                },
            )
        )
    return events


def latest_sink_txids(instance: dg.DagsterInstance) -> Callable[[dg.AssetKey], dict[str, int] | None]:
    """``previous_txids`` for :func:`observe_parquet_sinks`, read from ``instance``."""

    def previous(key: dg.AssetKey) -> dict[str, int] | None:
        event = instance.get_latest_materialization_event(key)
        materialization = event.asset_materialization if event is not None else None
        if materialization is None or "last_txids" not in materialization.metadata:
            return None
        value = materialization.metadata["last_txids"].value
        return dict(value) if isinstance(value, dict) else None

    return previous
