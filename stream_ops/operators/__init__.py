"""stream_ops.operators."""
