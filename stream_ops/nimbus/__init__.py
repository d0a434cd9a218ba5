"""Nimbus: submission, dist store, assignment and topology status."""

from stream_ops.nimbus.assignment import live_workers, reassign
from stream_ops.nimbus.status import TaskStatus, TopologyStatus, describe_topology
from stream_ops.nimbus.submission import (
    activate,
    deactivate,
    find_topology_id,
    kill,
    list_topologies,
    submit,
)

__all__ = [
    "TaskStatus",
    "TopologyStatus",
    "activate",
    "deactivate",
    "describe_topology",
    "find_topology_id",
    "kill",
    "list_topologies",
    "live_workers",
    "reassign",
    "submit",
]
