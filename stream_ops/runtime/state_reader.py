"""Answer ``state_query`` lookups from a running task (Trident's stateQuery).

A map state (persistent_aggregate) is read from the workers that own its keys, through their
query endpoints, with the query token and TLS of the worker's :class:`~stream_ops.config.QueryConfig`
(the same a worker serves with). A partition_persist state is opened with its factory for the one
partition that can hold each record's key.

A lookup that gets no answer for now (a busy or unreachable worker, a task moving or not yet
assigned: :class:`~stream_ops.errors.QueryUnavailableError`) is asked again, with a growing
backoff, until :attr:`LookupRetry.give_up_after_s` after the batch's lookup began; then the
batch fails with :class:`~stream_ops.errors.StateQueryUnavailableError` (a transient error: the
worker tries the task again, see :mod:`stream_ops.runtime.task_failures`). A lookup that fails
for any reason but its keys fails the batch even when the topology's ``batch_retrieve`` caught
the error: no record is dead-lettered because the state could not be read.
"""

from __future__ import annotations

import logging
import random
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from stream_ops.config import QueryConfig
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import QueryError, QueryRequestError, QueryUnavailableError, StateQueryUnavailableError
from stream_ops.hashing import partition_for
from stream_ops.operators.trident_state import State
from stream_ops.runtime.query_client import QueryAccess, get_keys
from stream_ops.topology.functions import resolve_object
from stream_ops.topology.plan import Plan

logger = logging.getLogger(__name__)


class LookupRetry(BaseModel):
    """How a task's ``state_query`` asks again when the workers cannot answer for now.

    Example:
        >>> LookupRetry().give_up_after_s
        10.0
    """

    model_config = ConfigDict(frozen=True)

    give_up_after_s: float = Field(
        10.0, gt=0, description="Seconds one lookup of a batch keeps asking before the batch fails (and is tried again)."
    )
    first_backoff_s: float = Field(0.05, gt=0, description="Wait before the second attempt; doubles after each attempt.")
    max_backoff_s: float = Field(1.0, gt=0, description="Longest wait between two attempts.")
    attempt_timeout_s: float = Field(5.0, gt=0, description="Seconds one attempt waits for a worker's answer.")


class StateReader:
    """Callable ``(state name, query function, args) -> results`` for one task's batches.

    Args:
        store: The worker's ZooKeeper store (routing; its credentials give the default token).
        topology_id: The topology's id.
        plan: The topology's plan.
        query_config: The worker's query token and TLS CA; default: the token derived from the
            store's ZooKeeper credentials, plain HTTP.
        retry: How a lookup that gets no answer for now is asked again.

    Raises (when called):
        StateQueryUnavailableError: A map state's workers gave no answer within the retries.
        QueryError: The state cannot be read for another reason than its keys (the token, TLS,
            a state the plan does not have).
    """

    def __init__(
        self,
        store: ZkStore,
        topology_id: str,
        plan: Plan,
        *,
        query_config: QueryConfig | None = None,
        retry: LookupRetry | None = None,
    ) -> None:
        self.store = store
        self.topology_id = topology_id
        self.plan = plan
        self._access = QueryAccess.resolve(store.config, query_config)
        self._retry = retry or LookupRetry()
        self._partitions: dict[tuple[str, int], State] = {}

    def __call__(self, state_name: str, query: Any, args: list[dict[str, Any]]) -> list[Any]:
        stage_index = self.plan.states.get(state_name)
        if stage_index is None:
            raise QueryError(f"topology {self.plan.topology!r} has no state {state_name!r}")
        stage = self.plan.stage(stage_index)
        if stage.state is not None:
            remote = _RetryingMapState(self, state_name, stage_index, self._access, self._retry)
            try:
                results = list(query.batch_retrieve(remote, args))
            except Exception as e:
                if remote.failure is not None and e is not remote.failure:
                    raise remote.failure from e  # the topology's code wrapped it: still not the records' fault
                raise
            if remote.failure is not None:
                raise remote.failure  # the topology's code swallowed it: its results were not read from the state
            return results
        persist = stage.persist
        if persist is None:
            raise QueryError(f"state {state_name!r} is neither a map state nor a partition_persist state")
        by_partition: dict[int, list[int]] = defaultdict(list)
        for i, arg in enumerate(args):
            by_partition[partition_for(list(arg.values()), stage.queues)].append(i)
        results = [None] * len(args)
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


class _RetryingMapState:
    """A read-only view of a keyed stage's map state for one ``batch_retrieve`` (``multi_get``
    only), asking again while the workers cannot answer for now, until the call's deadline.

    ``failure`` is the first error that was not the keys' fault, kept so that the reader raises
    it whatever the topology's code did with it.
    """

    def __init__(self, reader: StateReader, state_name: str, stage_index: int, access: QueryAccess, retry: LookupRetry) -> None:
        self._reader = reader
        self._state_name = state_name
        self._stage_index = stage_index
        self._access = access
        self._retry = retry
        self._started = time.monotonic()
        self._deadline = self._started + retry.give_up_after_s
        self.failure: QueryError | None = None

    def multi_get(self, keys: Sequence[Sequence[Any]]) -> list[Any]:
        if self.failure is not None:
            raise self.failure
        try:
            return self._asked_until_answered(keys)
        except QueryRequestError:
            raise
        except QueryError as e:
            self.failure = e
            raise

    def _asked_until_answered(self, keys: Sequence[Sequence[Any]]) -> list[Any]:
        reader, retry = self._reader, self._retry
        backoff = retry.first_backoff_s
        attempt = 0
        while True:
            attempt += 1
            remaining = self._deadline - time.monotonic()
            try:
                return get_keys(
                    reader.store,
                    reader.topology_id,
                    reader.plan,
                    self._stage_index,
                    keys,
                    access=self._access,
                    timeout_s=min(retry.attempt_timeout_s, max(remaining, 0.1)),
                )
            except QueryUnavailableError as e:
                wait_s = backoff * random.uniform(0.5, 1.0)
                if time.monotonic() + wait_s >= self._deadline:
                    raise StateQueryUnavailableError(
                        f"state_query on state {self._state_name!r} of {reader.topology_id}: no answer after {attempt} "
                        f"attempt(s) in {time.monotonic() - self._started:.1f} s ({e}); the batch fails and the task is "
                        "tried again"
                    ) from e
                logger.debug(
                    "state_query on %r: attempt %d not answered (%s); again in %.2f s", self._state_name, attempt, e, wait_s
                )
                time.sleep(wait_s)
                backoff = min(backoff * 2, retry.max_backoff_s)
