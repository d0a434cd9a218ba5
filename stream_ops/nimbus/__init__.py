"""Nimbus: submission, dist store, assignment, topology status, heartbeat monitor, rebalance."""

from stream_ops.nimbus.assignment import live_workers, read_assignment, reassign
from stream_ops.nimbus.leader import current_leader, run_nimbus
from stream_ops.nimbus.monitor import HeartbeatTracker, Monitor, MonitorAction
from stream_ops.nimbus.rebalance import rebalance
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
    "HeartbeatTracker",
    "Monitor",
    "MonitorAction",
    "TaskStatus",
    "TopologyStatus",
    "activate",
    "current_leader",
    "deactivate",
    "describe_topology",
    "find_topology_id",
    "kill",
    "list_topologies",
    "live_workers",
    "read_assignment",
    "reassign",
    "rebalance",
    "run_nimbus",
    "submit",
]
