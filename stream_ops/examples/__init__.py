"""Example topologies shipped with stream_ops (the seed systems' examples)."""
