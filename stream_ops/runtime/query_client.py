"""Route state queries by key to the worker that owns the key's task (Trident's DRPC).

Every request carries the cluster's query token (:func:`stream_ops.config.query_token`: derived
from the store's ZooKeeper credentials unless a :class:`~stream_ops.config.QueryConfig` gives
one) and, with ``QueryConfig.tls_ca``, goes over https with the worker's certificate and host
name verified against that CA. Without a CA, a worker whose record says it serves TLS is not
connected to at all (the token would go to it in clear): :class:`~stream_ops.errors.QueryTLSError`.

Errors say whether asking again may help: :class:`~stream_ops.errors.QueryUnavailableError`
(a transient error: busy, unreachable, the task moving or unassigned),
:class:`~stream_ops.errors.QueryRequestError` (the keys themselves refused), or another
:class:`~stream_ops.errors.QueryError` (the token, TLS: configuration).
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

from pydantic import ValidationError

from stream_ops.config import QueryConfig, ZooKeeperConfig, query_token
from stream_ops.coordination.cluster_state import find_topology, read_assignment
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import WorkerRecord
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import (
    QueryAuthError,
    QueryError,
    QueryRequestError,
    QueryTLSError,
    QueryUnavailableError,
    TopologyNotFoundError,
)
from stream_ops.hashing import encode_key, partition_for
from stream_ops.nimbus.dist_store import load_submission
from stream_ops.runtime.query_request import MAX_KEYS, MAX_REQUEST_BYTES
from stream_ops.topology.plan import Plan

logger = logging.getLogger(__name__)

#: Longest path of a request: the server's request-line limit less the method and version around it.
MAX_PATH_BYTES = MAX_REQUEST_BYTES - len("GET  HTTP/1.1\r\n")


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

    Raises:
        TopologyNotFoundError: No running topology has that name or id.
        QueryError: The topology has no such query, or a key has the wrong number of fields;
            a worker could not answer (:class:`QueryUnavailableError`) or refused the keys.
    """
    storm = find_topology(store, topology, missing_ok=True)
    if storm is None:
        raise TopologyNotFoundError(f"cannot query {query!r}: no running topology named {topology!r}; see 'stream-ops list'")
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
    """Values of ``keys`` in a keyed stage's state, asked of the workers owning their tasks.

    A task's keys go in as many requests as the server's limits need.

    Raises:
        QueryUnavailableError: A task is not assigned, or its worker gives no answer for now.
        QueryRequestError: A worker refused the keys themselves.
        QueryTLSError: A worker serves TLS and ``access`` has no CA (nothing was sent to it).
        QueryAuthError: A worker refused the token.
    """
    stage = plan.stage(stage_index)
    assignment = read_assignment(store, topology_id)
    tasks = assignment[0].tasks if assignment else {}
    by_task: dict[int, list[int]] = defaultdict(list)
    for i, key in enumerate(keys):
        task = plan.task_for(stage.index, partition_for(list(key), stage.queues))
        by_task[task.task_id].append(i)
    asks: list[TaskAsk] = []
    places: list[list[int]] = []
    for task_id, indexes in sorted(by_task.items()):
        worker = tasks.get(task_id)
        if worker is None:
            raise QueryUnavailableError(f"task {task_id} of {topology_id} is not assigned to any worker; is a worker running?")
        for part in _within_request_limits(topology_id, task_id, indexes, keys):
            asks.append(TaskAsk(worker, task_id, [list(keys[i]) for i in part]))
            places.append(part)
    refuse_plain_to_tls(store, {ask.worker for ask in asks}, access)
    values: list[Any] = [None] * len(keys)
    for part, found in zip(places, ask_all(topology_id, asks, access, timeout_s), strict=True):
        for i, value in zip(part, found, strict=True):
            values[i] = value
    return values


