"""Readers of the cluster's shared state: topologies (``/storms``), assignments, live workers.

Workers, query clients and the nimbus all read these records; only the nimbus writes them
(:mod:`stream_ops.nimbus.submission`, :mod:`stream_ops.nimbus.assignment`), except a cleanly
stopping worker's handover of its tasks to their standbys
(:func:`stream_ops.nimbus.assignment.hand_over_to_standbys`). Nothing here writes.

Example:
    >>> topology_id = find_topology_id(store, "wordcount")  # doctest: +SKIP
    >>> record, epoch = read_assignment(store, topology_id)  # doctest: +SKIP
"""

from __future__ import annotations

from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import AssignmentRecord, StormRecord, WorkerRecord
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import TopologyNotFoundError

__all__ = ["find_topology_id", "list_topologies", "live_workers", "read_assignment", "read_storm"]


def live_workers(store: ZkStore) -> dict[str, WorkerRecord]:
    """Worker id -> record for every registered (connected) worker."""
    workers: dict[str, WorkerRecord] = {}
    for worker_id in store.children(ZkPaths.WORKERS):
        found = store.get_json(ZkPaths.worker(worker_id))
        if found is not None:
            workers[worker_id] = WorkerRecord.model_validate(found[0])
    return workers


def read_assignment(store: ZkStore, topology_id: str) -> tuple[AssignmentRecord, int] | None:
    """The assignment and its epoch (znode version), or None if there is none."""
    found = store.get_json(ZkPaths.assignment(topology_id))
    if found is None:
        return None
    data, stat = found
    return AssignmentRecord.model_validate(data), stat.version


def list_topologies(store: ZkStore) -> list[StormRecord]:
    """Every submitted topology that has not been removed, oldest first (their records read
    in one pipelined batch)."""
    paths = [ZkPaths.storm(topology_id) for topology_id in store.children(ZkPaths.STORMS)]
    records = [StormRecord.model_validate(found[0]) for found in store.get_json_many(paths).values() if found is not None]
    return sorted(records, key=lambda r: r.submitted_at)


def find_topology(store: ZkStore, name_or_id: str, *, missing_ok: bool = False) -> StormRecord | None:
    """The record of the live submission a topology name (or id) names: the oldest one.

    Raises:
        TopologyNotFoundError: None matches and ``missing_ok`` is false.
    """
    for record in list_topologies(store):
        if record.status != "KILLED" and name_or_id in (record.name, record.topology_id):
            return record
    if missing_ok:
        return None
    raise TopologyNotFoundError(f"no running topology named {name_or_id!r}; see 'stream-ops list'")


def find_topology_id(store: ZkStore, name_or_id: str, *, missing_ok: bool = False) -> str | None:
    """Resolve a topology name (or id) to the id of its live submission (:func:`find_topology`).

    Raises:
        TopologyNotFoundError: None matches and ``missing_ok`` is false.
    """
    record = find_topology(store, name_or_id, missing_ok=missing_ok)
    return None if record is None else record.topology_id


def read_storm(store: ZkStore, topology_id: str) -> StormRecord:
    """The ``/storms`` record of ``topology_id``.

    Raises:
        TopologyNotFoundError: The topology does not exist.
    """
    found = store.get_json(ZkPaths.storm(topology_id))
    if found is None:
        raise TopologyNotFoundError(f"topology {topology_id!r} does not exist")
    return StormRecord.model_validate(found[0])
