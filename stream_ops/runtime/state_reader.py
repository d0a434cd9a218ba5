"""Answer ``state_query`` lookups from a running task (Trident's stateQuery).

A map state (persistent_aggregate) is read from the workers that own its keys, through their
query endpoints, with the query token and TLS of the worker's :class:`~stream_ops.config.QueryConfig`
(the same a worker serves with). A partition_persist state is opened with its factory for the one
partition that can hold each record's key.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from stream_ops.config import QueryConfig
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import QueryError
from stream_ops.hashing import partition_for
from stream_ops.operators.trident_state import State
from stream_ops.runtime.query_client import QueryAccess, RemoteMapState
from stream_ops.topology.functions import resolve_object
from stream_ops.topology.plan import Plan


class StateReader:
    """Callable ``(state name, query function, args) -> results`` for one task's batches.

    Args:
        store: The worker's ZooKeeper store (routing; its credentials give the default token).
        topology_id: The topology's id.
        plan: The topology's plan.
        query_config: The worker's query token and TLS CA; default: the token derived from the
            store's ZooKeeper credentials, plain HTTP.
    """

    def __init__(self, store: ZkStore, topology_id: str, plan: Plan, *, query_config: QueryConfig | None = None) -> None:
        self.store = store
        self.topology_id = topology_id
        self.plan = plan
        self._access = QueryAccess.resolve(store.config, query_config)
        self._partitions: dict[tuple[str, int], State] = {}

    def __call__(self, state_name: str, query: Any, args: list[dict[str, Any]]) -> list[Any]:
        stage_index = self.plan.states.get(state_name)
        if stage_index is None:
            raise QueryError(f"topology {self.plan.topology!r} has no state {state_name!r}")
        stage = self.plan.stage(stage_index)
        if stage.state is not None:
            remote = RemoteMapState(self.store, self.topology_id, self.plan, stage_index, self._access)
            return list(query.batch_retrieve(remote, args))
        persist = stage.persist
        if persist is None:
            raise QueryError(f"state {state_name!r} is neither a map state nor a partition_persist state")
        by_partition: dict[int, list[int]] = defaultdict(list)
        for i, arg in enumerate(args):
            by_partition[partition_for(list(arg.values()), stage.queues)].append(i)
        results: list[Any] = [None] * len(args)
        for partition, indexes in sorted(by_partition.items()):
            state = self._partition_state(state_name, persist.factory, partition, stage.queues)
            found = query.batch_retrieve(state, [args[i] for i in indexes])
            for i, value in zip(indexes, found, strict=True):
                results[i] = value
        return results

    def _partition_state(self, name: str, factory_ref: dict[str, Any], partition: int, partitions: int) -> State:
        key = (name, partition)
        state = self._partitions.get(key)
        if state is None:
            state = resolve_object(factory_ref).make_state(partition, partitions)
            self._partitions[key] = state
        return state

    def close(self) -> None:
        for state in self._partitions.values():
            state.close()
        self._partitions.clear()
