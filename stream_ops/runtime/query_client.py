"""Route state queries by key to the worker that owns the key's task (Trident's DRPC).

Every request carries the cluster's query token (:func:`stream_ops.config.query_token`: derived
from the store's ZooKeeper credentials unless a :class:`~stream_ops.config.QueryConfig` gives
one) and, with ``QueryConfig.tls_ca``, goes over https with the worker's certificate and host
name verified against that CA.
"""

from __future__ import annotations

import http.client
import json
import logging
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stream_ops.config import QueryConfig, ZooKeeperConfig, query_token
from stream_ops.coordination.cluster_state import find_topology, read_assignment
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import QueryAuthError, QueryError, QueryTLSError
from stream_ops.hashing import encode_key, partition_for
from stream_ops.nimbus.dist_store import load_submission
from stream_ops.runtime.query_server import MAX_KEYS, MAX_REQUEST_BYTES
from stream_ops.topology.plan import Plan

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class QueryAccess:
    """What every state query carries: the bearer token and, for https, the TLS context."""

    token: str | None = field(default=None, repr=False)
    tls: ssl.SSLContext | None = None

    @classmethod
    def resolve(cls, zookeeper: ZooKeeperConfig, query: QueryConfig | None = None) -> QueryAccess:
        """The token and TLS context of ``query`` (default: the token derived from ``zookeeper``).

        Raises:
            QueryTLSError: ``query.tls_ca`` cannot be read as a PEM CA bundle.
        """
        query = query or QueryConfig()
        return cls(token=query_token(query, zookeeper), tls=client_tls_context(query.tls_ca) if query.tls_ca else None)

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token is not None else {}


def client_tls_context(ca: Path) -> ssl.SSLContext:
    """A TLS context trusting only the CA bundle ``ca`` and checking the worker's host name.

    Raises:
        QueryTLSError: ``ca`` cannot be read as a PEM CA bundle.
    """
    try:
        context = ssl.create_default_context(cafile=str(ca))
    except (OSError, ssl.SSLError) as e:
        raise QueryTLSError(f"cannot load the query CA bundle {ca}: {e}; pass --query-tls-ca as a readable PEM file") from e
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def query_state(
    store: ZkStore,
    topology: str,
    query: str,
    keys: Sequence[Sequence[Any]],
    *,
    query_config: QueryConfig | None = None,
    timeout_s: float = 5.0,
) -> dict[str, Any]:
    """Current values of ``keys`` in the state behind ``query``.

    Returns a mapping from the key (its single value for one-field keys, else its JSON text)
    to the value, None for keys never seen. ``query_config`` gives the query token and TLS CA;
    by default the token is derived from the store's ZooKeeper credentials.

    Example:
        >>> query_state(store, "wordcount", "words", [["how"], ["you"]])
        {'how': 3, 'you': 6}
    """
    storm = find_topology(store, topology)
    assert storm is not None
    topology_id = storm.topology_id
    # Verified against the record's integrity root; a client has no dist store of its own to check the place.
    plan = load_submission(None, storm).plan
    spec = plan.queries.get(query)
    if spec is None:
        raise QueryError(f"topology {topology!r} has no query {query!r}; it has {sorted(plan.queries)}")
    for key in keys:
        if len(key) != len(spec.key_fields):
            raise QueryError(
                f"query {query!r} takes keys of {len(spec.key_fields)} field(s) {list(spec.key_fields)}, got {list(key)}"
            )
    access = QueryAccess.resolve(store.config, query_config)
    values = get_keys(store, topology_id, plan, spec.stage, keys, access=access, timeout_s=timeout_s)
    return {key[0] if len(key) == 1 else encode_key(list(key)): value for key, value in zip(keys, values, strict=True)}


