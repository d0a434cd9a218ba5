"""stream_ops.runtime."""
