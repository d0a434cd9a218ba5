"""Topics: partitioned append-only logs on a shared path."""

from stream_ops.topics.file_topic import (
    BatchFileId,
    FileTopic,
    batch_file_name,
    parse_batch_file_name,
    write_json_lines_atomically,
)

__all__ = ["BatchFileId", "FileTopic", "batch_file_name", "parse_batch_file_name", "write_json_lines_atomically"]
