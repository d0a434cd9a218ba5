"""ZkStore against a real ZooKeeper: JSON, compare-and-set, transactions, sessions, errors."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from stream_ops.config import ZooKeeperConfig
from stream_ops.coordination import ZkPaths, ZkStore, encode_json
from stream_ops.coordination.embedded import EmbeddedZooKeeper
from stream_ops.coordination.session import ConnectionState
from stream_ops.errors import (
    ConcurrentUpdateError,
    CoordinationError,
    TransactionFailedError,
    TransientError,
    ZnodeExistsError,
    ZnodeNotFoundError,
    ZooKeeperUnavailableError,
)
from stream_ops.ports import free_port


def _wait_for(predicate, timeout_s: float = 10.0, interval_s: float = 0.01) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        time.sleep(interval_s)


def _root_store(zookeeper: EmbeddedZooKeeper) -> ZkStore:
    return ZkStore.connect(ZooKeeperConfig(hosts=zookeeper.hosts, chroot="/", connect_timeout_s=5))


# --- JSON round trip -------------------------------------------------------------------


def test_json_round_trip(zk_store: ZkStore) -> None:
    value = {"name": "wörd-count", "workers": 3, "conf": {"a": [1, 2.5, None, True]}}
    created = zk_store.create_json(ZkPaths.storm("wc-1-1700000000"), value)
    assert created == "/storms/wc-1-1700000000"
    found = zk_store.get_json(created)
    assert found is not None
    data, stat = found
    assert data == value
    assert stat.version == 0
    raw, _ = zk_store.client.get(created)
    assert raw == encode_json(value)
    assert b" " not in raw and "wörd".encode() in raw  # compact, utf-8

    stat = zk_store.set_json(created, {"status": "KILLED"}, version=0)
    assert stat.version == 1
    assert zk_store.get_json(created)[0] == {"status": "KILLED"}  # type: ignore[index]


def test_missing_and_empty_nodes(zk_store: ZkStore) -> None:
    assert zk_store.get_json("/nope") is None
    assert not zk_store.exists("/nope")
    assert zk_store.children("/nope") == []
    zk_store.ensure_path("/a/b/c")
    assert zk_store.exists("/a/b/c")
    found = zk_store.get_json("/a/b")
    assert found is not None and found[0] is None


def test_ensure_paths_creates_several_paths_and_keeps_existing_nodes(zk_store: ZkStore) -> None:
    zk_store.create_json("/many/kept", {"data": 1})
    zk_store.ensure_paths(["/many/kept", "/many/x/y", "/many/z", "/other"])
    for path in ("/many/x/y", "/many/z", "/other"):
        assert zk_store.exists(path)
    assert zk_store.get_json("/many/kept")[0] == {"data": 1}  # type: ignore[index]
    zk_store.ensure_paths([])  # nothing to do


def test_create_conflicts_and_missing_parents(zk_store: ZkStore) -> None:
    zk_store.create_json("/x", 1)
    with pytest.raises(ZnodeExistsError, match="/x"):
        zk_store.create_json("/x", 2)
    with pytest.raises(ZnodeNotFoundError, match="/p/q"):
        zk_store.create_json("/p/q", 1, makepath=False)
    with pytest.raises(ZnodeNotFoundError, match="/missing"):
        zk_store.set_json("/missing", 1)


def test_set_with_stale_version_is_a_concurrent_update(zk_store: ZkStore) -> None:
    zk_store.create_json("/v", {"n": 0})
    zk_store.set_json("/v", {"n": 1}, version=0)
    with pytest.raises(ConcurrentUpdateError) as info:
        zk_store.set_json("/v", {"n": 2}, version=0)
    assert isinstance(info.value, TransientError)
    assert zk_store.get_json("/v")[0] == {"n": 1}  # type: ignore[index]


def test_sequence_children_delete(zk_store: ZkStore) -> None:
    first = zk_store.create_json("/errors/t/e-", "boom", sequence=True)
    second = zk_store.create_json("/errors/t/e-", "bang", sequence=True)
    assert first.startswith("/errors/t/e-") and len(first) == len("/errors/t/e-") + 10
    assert first < second
    zk_store.create_json("/errors/t/a", 0)
    assert zk_store.children("/errors/t") == sorted(["a", first.rsplit("/", 1)[1], second.rsplit("/", 1)[1]])
    zk_store.delete_recursive("/errors")
    assert not zk_store.exists("/errors")
    zk_store.delete_recursive("/errors")  # missing is fine
    zk_store.create_json("/one", 1)
    with pytest.raises(ZnodeNotFoundError):
        zk_store.delete("/two")
    zk_store.delete("/one", version=0)
    assert not zk_store.exists("/one")


def test_not_json_is_reported(zk_store: ZkStore) -> None:
    zk_store.client.create("/raw", b"\xff\x00not json")
    with pytest.raises(CoordinationError, match="/raw"):
        zk_store.get_json("/raw")


# --- read-modify-write -----------------------------------------------------------------


def test_update_json_creates_with_default(zk_store: ZkStore) -> None:
    with pytest.raises(ZnodeNotFoundError, match="default"):
        zk_store.update_json("/cfg", lambda v: v)
    assert zk_store.update_json("/deep/cfg", lambda v: {**v, "n": 1}, default={}) == {"n": 1}
    assert zk_store.update_json("/deep/cfg", lambda v: {**v, "n": v["n"] + 1}, default={}) == {"n": 2}
    assert zk_store.get_json("/deep/cfg")[0] == {"n": 2}  # type: ignore[index]


def test_concurrent_updates_from_two_sessions_are_exact(zk_config: ZooKeeperConfig) -> None:
    per_thread = 60
    stores = [ZkStore.connect(zk_config) for _ in range(2)]
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def _work(store: ZkStore) -> None:
        try:
            barrier.wait()
            for _ in range(per_thread):
                store.update_json("/counter", lambda v: {"n": v["n"] + 1}, default={"n": 0}, retries=200)
        except BaseException as e:  # noqa: BLE001 - pragma: no cover - reported below
            errors.append(e)

    try:
        threads = [threading.Thread(target=_work, args=(s,)) for s in stores for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors
        found = stores[0].get_json("/counter")
        assert found is not None
        assert found[0] == {"n": 4 * per_thread}
        assert found[1].version == 4 * per_thread - 1
    finally:
        for s in stores:
            s.close()


def test_update_gives_up_after_retries(zk_store: ZkStore) -> None:
    zk_store.create_json("/hot", 0)

    def _meddle(value: int) -> int:
        zk_store.set_json("/hot", value + 100)  # another writer wins every time
        return value + 1

    with pytest.raises(ConcurrentUpdateError, match="3 attempts"):
        zk_store.update_json("/hot", _meddle, retries=3)


def test_counter_is_monotonic_and_unique(zk_config: ZooKeeperConfig) -> None:
    stores = [ZkStore.connect(zk_config) for _ in range(2)]
    seen: list[list[int]] = [[], []]

    def _work(i: int) -> None:
        for _ in range(40):
            seen[i].append(stores[i].next_counter(ZkPaths.ID_COUNTER))

    try:
        threads = [threading.Thread(target=_work, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        for values in seen:
            assert values == sorted(values) and len(set(values)) == len(values)
        assert sorted(seen[0] + seen[1]) == list(range(1, 81))
        assert stores[0].next_counter(ZkPaths.ID_COUNTER) == 81
    finally:
        for s in stores:
            s.close()


def test_counter_rejects_non_integer(zk_store: ZkStore) -> None:
    zk_store.create_json("/c", "seven")
    with pytest.raises(CoordinationError, match="not an integer"):
        zk_store.next_counter("/c")


# --- transactions ----------------------------------------------------------------------


def test_transaction_commits_atomically(zk_store: ZkStore) -> None:
    zk_store.create_json("/owner", {"worker": "h:1"})
    zk_store.ensure_path("/tx")  # transactions do not create parents
    tx = zk_store.transaction()
    tx.check("/owner", 0)
    tx.create("/tx/a", encode_json({"txid": 1}))
    tx.set_data("/owner", encode_json({"worker": "h:1", "epoch": 2}), version=0)
    results = zk_store.commit_transaction(tx)
    assert results[0] is True
    assert results[1] == "/tx/a"
    assert zk_store.get_json("/tx/a")[0] == {"txid": 1}  # type: ignore[index]
    assert zk_store.get_json("/owner")[0]["epoch"] == 2  # type: ignore[index]


def test_transaction_failure_names_the_operation(zk_store: ZkStore) -> None:
    zk_store.create_json("/owner", {"worker": "h:1"})
    zk_store.set_json("/owner", {"worker": "h:2"})  # version is now 1
    zk_store.ensure_path("/tx")
    tx = zk_store.transaction()
    tx.create("/tx/b", encode_json(1))
    tx.check("/owner", 0)
    tx.set_data("/owner", encode_json({}), version=1)
    with pytest.raises(TransactionFailedError) as info:
        zk_store.commit_transaction(tx)
    err = info.value
    assert (err.index, err.operation, err.path, err.reason) == (1, "check", "/owner", "BadVersionError")
    assert "operation 1 (check /owner)" in str(err)
    assert isinstance(err, CoordinationError)
    assert not zk_store.exists("/tx/b")  # nothing applied

    tx = zk_store.transaction()
    tx.set_data("/owner", encode_json({}), version=1)
    tx.delete("/gone")
    with pytest.raises(TransactionFailedError) as info:
        zk_store.commit_transaction(tx)
    assert (info.value.index, info.value.operation, info.value.reason) == (1, "delete", "NoNodeError")
    assert zk_store.get_json("/owner")[1].version == 1  # type: ignore[index]


# --- sessions --------------------------------------------------------------------------


def test_ephemeral_node_disappears_after_close(zk_store: ZkStore, zk_config: ZooKeeperConfig) -> None:
    other = ZkStore.connect(zk_config)
    other.create_json(ZkPaths.worker("h:6700"), {"pid": 1}, ephemeral=True)
    assert zk_store.exists(ZkPaths.worker("h:6700"))
    other.close()
    other.close()  # idempotent
    _wait_for(lambda: not zk_store.exists(ZkPaths.worker("h:6700")), timeout_s=2)
    with pytest.raises(ZooKeeperUnavailableError, match="closed"):
        other.get_json("/")


def test_chroot_is_created(zookeeper: EmbeddedZooKeeper, zk_config: ZooKeeperConfig) -> None:
    nested = zk_config.model_copy(update={"chroot": f"{zk_config.chroot}/deeper/still"})
    with _root_store(zookeeper) as root:
        assert not root.exists(zk_config.chroot)
        with ZkStore.connect(nested) as store:
            store.create_json("/inside", 1)
        assert root.exists(f"{nested.chroot}/inside")
        root.delete_recursive(zk_config.chroot)


def test_listener_sees_session_end(zk_config: ZooKeeperConfig) -> None:
    store = ZkStore.connect(zk_config)
    states: list[ConnectionState] = []
    store.add_listener(states.append)
    assert store.connected
    store.close()
    _wait_for(lambda: ConnectionState.LOST in states, timeout_s=2)
    assert all(isinstance(state, ConnectionState) for state in states)


def test_unavailable_hosts_fail_fast() -> None:
    port = free_port()  # nothing listens there
    config = ZooKeeperConfig(hosts=f"127.0.0.1:{port}", chroot="/x", connect_timeout_s=0.5)
    started = time.monotonic()
    with pytest.raises(ZooKeeperUnavailableError, match=f"127.0.0.1:{port}") as info:
        ZkStore.connect(config)
    assert time.monotonic() - started < 3
    assert "zookeeper start" in str(info.value)


def test_digest_auth_protects_nodes(zookeeper: EmbeddedZooKeeper) -> None:
    chroot = f"/test-auth-{uuid.uuid4().hex}"
    secured = ZooKeeperConfig(hosts=zookeeper.hosts, chroot=chroot, auth_digest="alice:secret")
    with ZkStore.connect(secured) as alice:
        alice.create_json("/private", {"k": 1})
        assert alice.get_json("/private")[0] == {"k": 1}  # type: ignore[index]
        stranger = ZooKeeperConfig(hosts=zookeeper.hosts, chroot=chroot, auth_digest="mallory:guess")
        with pytest.raises(CoordinationError, match="NoAuthError.*auth_digest"):
            ZkStore.connect(stranger)
        outside = stranger.model_copy(update={"chroot": "/"})
        with ZkStore.connect(outside) as mallory, pytest.raises(CoordinationError, match="NoAuth"):
            mallory.get_json(f"{chroot}/private")
        alice.delete_recursive("/private")
