"""stream_ops.topology."""
