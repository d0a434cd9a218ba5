"""stream_ops: the Storm/Trident operating model on Spark Structured Streaming, run from Dagster.

The public API for writing topologies::

    from stream_ops import Topology, FileTopic, Count, Sum, OpaqueMapState, TransactionalMapState, MapState
    from stream_ops import Tumbling, Sliding, Session, Duration, Records
"""

from stream_ops.errors import StreamOpsError, TopologyDefinitionError
from stream_ops.operators.aggregators import CombinerAggregator, Count, Max, Min, Sum
from stream_ops.operators.windows import Duration, Records, Session, Sliding, Tumbling
from stream_ops.state.map_states import MapState, OpaqueMapState, TransactionalMapState
from stream_ops.state.values import OpaqueValue, TransactionalValue
from stream_ops.topics.file_topic import FileTopic
from stream_ops.topology.dsl import GroupedStream, StateHandle, Stream, Topology

__all__ = [
    "CombinerAggregator",
    "Count",
    "Duration",
    "FileTopic",
    "GroupedStream",
    "MapState",
    "Max",
    "Min",
    "OpaqueMapState",
    "OpaqueValue",
    "Records",
    "Session",
    "Sliding",
    "StateHandle",
    "Stream",
    "StreamOpsError",
    "Sum",
    "Topology",
    "TopologyDefinitionError",
    "TransactionalMapState",
    "TransactionalValue",
    "Tumbling",
]
