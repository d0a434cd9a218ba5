"""The topology DSL users write (``Topology``, ``Stream``, ``GroupedStream``, ``StateHandle``),
loading one by reference, and building its plan (pure Python: no Spark, no ZooKeeper)."""

from stream_ops.dsl.build_plan import build_plan
from stream_ops.dsl.loading import load_topology
from stream_ops.dsl.streams import GroupedStream, StateHandle, Stream, Topology, state_kind_of

__all__ = [
    "GroupedStream",
    "StateHandle",
    "Stream",
    "Topology",
    "build_plan",
    "load_topology",
    "state_kind_of",
]