def get_keys(
    store: ZkStore,
    topology_id: str,
    plan: Plan,
    stage_index: int,
    keys: Sequence[Sequence[Any]],
    *,
    access: QueryAccess,
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
    by_task_in_order = sorted(by_task.items())
    asks: list[TaskAsk] = []
    for task_id, indexes in by_task_in_order:
        worker = tasks.get(task_id)
        if worker is None:
            raise QueryError(f"task {task_id} of {topology_id} is not assigned to any worker; is a worker running?")
        asks.append(TaskAsk(worker, task_id, [list(keys[i]) for i in indexes]))
    values: list[Any] = [None] * len(keys)
    for (_, indexes), found in zip(by_task_in_order, ask_all(topology_id, asks, access, timeout_s), strict=True):
        for i, value in zip(indexes, found, strict=True):
            values[i] = value
    return values


@dataclass(frozen=True)
class TaskAsk:
    """The keys of one task, to ask of the worker that runs it."""

    worker: str
    task_id: int
    keys: list[list[Any]]


MAX_PARALLEL_ASKS = 8
"""Requests to workers made at once by one state query (Trident's DRPC fans out the same way)."""


def ask_all(topology_id: str, asks: Sequence[TaskAsk], access: QueryAccess, timeout_s: float) -> list[list[Any]]:
    """The values of each of ``asks``, in their order.

    The tasks of one worker are asked in one request (as few as its size limit allows), the
    workers at once (at most :data:`MAX_PARALLEL_ASKS` requests). A refusal or a worker that
    does not answer raises the error of the first such request, in the order of its first task.
    """
    requests = _requests(topology_id, asks)
    if len(requests) <= 1:
        answers = [_ask(request, topology_id, access, timeout_s) for request in requests]
    else:
        with ThreadPoolExecutor(max_workers=min(len(requests), MAX_PARALLEL_ASKS), thread_name_prefix="state-query") as pool:
            pending = [pool.submit(_ask, request, topology_id, access, timeout_s) for request in requests]
            answers = [future.result() for future in pending]
    values: list[list[Any]] = [[] for _ in asks]
    for request, answer in zip(requests, answers, strict=True):
        for index, found in zip(request.indexes, answer, strict=True):
            values[index] = found
    return values


@dataclass
class _Request:
    """Asks of one worker sent in one request; ``indexes`` are their places in the query's asks."""

    worker: str
    indexes: list[int] = field(default_factory=list)
    asks: list[TaskAsk] = field(default_factory=list)
    params: list[tuple[str, str]] = field(default_factory=list)
    size: int = 0
    keys: int = 0


def _requests(topology_id: str, asks: Sequence[TaskAsk]) -> list[_Request]:
    """``asks`` packed into requests: per worker, tasks in order, a new request where the next
    task would take one past the server's size or key limit (a task past it alone goes alone)."""
    head = len(urllib.parse.urlencode({"topology": topology_id})) + len("/query?")
    open_requests: dict[str, _Request] = {}
    requests: list[_Request] = []
    for index, ask in enumerate(asks):
        params = [("task", str(ask.task_id)), ("keys", json.dumps(ask.keys))]
        size = len(urllib.parse.urlencode(params)) + 1
        request = open_requests.get(ask.worker)
        if request is None or head + request.size + size > MAX_REQUEST_BYTES or request.keys + len(ask.keys) > MAX_KEYS:
            request = open_requests[ask.worker] = _Request(ask.worker)
            requests.append(request)
        request.indexes.append(index)
        request.asks.append(ask)
        request.params += params
        request.size += size
        request.keys += len(ask.keys)
    return requests


class RemoteMapState:
    """A read-only view of a keyed stage's map state for ``state_query`` (``multi_get`` only)."""

    def __init__(self, store: ZkStore, topology_id: str, plan: Plan, stage_index: int, access: QueryAccess) -> None:
        self._args = (store, topology_id, plan, stage_index)
        self._access = access

    def multi_get(self, keys: Sequence[Sequence[Any]]) -> list[Any]:
        return get_keys(*self._args, keys, access=self._access)


def _ask(request: _Request, topology_id: str, access: QueryAccess, timeout_s: float) -> list[list[Any]]:
    """The values of each ask of ``request``, from its worker in one round trip."""
    worker = request.worker
    tasks = ", ".join(str(ask.task_id) for ask in request.asks)
    what = f"task {tasks}" if len(request.asks) == 1 else f"tasks {tasks}"
    params = urllib.parse.urlencode([("topology", topology_id), *request.params])
    http_request = urllib.request.Request(f"{access.scheme}://{worker}/query?{params}", headers=access.headers())
    try:
        with urllib.request.urlopen(http_request, timeout=timeout_s, context=access.tls) as response:
            values = list(json.loads(response.read())["values"])
    except urllib.error.HTTPError as e:
        detail = e.read().decode("utf-8", "replace")
        if e.code == 401:
            sent = "the query token sent is not the one it serves with" if access.token else "no query token was sent"
            raise QueryAuthError(
                f"worker {worker} refused the query for {what}: {sent}; pass --query-token-file or "
                "--zk-auth matching the cluster's"
            ) from e
        raise QueryError(f"worker {worker} refused the query for {what}: {e.code} {detail}") from e
    except urllib.error.URLError as e:
        if isinstance(e.reason, ssl.SSLError):
            raise _tls_error(worker, what, e.reason) from e
        raise _no_answer(worker, what, e.reason, access) from e
    except ssl.SSLError as e:
        raise _tls_error(worker, what, e) from e
    except (OSError, http.client.HTTPException) as e:
        raise _no_answer(worker, what, e, access) from e
    sizes = [len(ask.keys) for ask in request.asks]
    if len(values) != sum(sizes):
        raise QueryError(f"worker {worker} answered {len(values)} values for the {sum(sizes)} keys of {what}")
    answers, start = [], 0
    for size in sizes:
        answers.append(values[start : start + size])
        start += size
    return answers


def _no_answer(worker: str, what: str, error: object, access: QueryAccess) -> QueryError:
    """A worker that did not answer; a dropped plain request may mean the worker serves TLS."""
    dropped = (ConnectionResetError, ConnectionAbortedError, BrokenPipeError, http.client.HTTPException)
    hint = ""
    if access.tls is None and isinstance(error, dropped):
        hint = "; if the workers serve TLS (--query-tls-cert), pass --query-tls-ca"
    return QueryError(f"worker {worker} ({what}) did not answer: {error!r}{hint}")


def _tls_error(worker: str, what: str, error: ssl.SSLError) -> QueryTLSError:
    """What to do about a failed TLS handshake with ``worker``."""
    host = worker.rpartition(":")[0]
    if isinstance(error, ssl.SSLCertVerificationError):
        return QueryTLSError(
            f"the certificate of worker {worker} ({what}) was not accepted: {error.verify_message or error}; "
            f"pass --query-tls-ca with the CA that signed the workers' certificates, which must name host {host}"
        )
    return QueryTLSError(
        f"TLS with worker {worker} ({what}) failed: {error}; does it serve TLS (--query-tls-cert)? "
        "Pass --query-tls-ca only for a cluster whose workers do"
    )
