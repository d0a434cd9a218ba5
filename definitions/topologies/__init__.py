"""Example topologies (the seed systems' examples, in stream_ops form)."""
