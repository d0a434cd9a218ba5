"""Where a topology's results leave it: Parquet files (the other sinks are topics and functions)."""

from stream_ops.sinks.parquet_sink import ParquetSink, committed_files, committed_markers, read_table

__all__ = ["ParquetSink", "committed_files", "committed_markers", "read_table"]
