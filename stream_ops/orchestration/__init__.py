"""stream_ops.orchestration."""
