"""Operators usable in topologies: aggregators, windows, Storm's JoinBolt and S4's processing elements."""

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
from stream_ops.operators.windows import Duration, Records, Session, Sliding, Tumbling, WindowDef

__all__ = [
    "CombinerAggregator",
    "Collector",
    "Count",
    "Duration",
    "FieldSelector",
    "JoinBolt",
    "JoinClause",
    "Max",
    "Min",
    "PERuntime",
    "ProcessingElement",
    "QueryFunction",
    "Records",
    "ReducerAggregator",
    "Session",
    "Sliding",
    "State",
    "StateFactory",
    "StateUpdater",
    "Sum",
    "Trigger",
    "Tumbling",
    "WindowBuffer",
    "WindowDef",
    "aggregator_from_spec",
]
