"""stream_ops.nimbus."""
