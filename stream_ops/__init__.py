"""stream_ops: the Storm/Trident operating model on Spark Structured Streaming, run from Dagster.

The public API for writing topologies::

    from stream_ops import Topology, FileTopic, Count, Sum, OpaqueMapState, TransactionalMapState, MapState
    from stream_ops import Tumbling, Sliding, Session, Duration, Records

``stream_ops.StreamTopologyComponent`` is the Dagster Component of one topology (``dg``'s
``defs.yaml``; see :mod:`stream_ops.orchestration.component`). It is imported on first use, so
``import stream_ops`` does not import Dagster.
"""

from typing import TYPE_CHECKING

# A plan checks each SinkSpec against the kind registered under its format
# (stream_ops.topology.sink_kinds); the built-in kinds register when this package is imported.
import stream_ops.sinks  # noqa: F401 (imported for its registrations)
from stream_ops.dsl.streams import GroupedStream, StateHandle, Stream, Topology
from stream_ops.errors import StreamOpsError, TopologyDefinitionError
from stream_ops.operators.aggregators import CombinerAggregator, Count, Max, Min, Sum
from stream_ops.state.map_states import MapState, OpaqueMapState, TransactionalMapState
from stream_ops.state.values import OpaqueValue, TransactionalValue
from stream_ops.topics.file_topic import FileTopic
from stream_ops.topology.windows import Duration, Records, Session, Sliding, Tumbling

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

if TYPE_CHECKING:
    from stream_ops.orchestration.component import StreamTopologyComponent as StreamTopologyComponent
else:

    def __getattr__(name: str) -> object:
        """``StreamTopologyComponent``, imported with Dagster on first use (``dg`` finds it here)."""
        if name == "StreamTopologyComponent":
            from stream_ops.orchestration.component import StreamTopologyComponent

            return StreamTopologyComponent
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted([*globals(), "StreamTopologyComponent"])
