"""Operators usable in topologies: aggregators (and later joins and processing elements)."""

from stream_ops.operators.aggregators import CombinerAggregator, Count, Max, Min, Sum, aggregator_from_spec

__all__ = ["CombinerAggregator", "Count", "Max", "Min", "Sum", "aggregator_from_spec"]
