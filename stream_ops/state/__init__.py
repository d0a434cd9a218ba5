"""stream_ops.state."""
