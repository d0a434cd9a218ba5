"""The stream_ops example topologies as a dg project: one ``defs.yaml`` per topology under ``defs/``."""
