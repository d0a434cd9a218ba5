"""Operators usable in topologies: aggregators, Storm's JoinBolt and S4's processing elements."""

from stream_ops.operators.aggregators import (
    CombinerAggregator,
    Count,
    Max,
    Min,
    ReducerAggregator,
    Sum,
    aggregator_from_spec,
)
from stream_ops.operators.join_bolt import FieldSelector, JoinBolt, JoinClause, TumblingWindow, WindowSpec
from stream_ops.operators.processing_element import PERuntime, ProcessingElement, Trigger
from stream_ops.operators.trident_state import Collector, QueryFunction, State, StateFactory, StateUpdater

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
    "TumblingWindow",
    "WindowSpec",
    "aggregator_from_spec",
]
