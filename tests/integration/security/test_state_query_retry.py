"""A topology's own ``state_query`` lookups under a refusing query port (issue 30, item 3).

A lookup refused for now (503, connection refused, a task that moved) is asked again within
its batch; one that never gets an answer fails the batch with a transient error, and no record
is dead-lettered for it. Only a record whose own key is refused is a dead letter. A client
without a CA sends nothing, token included, to a worker whose record says it serves TLS.

Real parts: a :class:`QueryServer` on a real socket, routing through a real ZooKeeper
(assignment and worker records), the record pipeline the task runner calls.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stream_ops import Count, FileTopic, OpaqueMapState, Topology
from stream_ops.config import QueryConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import AssignmentRecord, WorkerRecord
from stream_ops.coordination.store import ZkStore
from stream_ops.dsl.build_plan import build_plan
from stream_ops.errors import (
    QueryTLSError,
    QueryUnavailableError,
    StateQueryUnavailableError,
    TransientError,
    ZooKeeperUnavailableError,
)
from stream_ops.examples.wordcount import split
from stream_ops.operators.record_pipeline import run_batch
from stream_ops.operators.trident_state import MapGet
from stream_ops.ports import free_port
from stream_ops.runtime.query_client import QueryAccess, get_keys
from stream_ops.runtime.query_server import QueryLimits, QueryServer
from stream_ops.runtime.state_reader import LookupRetry, StateReader
from stream_ops.topology.plan import Plan, StageSpec

TOKEN = "query-token-of-the-retry-tests-0123456"
TOPOLOGY_ID = "wc-ask-1-1700000000"
QUICK = LookupRetry(give_up_after_s=1.5, first_backoff_s=0.05, max_backoff_s=0.2, attempt_timeout_s=1.0)


def _counts(topology_id: str, task_id: int, keys: list[tuple[Any, ...]]) -> list[Any] | None:
    """Every word's count is its length (a stand-in for the counts stage's state)."""
    return [len(key[0]) for key in keys] if topology_id == TOPOLOGY_ID else None


def _nowhere(topology_id: str, task_id: int, keys: list[tuple[Any, ...]]) -> list[Any] | None:
    return None


class SwallowingMapGet(MapGet):
    """A topology's query function that hides lookup failures (answers None instead)."""

    def batch_retrieve(self, state: Any, args: list[Mapping[str, Any]]) -> list[Any]:
        try:
            return super().batch_retrieve(state, args)
        except Exception:  # noqa: BLE001 - what the test is about: user code that swallows
            return [None] * len(args)


def _topology(root: Path, query_function: Any) -> Topology:
    topology = Topology("wc-ask")
    counts = (
        topology.source("sentences", FileTopic(root / "sentences", 2), schema={"sentence": "string"})
        .each(split, out="word", fields=["sentence"])
        .group_by("word")
        .persistent_aggregate(Count(), out="count", state=OpaqueMapState, name="counts")
    )
    answers = topology.source("questions", FileTopic(root / "questions", 1), schema={"word": "string"}).state_query(
        counts, ["word"], query_function, out={"count": "long"}
    )
    answers.group_by("word").persistent_aggregate(Count(), out="asked", state=OpaqueMapState, name="asked")
    return topology


@dataclass
class Routed:
    """A plan whose counts tasks are routed (in ZooKeeper) to a worker address of the test's choice."""

    store: ZkStore
    plan: Plan

    @property
    def asking_stage(self) -> StageSpec:
        return next(stage for stage in self.plan.stages if any(op.kind == "state_query" for op in stage.operations))

    def route_to(self, worker: str, *, tls: bool = False) -> None:
        """Assign every task of the counts stage to ``worker`` and register it (serving TLS or not)."""
        counts_stage = self.plan.states["counts"]
        record = AssignmentRecord(tasks={t.task_id: worker for t in self.plan.tasks if t.stage == counts_stage})
        self.store.ensure_path(ZkPaths.ASSIGNMENTS)
        if self.store.exists(ZkPaths.assignment(TOPOLOGY_ID)):
            self.store.set_json(ZkPaths.assignment(TOPOLOGY_ID), record.to_json_obj())
        else:
            self.store.create_json(ZkPaths.assignment(TOPOLOGY_ID), record.to_json_obj())
        host, port = worker.rsplit(":", 1)
        worker_record = WorkerRecord(
            worker_id=worker, host=host, port=int(port), pid=1, capacity=4, started_at=time.time(), tls=tls
        )
        self.store.ensure_path(ZkPaths.WORKERS)
        if self.store.exists(ZkPaths.worker(worker)):
            self.store.set_json(ZkPaths.worker(worker), worker_record.to_json_obj())
        else:
            self.store.create_json(ZkPaths.worker(worker), worker_record.to_json_obj())

    def ask(self, words: list[Any], retry: LookupRetry = QUICK) -> tuple[list[dict[str, Any]], list[Any]]:
        """The asking stage's operations over one question per word: (records out, dead letters)."""
        reader = StateReader(self.store, TOPOLOGY_ID, self.plan, query_config=QueryConfig(token=TOKEN), retry=retry)
        operations = self.asking_stage.operations
        by_tap, dead = run_batch([{"word": w} for w in words], operations, reader, [len(operations) - 1])
        return by_tap[len(operations) - 1], dead


