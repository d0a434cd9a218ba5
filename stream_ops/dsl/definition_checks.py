"""Small checks the DSL modules share: names, queue counts, the type an aggregate keeps."""

from __future__ import annotations

import re
from typing import Any

from stream_ops.errors import TopologyDefinitionError
from stream_ops.operators.aggregators import CombinerAggregator, ReducerCombiner
from stream_ops.topology.queue_counts import LaterCount, QueueCount

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,62}$")


def check_name(kind: str, name: str) -> str:
    """``name`` if it is a valid name for a ``kind`` (topology, stage, state, sink, stream)."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise TopologyDefinitionError(f"{kind} name {name!r} is invalid: use letters, digits, '_' or '-', starting with a letter")
    return name


def check_queues(n: Any, what: str) -> QueueCount:
    """``n`` if it is a valid number of queues (tasks of a stage), or one learned when the plan is built."""
    if isinstance(n, LaterCount):
        return n
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise TopologyDefinitionError(f"{what}: queues must be a positive integer, got {n!r}")
    return n


def state_type(aggregator: CombinerAggregator, value_type: str) -> str:
    """The type of what an aggregate keeps (a reducer's state differs from its shuffled partials)."""
    return aggregator.state_type() if isinstance(aggregator, ReducerCombiner) else value_type
