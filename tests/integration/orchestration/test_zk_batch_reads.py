"""ZkStore's batch reads (get_many, get_json_many, children_many) against the session ZooKeeper.

Each test runs twice: with multiRead requests (ZooKeeper 3.6+, the default) and with the
pipelined single reads a store falls back to on a server without multiRead.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from stream_ops.config import ZooKeeperConfig
from stream_ops.coordination import store as store_module
from stream_ops.coordination.acl import cluster_acl
from stream_ops.coordination.store import ZkStore, encode_json
from stream_ops.errors import CoordinationError, ZooKeeperUnavailableError

NODES = 1000


@pytest.fixture(params=["multiRead", "single reads"])
def zk_store(request: pytest.FixtureRequest, zk_config: ZooKeeperConfig) -> Iterator[ZkStore]:
    """The shared fixture's store, in both batch-read modes."""
    store = ZkStore.connect(zk_config)
    store._multi_read = request.param == "multiRead"
    try:
        yield store
    finally:
        store.close()


@pytest.fixture
def many_nodes(zk_store: ZkStore) -> list[str]:
    """``/batch/n0000`` .. ``/batch/n0999``, node i holding ``{"i": i}`` (created in transactions)."""
    zk_store.ensure_path("/batch")
    paths = [f"/batch/n{i:04d}" for i in range(NODES)]
    for start in range(0, NODES, 200):
        tx = zk_store.transaction()
        for i in range(start, start + 200):
            tx.create(paths[i], encode_json({"i": i}))
        zk_store.commit_transaction(tx)
    return paths


@pytest.mark.parametrize("concurrency", [1, 7, 200, 5000])
def test_get_many_reads_every_node_as_get_bytes_does(zk_store: ZkStore, many_nodes: list[str], concurrency: int) -> None:
    missing = [f"/batch/missing{i}" for i in range(50)] + ["/no/such/parent/node"]
    # Missing nodes interleaved with existing ones, and a duplicate.
    paths = [p for pair in zip(many_nodes, missing + [None] * NODES) for p in pair if p is not None] + [many_nodes[3]]

    found = zk_store.get_many(paths, concurrency=concurrency)

    assert list(found) == list(dict.fromkeys(paths))  # the order asked for, duplicates once
    assert all(found[p] is None for p in missing)
    for path in many_nodes:
        node = found[path]
        assert node is not None
        assert node == zk_store.get_bytes(path)
    assert found[many_nodes[42]][0] == encode_json({"i": 42})  # type: ignore[index]


def test_get_json_many_decodes_and_keeps_stats(zk_store: ZkStore, many_nodes: list[str]) -> None:
    zk_store.set_json(many_nodes[5], {"i": 5, "changed": True})
    found = zk_store.get_json_many([*many_nodes[:10], "/batch/none"])
    assert found["/batch/none"] is None
    assert [found[p][0] for p in many_nodes[:3]] == [{"i": 0}, {"i": 1}, {"i": 2}]  # type: ignore[index]
    assert found[many_nodes[5]] == zk_store.get_json(many_nodes[5])
    assert found[many_nodes[5]][1].version == 1  # type: ignore[index]
    assert zk_store.get_json_many([]) == {}


def test_children_many_lists_sorted_and_none_for_missing(zk_store: ZkStore, many_nodes: list[str]) -> None:
    for name in ("b", "a", "c"):
        zk_store.create_json(f"/batch/n0001/{name}", None)
    found = zk_store.children_many(["/batch", "/batch/n0001", "/batch/n0002", "/batch/missing"], concurrency=2)
    assert found["/batch"] == [p.rpartition("/")[2] for p in many_nodes]
    assert found["/batch/n0001"] == ["a", "b", "c"]
    assert found["/batch/n0002"] == []
    assert found["/batch/missing"] is None


def test_batch_reads_check_their_concurrency(zk_store: ZkStore) -> None:
    with pytest.raises(ValueError, match="concurrency"):
        zk_store.get_many(["/a"], concurrency=0)
    with pytest.raises(ValueError, match="concurrency"):
        zk_store.children_many(["/a"], concurrency=-1)


def test_a_refused_read_is_a_coordination_error(zk_store: ZkStore, zk_config: ZooKeeperConfig) -> None:
    """A node only another identity may read: the batch fails with the store's error, naming it."""
    zk_store.create_json("/locked", {"secret": 1})
    zk_store.create_json("/open", {"public": 1})
    owner_only = cluster_acl(zk_config.model_copy(update={"auth_digest": "someone-else:pw", "open_reads": False}))
    assert owner_only is not None
    zk_store.set_acl("/locked", owner_only)
    with pytest.raises(CoordinationError, match="/locked.*NoAuth"):
        zk_store.get_many(["/open", "/locked"])


