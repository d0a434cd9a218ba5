"""Sinks: where a topology's results leave it, one module per kind behind the plan's seam
(:class:`~stream_ops.topology.sink_kinds.SinkKind`).

The DSL's ``to_parquet``, ``to_topic``, ``sink``, ``print`` and ``to_kafka`` (and ``to_sink``
for any registered kind) put a :class:`~stream_ops.topology.plan.SinkSpec` in the plan; the kind
registered under its ``format`` checks it, writes it per task and describes it to Dagster.
Adding a sink is a module with its kind and writer, plus a line below registering the kind.
Importing :mod:`stream_ops` imports this package, so every process has the built-in kinds.
"""

from stream_ops.sinks.delivered import DeliveredBatchWriter
from stream_ops.sinks.function import FunctionKind
from stream_ops.sinks.kafka import KafkaKind
from stream_ops.sinks.parquet import ParquetKind
from stream_ops.sinks.parquet_sink import ParquetSink, committed_files, committed_markers, read_table
from stream_ops.sinks.print_sink import PrintKind
from stream_ops.sinks.topic import TopicKind
from stream_ops.topology.sink_kinds import register_sink_kind

register_sink_kind(ParquetKind())
register_sink_kind(TopicKind())
register_sink_kind(FunctionKind())
register_sink_kind(PrintKind())
register_sink_kind(KafkaKind())

__all__ = [
    "DeliveredBatchWriter",
    "FunctionKind",
    "KafkaKind",
    "ParquetKind",
    "ParquetSink",
    "PrintKind",
    "TopicKind",
    "committed_files",
    "committed_markers",
    "read_table",
]
