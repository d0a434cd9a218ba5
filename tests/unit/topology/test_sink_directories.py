"""Two sinks never write one directory (issue 31, item 5): refused when the second is defined."""

from __future__ import annotations

from pathlib import Path

import pytest

from stream_ops import FileTopic, Topology
from stream_ops.dsl.build_plan import build_plan
from stream_ops.errors import TopologyDefinitionError
from stream_ops.topology.sink_paths import clashes, sink_directories


def _stream(tmp_path: Path, name: str = "t"):
    topology = Topology(name)
    return topology, topology.source("words", FileTopic(tmp_path / "in", 1), schema={"word": "string"})


@pytest.mark.parametrize("second", ["out", "out/inner", "."])
def test_a_second_parquet_sink_on_the_same_or_a_nested_directory_is_refused_naming_both(tmp_path: Path, second: str) -> None:
    _, stream = _stream(tmp_path)
    stream.to_parquet(tmp_path / "out", name="first")
    with pytest.raises(TopologyDefinitionError, match=r"sink 'second' would write .* sink 'first' of topology 't' writes"):
        stream.to_parquet(tmp_path / second, name="second")


def test_a_topic_sink_and_a_parquet_sink_on_one_directory_are_refused(tmp_path: Path) -> None:
    _, stream = _stream(tmp_path)
    stream.to_topic(FileTopic(tmp_path / "shared", 2), name="topic")
    with pytest.raises(TopologyDefinitionError, match="'topic'"):
        stream.to_parquet(tmp_path / "shared", name="files")


def test_one_sink_tapped_by_merged_streams_and_sinks_in_sibling_directories_are_fine(tmp_path: Path) -> None:
    topology, a = _stream(tmp_path)
    b = topology.source("more", FileTopic(tmp_path / "in2", 1), schema={"word": "string"})
    topology.merge(a, b).to_parquet(tmp_path / "all", name="all")
    a.to_parquet(tmp_path / "all-a", name="only-a")
    found = dict(sink_directories(build_plan(topology)))
    assert found == {"all": (tmp_path / "all").resolve(), "only-a": (tmp_path / "all-a").resolve()}


def test_a_symlink_to_another_sinks_directory_is_the_same_directory(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "out")
    _, stream = _stream(tmp_path)
    stream.to_parquet(tmp_path / "out", name="first")
    with pytest.raises(TopologyDefinitionError, match="'first'"):
        stream.to_parquet(tmp_path / "alias", name="second")


def test_clashes() -> None:
    assert clashes(Path("/a/b"), Path("/a/b")) and clashes(Path("/a"), Path("/a/b/c")) and clashes(Path("/a/b/c"), Path("/a"))
    assert not clashes(Path("/a/b"), Path("/a/bc")) and not clashes(Path("/a/b"), Path("/a/c"))