@pytest.fixture
def routed(zk_store: ZkStore, tmp_path: Path) -> Routed:
    return Routed(zk_store, build_plan(_topology(tmp_path, MapGet())))


@pytest.fixture
def server() -> Iterator[QueryServer]:
    """A worker's query server answering the counts, with one pending slot per peer held for 5 s."""
    srv = QueryServer("127.0.0.1", 0, _counts, token=TOKEN, limits=QueryLimits(max_pending_per_peer=1, auth_deadline_s=5))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def _worker_of(srv: QueryServer) -> str:
    host, port = srv.server_address[:2]
    return f"{host}:{port}"


def _when(condition: Any, then: Any, timeout_s: float = 10) -> threading.Thread:
    """Run ``then`` on a thread as soon as ``condition()`` holds (polled; at most ``timeout_s``)."""

    def wait() -> None:
        deadline = time.monotonic() + timeout_s
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.01)
        then()

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread


def test_a_lookup_refused_with_503_at_first_is_answered_within_its_batch(routed: Routed, server: QueryServer) -> None:
    routed.route_to(_worker_of(server))
    busy = socket.create_connection(server.server_address[:2], timeout=5)  # holds 127.0.0.1's one pending slot
    freed = _when(lambda: server.refusals >= 2, busy.close)
    try:
        out, dead = routed.ask(["how", "are", "you", "nice"])
    finally:
        busy.close()
        freed.join(10)
    assert server.refusals >= 2, "the lookup was never refused: the test proves nothing"
    assert dead == []
    assert sorted((r["word"], r["count"]) for r in out) == [("are", 3), ("how", 3), ("nice", 4), ("you", 3)]


def test_a_task_that_moved_is_found_at_its_new_worker(routed: Routed, server: QueryServer) -> None:
    asked_old: list[int] = []

    def old_worker_lookup(topology_id: str, task_id: int, keys: list[tuple[Any, ...]]) -> list[Any] | None:
        asked_old.append(task_id)
        return None  # 404: the task is no longer here

    old = QueryServer("127.0.0.1", 0, old_worker_lookup, token=TOKEN)
    old.start()
    try:
        routed.route_to(_worker_of(old))
        moved = _when(lambda: len(asked_old) >= 1, lambda: routed.route_to(_worker_of(server)))
        out, dead = routed.ask(["moo", "cow"])
        moved.join(10)
    finally:
        old.stop()
    assert asked_old and dead == []
    assert sorted((r["word"], r["count"]) for r in out) == [("cow", 3), ("moo", 3)]


def test_a_task_whose_state_is_not_ready_answers_503_and_is_asked_again(routed: Routed) -> None:
    refused: list[int] = []

    def not_ready_at_first(topology_id: str, task_id: int, keys: list[tuple[Any, ...]]) -> list[Any] | None:
        if len(refused) < 2:
            refused.append(task_id)
            raise ZooKeeperUnavailableError("not connected to ZooKeeper; ask again shortly")
        return _counts(topology_id, task_id, keys)

    srv = QueryServer("127.0.0.1", 0, not_ready_at_first, token=TOKEN)
    srv.start()
    try:
        routed.route_to(_worker_of(srv))
        with pytest.raises(QueryUnavailableError, match=r"503 .*ask again shortly"):
            get_keys(
                routed.store, TOPOLOGY_ID, routed.plan, routed.plan.states["counts"], [["how"]], access=QueryAccess(token=TOKEN)
            )
        out, dead = routed.ask(["how", "you"])
    finally:
        srv.stop()
    assert len(refused) == 2 and dead == []
    assert sorted((r["word"], r["count"]) for r in out) == [("how", 3), ("you", 3)]


