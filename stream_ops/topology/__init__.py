"""Topology DSL and planning (pure Python: no Spark, no ZooKeeper)."""

from stream_ops.topology.dsl import GroupedStream, StateHandle, Stream, Topology, state_kind_of
from stream_ops.topology.loading import load_topology
from stream_ops.topology.plan import Plan, StageSpec, TaskSpec, build_plan

__all__ = [
    "GroupedStream",
    "Plan",
    "StageSpec",
    "StateHandle",
    "Stream",
    "TaskSpec",
    "Topology",
    "build_plan",
    "load_topology",
    "state_kind_of",
]
