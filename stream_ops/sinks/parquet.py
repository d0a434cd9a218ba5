"""The ``parquet`` sink kind (``Stream.to_parquet``): a task's batch as Parquet files under the
sink's directory, staged under (task, txid, epoch) and renamed into place after the commit
(:class:`~stream_ops.sinks.parquet_sink.ParquetSink`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stream_ops.errors import TopologyDefinitionError
from stream_ops.sinks.parquet_sink import ParquetSink
from stream_ops.topology.sink_kinds import Record, SinkAsset, SinkContext, SinkKind, SinkWriter
from stream_ops.topology.sink_paths import sink_owner

if TYPE_CHECKING:
    from stream_ops.topics.staged_output import StagedOutput
    from stream_ops.topology.plan import SinkSpec


class ParquetWriter(SinkWriter):
    """One task's Parquet files of a sink (file names prefixed ``<topology id>.<sink>``)."""

    def __init__(self, spec: SinkSpec, context: SinkContext) -> None:
        assert spec.path is not None  # checked by ParquetKind.check_spec
        self.task_id = context.task.task_id
        self.sink = ParquetSink(
            spec.path,
            spec.fields,
            partition_by=spec.partition_by,
            durable=context.durable,
            owner=sink_owner(context.layout.topology_id, spec.name),
        )

    def staged_outputs(self) -> list[StagedOutput]:
        return [self.sink]

    def stage_batch(self, txid: int, epoch: int, records: list[Record]) -> None:
        self.sink.stage_batch(self.task_id, txid, epoch, records)


class ParquetKind(SinkKind):
    """Parquet files under ``spec.path``, hive-partitioned by ``spec.partition_by``."""

    name = "parquet"
    writes_directory = True
    asset_kinds = frozenset({"parquet"})

    def check_spec(self, spec: SinkSpec) -> None:
        super().check_spec(spec)
        if spec.path is None:
            raise TopologyDefinitionError(f"parquet sink {spec.name!r}: needs a path")

    def writer(self, spec: SinkSpec, context: SinkContext) -> SinkWriter:
        return ParquetWriter(spec, context)

    def asset(self, spec: SinkSpec) -> SinkAsset:
        base = super().asset(spec)
        return SinkAsset(kinds=base.kinds, where=base.where, metadata=base.metadata, committed_files_at=spec.path)
