"""stream_ops.spark."""
