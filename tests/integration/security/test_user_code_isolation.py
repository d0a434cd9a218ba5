"""Each submission runs its own code: a resubmitted v2 runs v2, and two topologies shipping
different packages of the same name each run their own, on one worker process, in its driver
(a processing element) and in Spark's reused Python workers (an ``each`` in ``mapInArrow``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from user_packages import forget, import_ops, tagged_keys, tagging_topology, write_package

from stream_ops.local_stack import wait_for_counts
from stream_ops.nimbus import kill, live_workers, reassign, submit
from stream_ops.runtime.query_client import query_state
from stream_ops.topics.producer import produce


@pytest.fixture
def package_names() -> Iterator[list[str]]:
    """Names of the packages a test imports; forgotten afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        forget(name)


def test_a_resubmitted_package_runs_its_new_source(worker_pool, zk_store, tmp_path: Path, wait_until, package_names) -> None:
    package_names.append("verpkg")
    src = tmp_path / "src"
    write_package(src, "verpkg", "v1")
    v1 = tagging_topology("versioned", import_ops(src, "verpkg"), tmp_path / "in-1")
    worker_pool.start()
    wait_until(lambda: live_workers(zk_store), 60, "the worker to register")
    submit(zk_store, worker_pool.cluster, v1, workers=1)
    forget("verpkg")  # the worker must get it from the code archive, as a worker process would
    produce(v1.chains[0].source.topic, [{"sentence": "hello world"}])
    wait_for_counts(zk_store, "versioned", "words", {"hello-v1-v1": 1, "world-v1-v1": 1}, timeout_s=90)

    kill(zk_store, "versioned", wait_s=2.0)
    write_package(src, "verpkg", "v2")  # the user fixes a bug in place and resubmits
    v2 = tagging_topology("versioned", import_ops(src, "verpkg"), tmp_path / "in-2")
    submit(zk_store, worker_pool.cluster, v2, workers=1)
    forget("verpkg")
    produce(v2.chains[0].source.topic, [{"sentence": "hello again"}])
    wait_for_counts(zk_store, "versioned", "words", {"hello-v2-v2": 1, "again-v2-v2": 1}, timeout_s=90)
    stale = query_state(zk_store, "versioned", "words", tagged_keys("hello", ["v1", "v2"]))
    assert stale == {"hello-v1-v1": None, "hello-v1-v2": None, "hello-v2-v1": None, "hello-v2-v2": 1}


def test_two_topologies_shipping_packages_of_the_same_name_each_run_their_own(
    worker_pool, zk_store, tmp_path: Path, wait_until, package_names
) -> None:
    package_names.append("samepkg")
    topologies = {}
    for version in ("A", "B"):
        src = tmp_path / f"src-{version}"
        write_package(src, "samepkg", version)
        topology = tagging_topology(f"same-{version.lower()}", import_ops(src, "samepkg"), tmp_path / f"in-{version}")
        # Submitted while the package of this version is the one imported here: its archive holds it.
        topology_id = submit(zk_store, worker_pool.cluster, topology, workers=1)
        topologies[version] = (topology, topology_id)
        forget("samepkg")
    worker_pool.start()
    wait_until(lambda: live_workers(zk_store), 60, "the worker to register")
    for _, topology_id in topologies.values():
        reassign(zk_store, topology_id)
    for round_ in range(2):  # the second round runs on Python workers both topologies used already
        for version, (topology, _) in topologies.items():
            produce(topology.chains[0].source.topic, [{"sentence": "hello"}])
            wait_for_counts(zk_store, topology.name, "words", {f"hello-{version}-{version}": round_ + 1}, timeout_s=90)
    for version, (topology, _) in topologies.items():
        found = query_state(zk_store, topology.name, "words", tagged_keys("hello", ["A", "B"]))
        assert found == {k[0]: (2 if k[0] == f"hello-{version}-{version}" else None) for k in tagged_keys("hello", ["A", "B"])}