@pytest.mark.parametrize("why", ["refused", "busy", "swallowed"])
def test_a_lookup_that_keeps_failing_fails_the_batch_and_dead_letters_nothing(
    zk_store: ZkStore, tmp_path: Path, server: QueryServer, why: str
) -> None:
    routed = Routed(zk_store, build_plan(_topology(tmp_path, SwallowingMapGet() if why == "swallowed" else MapGet())))
    busy = socket.create_connection(server.server_address[:2], timeout=5)
    try:
        # Nothing listens on a free port (connection refused); the server refuses 127.0.0.1 (503).
        routed.route_to(_worker_of(server) if why == "busy" else f"127.0.0.1:{free_port()}")
        started = time.monotonic()
        with pytest.raises(StateQueryUnavailableError, match="no answer after .* attempt") as caught:
            routed.ask(["how", "are", "you"])
        took = time.monotonic() - started
    finally:
        busy.close()
    assert isinstance(caught.value, TransientError)
    assert QUICK.give_up_after_s - 0.3 < took < QUICK.give_up_after_s + 2.0
    if why == "busy":
        assert server.refusals >= 3


def test_only_the_record_whose_key_is_refused_is_a_dead_letter(routed: Routed, server: QueryServer) -> None:
    routed.route_to(_worker_of(server))
    too_deep: Any = "x"
    for _ in range(20):
        too_deep = [too_deep]
    out, dead = routed.ask(["how", too_deep, "are", "you"])
    assert sorted((r["word"], r["count"]) for r in out) == [("are", 3), ("how", 3), ("you", 3)]
    assert len(dead) == 1 and dead[0].record == {"word": too_deep}
    assert "QueryRequestError" in dead[0].error and "400" in dead[0].error


def test_a_batch_with_more_keys_than_a_request_holds_is_asked_in_several(routed: Routed) -> None:
    srv = QueryServer("127.0.0.1", 0, _counts, token=TOKEN)  # default limits: the requests go 8 at once
    srv.start()
    try:
        routed.route_to(_worker_of(srv))
        words = [f"word-{i:05d}" for i in range(25_000)]  # two tasks, each past MAX_KEYS and the request size
        out, dead = routed.ask(words)
    finally:
        srv.stop()
    assert dead == [] and len(out) == len(words)
    assert all(r["count"] == 10 for r in out)


# --- the token never goes in clear to a worker serving TLS ------------------------------------------


class Recorder:
    """A listening socket that keeps every byte any client sends it (and answers nothing)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.received = b""
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def worker(self) -> str:
        return f"127.0.0.1:{self.sock.getsockname()[1]}"

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.connections += 1
            with conn:
                conn.settimeout(0.5)
                try:
                    while chunk := conn.recv(65536):
                        self.received += chunk
                        if b"\r\n\r\n" in self.received:
                            break
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


def test_no_byte_of_the_token_reaches_a_worker_that_serves_tls(routed: Routed) -> None:
    recorder = Recorder()
    try:
        plain = QueryAccess(token=TOKEN)
        stage = routed.plan.states["counts"]
        routed.route_to(recorder.worker, tls=True)
        with pytest.raises(QueryTLSError, match="pass --query-tls-ca") as caught:
            get_keys(routed.store, TOPOLOGY_ID, routed.plan, stage, [["how"]], access=plain, timeout_s=1.0)
        assert "serves state queries over TLS" in str(caught.value)
        assert TOKEN not in str(caught.value)
        # A record that does not say whether the worker serves TLS is refused as well.
        record = routed.store.get_json(ZkPaths.worker(recorder.worker))[0]
        del record["tls"]
        routed.store.set_json(ZkPaths.worker(recorder.worker), record)
        with pytest.raises(QueryTLSError, match="not a worker record"):
            get_keys(routed.store, TOPOLOGY_ID, routed.plan, stage, [["how"]], access=plain, timeout_s=1.0)
        # The same client and worker, the record not saying TLS: the token goes out, so the
        # recorder would have seen it above.
        routed.route_to(recorder.worker, tls=False)
        with pytest.raises(QueryUnavailableError):  # the recorder answers nothing
            get_keys(routed.store, TOPOLOGY_ID, routed.plan, stage, [["how"]], access=plain, timeout_s=1.0)
        assert f"Bearer {TOKEN}".encode() in recorder.received
        assert recorder.connections == 1, "the client connected to the TLS worker before refusing"
    finally:
        recorder.close()