def _within_request_limits(topology_id: str, task_id: int, indexes: list[int], keys: Sequence[Sequence[Any]]) -> list[list[int]]:
    """``indexes`` (of one task's keys) cut into runs that each fit one request alone: at most
    ``MAX_KEYS`` keys and a path of at most ``MAX_PATH_BYTES``. A key too large alone is a run
    of its own (its worker refuses it: :class:`QueryRequestError`)."""
    # The path's fixed part, then per key its URL-encoded JSON and the ", " after it.
    fixed = len(f"/query?{urllib.parse.urlencode([('topology', topology_id), ('task', str(task_id)), ('keys', '[]')])}") + 1
    separator = len(urllib.parse.quote_plus(", "))
    runs: list[list[int]] = []
    run: list[int] = []
    size = fixed
    for i in indexes:
        cost = len(urllib.parse.quote_plus(json.dumps(list(keys[i])))) + separator
        if run and (size + cost > MAX_PATH_BYTES or len(run) >= MAX_KEYS):
            runs.append(run)
            run, size = [], fixed
        run.append(i)
        size += cost
    if run:
        runs.append(run)
    return runs


def refuse_plain_to_tls(store: ZkStore, workers: set[str], access: QueryAccess) -> None:
    """Refuse, before connecting, to ask a worker that serves TLS without a CA to verify it by.

    A plain request would carry the query token in clear to the worker's port (where anyone
    watching the network reads it) before the worker drops it. A worker whose record is not a
    worker record (so does not say whether it serves TLS) is refused too.

    Raises:
        QueryTLSError: One of ``workers`` serves TLS, or its record does not say, and ``access``
            has no CA.
    """
    if access.tls is not None or not workers:
        return
    found = store.get_json_many(ZkPaths.worker(worker) for worker in sorted(workers))
    for worker in sorted(workers):
        node = found.get(ZkPaths.worker(worker))
        if node is None:
            continue
        try:
            serves_tls = WorkerRecord.model_validate(node[0]).tls
        except ValidationError as e:
            raise QueryTLSError(
                f"worker {worker}'s record in ZooKeeper is not a worker record ({e.error_count()} problem(s), e.g. "
                f"{e.errors()[0]['msg']} at {e.errors()[0]['loc']}), so whether it serves TLS is unknown and nothing was "
                "sent to it: restart the worker with this stream_ops, or pass --query-tls-ca (QueryConfig.tls_ca)"
            ) from e
        if serves_tls:
            raise QueryTLSError(
                f"worker {worker} serves state queries over TLS and no CA was given, so nothing was sent to it "
                "(the query token would have gone in clear): pass --query-tls-ca (QueryConfig.tls_ca) with the CA "
                "that signed the workers' certificates"
            )


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
        if request is None or head + request.size + size > MAX_PATH_BYTES or request.keys + len(ask.keys) > MAX_KEYS:
            request = open_requests[ask.worker] = _Request(ask.worker)
            requests.append(request)
        request.indexes.append(index)
        request.asks.append(ask)
        request.params += params
        request.size += size
        request.keys += len(ask.keys)
    return requests


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
        raise _refused(worker, what, e, access) from e
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


#: Refusals that may be over when asked again: the task moving (404), a slow client cut off
#: (408), a failed lookup (500, e.g. a store closing), a busy server (503), proxies' 502/504.
_TRANSIENT_STATUSES = frozenset({404, 408, 500, 502, 503, 504})
#: Refusals of the keys themselves.
_REQUEST_STATUSES = frozenset({400, 414})


def _refused(worker: str, what: str, error: urllib.error.HTTPError, access: QueryAccess) -> QueryError:
    """The error of a worker's refusal, by whether asking again may help."""
    if error.code == 401:
        sent = "the query token sent is not the one it serves with" if access.token else "no query token was sent"
        return QueryAuthError(
            f"worker {worker} refused the query for {what}: {sent}; pass --query-token-file or --zk-auth matching the cluster's"
        )
    detail = error.read(4096).decode("utf-8", "replace")
    message = f"worker {worker} refused the query for {what}: {error.code} {detail}"
    if error.code in _TRANSIENT_STATUSES:
        return QueryUnavailableError(message)
    if error.code in _REQUEST_STATUSES:
        return QueryRequestError(message)
    return QueryError(message)


def _no_answer(worker: str, what: str, error: object, access: QueryAccess) -> QueryUnavailableError:
    """A worker that did not answer; a dropped plain request may mean the worker serves TLS."""
    dropped = (ConnectionResetError, ConnectionAbortedError, BrokenPipeError, http.client.HTTPException)
    hint = ""
    if access.tls is None and isinstance(error, dropped):
        hint = "; if the workers serve TLS (--query-tls-cert), pass --query-tls-ca"
    return QueryUnavailableError(f"worker {worker} ({what}) did not answer: {error!r}{hint}")


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
