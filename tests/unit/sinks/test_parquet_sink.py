"""Parquet sink files: staged invisibly, published once committed, never a zombie's or a double."""

from __future__ import annotations

import duckdb
import pytest

from stream_ops.errors import CommittedBatchLostError
from stream_ops.sinks import ParquetSink, committed_files, read_table
from stream_ops.sinks.parquet_sink import DEFAULT_PARTITION, escape_partition_value

FIELDS = {"word": "string", "n": "long", "day": "string"}


def _duckdb_rows(root) -> list[tuple]:
    query = f"select word, n, day from read_parquet('{root}/**/*.parquet', hive_partitioning=true) order by word, n"
    return duckdb.sql(query).fetchall()


def test_staged_files_are_invisible_until_published_and_a_replay_overwrites(tmp_path):
    sink = ParquetSink(tmp_path, FIELDS, partition_by=("day",))
    sink.stage_batch(3, 7, 1, [{"word": "a", "n": 1, "day": "mon"}, {"word": "b", "n": 2, "day": "tue"}])
    sink.stage_batch(3, 7, 1, [{"word": "a", "n": 1, "day": "mon"}, {"word": "b", "n": 2, "day": "tue"}])  # replayed
    assert list(tmp_path.rglob("*.parquet")) == []  # no glob reader sees a staged file
    sizes = sink.staged_sizes(3, 7, 1)
    assert sorted(sizes) == ["day=mon/t00003-x000000000007-e000001.parquet", "day=tue/t00003-x000000000007-e000001.parquet"]
    assert sink.publish_batch(3, 7, 1, sizes) == 2
    assert sink.publish_batch(3, 7, 1, sizes) == 0  # idempotent (a second owner finishing the publish)
    assert _duckdb_rows(tmp_path) == [("a", 1, "mon"), ("b", 2, "tue")]
    assert [p.relative_to(tmp_path).as_posix() for p in committed_files(tmp_path)] == sorted(sizes)
    assert sorted(read_table(tmp_path).to_pylist(), key=lambda r: r["word"]) == [
        {"word": "a", "n": 1, "day": "mon"},
        {"word": "b", "n": 2, "day": "tue"},
    ]


def test_a_zombies_staged_files_are_discarded_and_the_committed_one_kept(tmp_path):
    sink = ParquetSink(tmp_path, FIELDS)
    sink.stage_batch(0, 4, 1, [{"word": "zombie", "n": 1, "day": "x"}])  # epoch 1 never commits txid 4
    sink.stage_batch(0, 3, 1, [{"word": "committed", "n": 1, "day": "x"}])
    sink.stage_batch(0, 4, 2, [{"word": "new owner", "n": 1, "day": "x"}])
    assert sink.discard_staged(0, below_epoch=2, keep=(3, 1)) == 1
    assert sink.publish_batch(0, 3, 1, sink.staged_sizes(0, 3, 1)) == 1
    assert sink.staged_sizes(0, 4, 1) == {} and sink.staged_sizes(0, 4, 2) != {}
    assert _duckdb_rows(tmp_path) == [("committed", 1, "x")]


def test_a_lost_or_cut_file_stops_the_publish(tmp_path):
    sink = ParquetSink(tmp_path, FIELDS)
    sink.stage_batch(1, 0, 1, [{"word": "a", "n": 1, "day": "x"}])
    sizes = sink.staged_sizes(1, 0, 1)
    (staged,) = (tmp_path / "_staging").rglob("*.staged")
    staged.unlink()
    with pytest.raises(CommittedBatchLostError, match="neither staged nor published"):
        sink.publish_batch(1, 0, 1, sizes)
    with pytest.raises(CommittedBatchLostError, match="has .* bytes, the commit recorded"):
        sink.stage_batch(1, 1, 1, [{"word": "b", "n": 1, "day": "x"}])
        sink.publish_batch(1, 1, 1, {name: 1 for name in sink.staged_sizes(1, 1, 1)})


def test_partition_values_are_escaped_and_nulls_get_the_default_partition(tmp_path):
    assert escape_partition_value("a/b=c") == "a%2Fb%3Dc"
    assert escape_partition_value(None) == escape_partition_value("") == DEFAULT_PARTITION
    assert escape_partition_value(True) == "true"
    sink = ParquetSink(tmp_path, {"user": "struct<city:string>", "n": "long"}, partition_by=("user.city",))
    sink.stage_batch(0, 0, 1, [{"user": {"city": "a/b"}, "n": 1}, {"user": None, "n": 2}, {"n": 3}])
    assert sorted(sink.staged_sizes(0, 0, 1)) == [
        f"user_city={DEFAULT_PARTITION}/t00000-x000000000000-e000001.parquet",
        "user_city=a%2Fb/t00000-x000000000000-e000001.parquet",
    ]
    assert sink.stage_batch(0, 1, 1, []) == []