def test_a_closed_store_is_unavailable(zk_config: ZooKeeperConfig) -> None:
    store = ZkStore.connect(zk_config)
    store.close()
    with pytest.raises(ZooKeeperUnavailableError, match="closed"):
        store.get_many(["/a", "/b"])
    with pytest.raises(ZooKeeperUnavailableError, match="closed"):
        store.children_many(["/a"])


def test_a_server_without_multi_read_gets_single_reads(
    zk_store: ZkStore, many_nodes: list[str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An opcode the server does not know is answered UNIMPLEMENTED, as a ZooKeeper < 3.6 answers multiRead."""
    monkeypatch.setattr(store_module._MultiRead, "type", 99)
    tried_multi_read = zk_store._multi_read
    expected = {path: zk_store.get_bytes(path) for path in many_nodes[:300]}
    with caplog.at_level(logging.WARNING, logger=store_module.__name__):
        assert zk_store.get_many([*many_nodes[:300], "/batch/none"]) == {**expected, "/batch/none": None}
        assert zk_store.children_many(["/batch/n0001", "/none"]) == {"/batch/n0001": [], "/none": None}
    assert zk_store._multi_read is False
    warnings = [r.getMessage() for r in caplog.records if "multiRead" in r.getMessage()]
    assert len(warnings) == (1 if tried_multi_read else 0)  # said once, then single reads
    assert all("UnimplementedError" in w for w in warnings)


def _losing_connection(store: ZkStore, monkeypatch: pytest.MonkeyPatch, times: int) -> list[int]:
    """The first ``times`` requests of ``store``'s batch reads fail with ConnectionLoss (counted)."""
    from kazoo.exceptions import ConnectionLoss

    real = store._start_reads
    calls = [0]

    def start(kind: Any, paths: list[str]) -> Any:
        calls[0] += 1
        if calls[0] > times:
            return real(kind, paths)
        result = store.client.handler.async_result()
        result.set_exception(ConnectionLoss())
        return result

    monkeypatch.setattr(store, "_start_reads", start)
    return calls


def test_reads_lost_with_the_connection_are_sent_again(
    zk_store: ZkStore, many_nodes: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = zk_store.get_many(many_nodes, concurrency=50)
    calls = _losing_connection(zk_store, monkeypatch, times=2)
    assert zk_store.get_many(many_nodes, concurrency=50) == expected
    assert calls[0] > 2


def test_a_connection_that_stays_lost_is_unavailable(zk_config: ZooKeeperConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    with ZkStore.connect(zk_config, operation_timeout_s=0.5) as store:
        _losing_connection(store, monkeypatch, times=10**9)
        with pytest.raises(ZooKeeperUnavailableError, match="ConnectionLoss"):
            store.get_many(["/a", "/b"])


@pytest.mark.parametrize("zk_store", ["multiRead"], indirect=True)  # about the multiRead fallback only
def test_falling_back_in_a_retry_keeps_what_was_read(
    zk_store: ZkStore, many_nodes: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Round 1: the first multiRead is answered, the second lost; round 2 finds no multiRead."""
    assert zk_store._multi_read
    from kazoo.exceptions import ConnectionLoss

    expected = {path: zk_store.get_bytes(path) for path in many_nodes}
    real = zk_store._start_reads
    calls = [0]

    def start(kind: Any, paths: list[str]) -> Any:
        calls[0] += 1
        if calls[0] != 2:
            return real(kind, paths)
        monkeypatch.setattr(store_module._MultiRead, "type", 99)  # the server "forgets" multiRead
        result = zk_store.client.handler.async_result()
        result.set_exception(ConnectionLoss())
        return result

    monkeypatch.setattr(zk_store, "_start_reads", start)
    assert zk_store.get_many(many_nodes, concurrency=200) == expected
    assert zk_store._multi_read is False


@pytest.mark.parametrize("chroot", ["", "/", "/c", "/c/d", "c/d/"])
def test_paths_are_chrooted_as_kazoo_does(chroot: str) -> None:
    from kazoo.protocol.paths import _norm_root, _prefix_root

    root = _norm_root(chroot)
    for path in ["/", "/a", "/a/b-1", "/a//b", "/a/b/", "a/b", "/.a", "/a/.b", "/x/127.0.0.1:6700", "/é/ü"]:
        assert store_module._chrooted(root, path) == _prefix_root(root, path), path
