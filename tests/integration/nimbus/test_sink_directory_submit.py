"""A submit refuses a file sink on a directory a running topology's sink writes (issue 31, item 5),
naming both; once that topology is killed the directory is free again."""

from __future__ import annotations

from pathlib import Path

import pytest

from stream_ops import FileTopic, Topology
from stream_ops.config import ClusterConfig
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import SubmissionError
from stream_ops.nimbus.submission import kill, submit


def _topology(name: str, tmp_path: Path, sink: Path) -> Topology:
    topology = Topology(name)
    topology.source("lines", FileTopic(tmp_path / f"in-{name}", 1), schema={"line": "string"}).to_parquet(sink, name="rows")
    return topology


def test_a_second_topology_on_a_running_topologys_sink_directory_is_refused(zk_store: ZkStore, tmp_path: Path) -> None:
    cluster = ClusterConfig(root=tmp_path / "home")
    first = submit(zk_store, cluster, _topology("first", tmp_path, tmp_path / "out"), workers=1)
    for directory in (tmp_path / "out", tmp_path / "out" / "part"):
        with pytest.raises(SubmissionError, match=rf"sink 'rows' would write .* sink 'rows' of the running topology {first}"):
            submit(zk_store, cluster, _topology("second", tmp_path, directory), workers=1)
    assert submit(zk_store, cluster, _topology("third", tmp_path, tmp_path / "elsewhere"), workers=1)
    kill(zk_store, first)
    assert submit(zk_store, cluster, _topology("second", tmp_path, tmp_path / "out"), workers=1)
