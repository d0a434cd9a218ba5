"""run_nimbus: two contenders, only the elected one acts; failover on stop and on a lost session."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient

from stream_ops.config import ZooKeeperConfig
from stream_ops.coordination.election import election_contenders
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.nimbus import leader as leader_module
from stream_ops.nimbus.assignment import read_assignment
from stream_ops.nimbus.leader import current_leader, run_nimbus
from stream_ops.nimbus.monitor import REASON_WORKER_GONE, MonitorAction


class Nimbuses:
    """Runs several ``run_nimbus`` threads and records what each one did."""

    def __init__(self, zk_config: ZooKeeperConfig) -> None:
        self.zk_config = zk_config
        self.lock = threading.Lock()
        self.actions: list[tuple[str, MonitorAction]] = []
        self.leadership: list[tuple[str, bool]] = []
        self.stops: dict[str, threading.Event] = {}
        self.threads: dict[str, threading.Thread] = {}

    def _on_action(self, ident: str, action: MonitorAction) -> None:
        with self.lock:
            self.actions.append((ident, action))

    def _on_leadership(self, ident: str, leading: bool) -> None:
        with self.lock:
            self.leadership.append((ident, leading))

    def start(self, ident: str) -> None:
        stop = threading.Event()
        thread = threading.Thread(
            target=run_nimbus,
            args=(self.zk_config, stop),
            kwargs={
                "interval_s": 0.05,
                "task_timeout_s": 1.0,
                "launch_grace_s": 30.0,
                "identifier": ident,
                "on_action": self._on_action,
                "on_leadership": self._on_leadership,
            },
            name=f"test-{ident}",
            daemon=True,
        )
        self.stops[ident] = stop
        self.threads[ident] = thread
        thread.start()

    def stop(self, ident: str, timeout_s: float = 10.0) -> None:
        self.stops[ident].set()
        self.threads[ident].join(timeout_s)
        assert not self.threads[ident].is_alive(), f"run_nimbus {ident} did not return"

    def leaders(self) -> list[str]:
        """Identifiers that became leader, in order."""
        with self.lock:
            return [ident for ident, leading in self.leadership if leading]

    def actors(self) -> list[str]:
        with self.lock:
            return [ident for ident, _ in self.actions]


@pytest.fixture
def nimbuses(zk_config: ZooKeeperConfig) -> Iterator[Nimbuses]:
    group = Nimbuses(zk_config)
    yield group
    for ident in list(group.threads):
        group.stop(ident)


def test_only_the_leader_acts_and_the_follower_takes_over_when_it_stops(
    zk_store: ZkStore,
    fake_worker: Callable[[int], Any],
    submit_wordcount: Callable[..., str],
    nimbuses: Nimbuses,
    poll: Callable[..., None],
) -> None:
    w1, w2, w3 = fake_worker(7001), fake_worker(7002), fake_worker(7003)
    topology_id = submit_wordcount(workers=2)
    nimbuses.start("nimbus-a")
    nimbuses.start("nimbus-b")
    poll(lambda: nimbuses.leaders())
    first = nimbuses.leaders()[0]
    other = "nimbus-b" if first == "nimbus-a" else "nimbus-a"
    poll(lambda: len(election_contenders(zk_store, ZkPaths.NIMBUS_ELECTION)) == 2)
    assert current_leader(zk_store) == first

    lost = w1.assigned(topology_id)
    w1.die(zk_store)
    poll(lambda: nimbuses.actors())
    ident, action = nimbuses.actions[0]
    assert ident == first
    assert action.dead == dict.fromkeys(lost, REASON_WORKER_GONE)
    assert set(action.moved) == set(lost)
    assert nimbuses.leaders() == [first]  # the follower never ran a tick

    # The leader stops: the follower is elected and acts on the next death.
    nimbuses.stop(first)
    poll(lambda: nimbuses.leaders() == [first, other])
    assert current_leader(zk_store) == other
    w2.die(zk_store)
    poll(lambda: len(nimbuses.actions) == 2)
    ident2, action2 = nimbuses.actions[1]
    assert ident2 == other
    assert action2.epoch == action.epoch + 1
    found = read_assignment(zk_store, topology_id)
    assert found is not None
    assert set(found[0].tasks.values()) == {w3.worker_id}
    assert nimbuses.actors() == [first, other]


def test_a_leader_whose_session_is_lost_steps_down_and_contends_again(
    zk_config: ZooKeeperConfig,
    zk_store: ZkStore,
    nimbuses: Nimbuses,
    poll: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stores: dict[str, ZkStore] = {}
    real_connect = ZkStore.connect

    def capture(config: ZooKeeperConfig, **kwargs: Any) -> ZkStore:
        store = real_connect(config, **kwargs)
        stores[threading.current_thread().name] = store
        return store

    monkeypatch.setattr(leader_module.ZkStore, "connect", staticmethod(capture))
    nimbuses.start("nimbus-a")
    poll(lambda: nimbuses.leaders() == ["nimbus-a"])
    nimbuses.start("nimbus-b")
    poll(lambda: election_contenders(zk_store, ZkPaths.NIMBUS_ELECTION) == ["nimbus-a", "nimbus-b"])

    # Expire nimbus-a's session the way kazoo's test harness does: a second client joins the
    # session and closes it.
    client = stores["test-nimbus-a"].client
    session_id, password = client.client_id
    intruder = KazooClient(hosts=zk_config.hosts, client_id=(session_id, password), timeout=zk_config.session_timeout_s)
    intruder.start(timeout=5)
    intruder.stop()
    intruder.close()

    poll(lambda: ("nimbus-a", False) in nimbuses.leadership)
    poll(lambda: nimbuses.leaders() == ["nimbus-a", "nimbus-b"])
    # nimbus-a is back in the queue with its new session, behind nimbus-b.
    poll(lambda: election_contenders(zk_store, ZkPaths.NIMBUS_ELECTION) == ["nimbus-b", "nimbus-a"])
    assert current_leader(zk_store) == "nimbus-b"


def test_run_nimbus_returns_promptly_while_contending(zk_store: ZkStore, nimbuses: Nimbuses, poll: Callable[..., None]) -> None:
    nimbuses.start("nimbus-a")
    poll(lambda: nimbuses.leaders() == ["nimbus-a"])
    nimbuses.start("nimbus-b")
    poll(lambda: len(election_contenders(zk_store, ZkPaths.NIMBUS_ELECTION)) == 2)
    nimbuses.stop("nimbus-b", timeout_s=3.0)  # a follower blocked in the election
    nimbuses.stop("nimbus-a", timeout_s=3.0)  # the leader
    poll(lambda: election_contenders(zk_store, ZkPaths.NIMBUS_ELECTION) == [])
    assert current_leader(zk_store) is None
    assert ("nimbus-a", False) in nimbuses.leadership


def test_run_nimbus_rejects_bad_settings(zk_config: ZooKeeperConfig) -> None:
    with pytest.raises(ValueError):
        run_nimbus(zk_config, threading.Event(), interval_s=0)
    with pytest.raises(ValueError):
        run_nimbus(zk_config, threading.Event(), task_timeout_s=-1)
