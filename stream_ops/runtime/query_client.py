"""Route state queries by key to the worker that owns the key's task (Trident's DRPC)."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stream_ops.coordination.store import ZkStore
from stream_ops.errors import QueryError
from stream_ops.hashing import encode_key, partition_for
from stream_ops.nimbus.assignment import read_assignment
from stream_ops.nimbus.dist_store import read_plan
from stream_ops.nimbus.submission import find_topology_id, read_storm
from stream_ops.topology.plan import Plan

logger = logging.getLogger(__name__)


def query_state(
    store: ZkStore,
    topology: str,
    query: str,
    keys: Sequence[Sequence[Any]],
    *,
    timeout_s: float = 5.0,
) -> dict[str, Any]:
    """Current values of ``keys`` in the state behind ``query``.

    Returns a mapping from the key (its single value for one-field keys, else its JSON text)
    to the value, None for keys never seen.

    Example:
        >>> query_state(store, "wordcount", "words", [["how"], ["you"]])
        {'how': 3, 'you': 6}
    """
    topology_id = find_topology_id(store, topology)
    assert topology_id is not None
    storm = read_storm(store, topology_id)
    plan = read_plan(Path(storm.dist_dir))
    spec = plan.queries.get(query)
    if spec is None:
        raise QueryError(f"topology {topology!r} has no query {query!r}; it has {sorted(plan.queries)}")
    for key in keys:
        if len(key) != len(spec.key_fields):
            raise QueryError(f"query {query!r} takes keys of {len(spec.key_fields)} field(s) {list(spec.key_fields)}, got {list(key)}")
    values = get_keys(store, topology_id, plan, spec.stage, keys, timeout_s=timeout_s)
    return {key[0] if len(key) == 1 else encode_key(list(key)): value for key, value in zip(keys, values, strict=True)}


def get_keys(
    store: ZkStore,
    topology_id: str,
    plan: Plan,
    stage_index: int,
    keys: Sequence[Sequence[Any]],
    *,
    timeout_s: float = 5.0,
) -> list[Any]:
    """Values of ``keys`` in a keyed stage's state, asked of the workers owning their tasks."""
    stage = plan.stage(stage_index)
    assignment = read_assignment(store, topology_id)
    tasks = assignment[0].tasks if assignment else {}
    by_task: dict[int, list[int]] = defaultdict(list)
    for i, key in enumerate(keys):
        task = plan.task_for(stage.index, partition_for(list(key), stage.queues))
        by_task[task.task_id].append(i)
    values: list[Any] = [None] * len(keys)
    for task_id, indexes in sorted(by_task.items()):
        worker = tasks.get(task_id)
        if worker is None:
            raise QueryError(f"task {task_id} of {topology_id} is not assigned to any worker; is a worker running?")
        found = _ask(worker, topology_id, task_id, [list(keys[i]) for i in indexes], timeout_s)
        for i, value in zip(indexes, found, strict=True):
            values[i] = value
    return values


class RemoteMapState:
    """A read-only view of a keyed stage's map state for ``state_query`` (``multi_get`` only)."""

    def __init__(self, store: ZkStore, topology_id: str, plan: Plan, stage_index: int) -> None:
        self._args = (store, topology_id, plan, stage_index)

    def multi_get(self, keys: Sequence[Sequence[Any]]) -> list[Any]:
        return get_keys(*self._args, keys)


def _ask(worker: str, topology_id: str, task_id: int, keys: list[list[Any]], timeout_s: float) -> list[Any]:
    params = urllib.parse.urlencode({"topology": topology_id, "task": task_id, "keys": json.dumps(keys)})
    url = f"http://{worker}/query?{params}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return list(json.loads(response.read())["values"])
    except urllib.error.HTTPError as e:
        detail = e.read().decode("utf-8", "replace")
        raise QueryError(f"worker {worker} refused the query for task {task_id}: {e.code} {detail}") from e
    except (urllib.error.URLError, OSError) as e:
        raise QueryError(f"worker {worker} (task {task_id}) did not answer: {e}") from e
