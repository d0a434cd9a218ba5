"""Submitting a topology whose Kafka topic gives no ``partitions=``: importing its module needs no
broker, and a broker that cannot be reached at submit is one clear error, with nothing written
(issue 31, item 6)."""

from __future__ import annotations

import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from stream_ops.cli import main
from stream_ops.config import ClusterConfig, ZooKeeperConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.dsl.loading import load_topology
from stream_ops.errors import SourceError
from stream_ops.nimbus.submission import submit
from stream_ops.sources import kafka_source

MODULE = """
from stream_ops import Count, OpaqueMapState, Topology
from stream_ops.sources import KafkaTopic

topology = Topology("kafka-unreachable")
words = topology.source("words", KafkaTopic("{bootstrap}", "words"), schema={{"word": "string"}})
words.group_by("word").persistent_aggregate(Count(), out="count", state=OpaqueMapState)
"""


@pytest.fixture
def topology_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """``(module:attribute, bootstrap)`` of a word count on a Kafka address nobody listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        bootstrap = f"127.0.0.1:{sock.getsockname()[1]}"
    name = f"kafka_unreachable_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(MODULE.format(bootstrap=bootstrap), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(kafka_source, "PARTITIONS_TIMEOUT_S", 1.0)
    yield f"{name}:topology", bootstrap
    sys.modules.pop(name, None)


def test_the_module_imports_without_a_broker_and_submit_says_it_is_unreachable(
    zk_store: ZkStore, zk_config: ZooKeeperConfig, tmp_path: Path, topology_module: tuple[str, str]
) -> None:
    ref, bootstrap = topology_module
    topology = load_topology(ref)  # imported: the topology is defined, no broker asked
    with pytest.raises(SourceError, match=f"cannot read the partition count of Kafka topic 'words' at {bootstrap}"):
        submit(zk_store, ClusterConfig(root=tmp_path / "cluster"), topology)
    assert not zk_store.exists(ZkPaths.STORMS) or zk_store.children(ZkPaths.STORMS) == []
    assert not (tmp_path / "cluster" / "dist").exists() or not any((tmp_path / "cluster" / "dist").iterdir())

    base = ["--zookeeper", zk_config.hosts, "--chroot", zk_config.chroot, "--home", str(tmp_path / "home")]
    result = CliRunner().invoke(main, [*base, "submit", ref])
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: topology 'kafka-unreachable': source 'words': cannot read the partition count")
    assert "did not answer" in result.stderr and "start the brokers or create the topic" in result.stderr
    assert "Traceback" not in result.output
