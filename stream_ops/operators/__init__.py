"""Operators usable in topologies: aggregators, Storm's JoinBolt and S4's processing elements
(the window model they share is :mod:`stream_ops.topology.windows`)."""

from stream_ops.operators.aggregators import (
    CombinerAggregator,
    Count,
    Max,
    Min,
    ReducerAggregator,
    Sum,
    aggregator_from_spec,
)
from stream_ops.operators.join_bolt import FieldSelector, JoinBolt, JoinClause
from stream_ops.operators.processing_element import PERuntime, ProcessingElement, Trigger
from stream_ops.operators.trident_state import Collector, QueryFunction, State, StateFactory, StateUpdater
from stream_ops.operators.window_buffer import WindowBuffer

__all__ = [
    "CombinerAggregator",
    "Collector",
    "Count",
    "FieldSelector",
    "JoinBolt",
    "JoinClause",
    "Max",
    "Min",
    "PERuntime",
    "ProcessingElement",
    "QueryFunction",
    "ReducerAggregator",
    "State",
    "StateFactory",
    "StateUpdater",
    "Sum",
    "Trigger",
    "WindowBuffer",
    "aggregator_from_spec",
]
