"""Parquet partials shuffle files: staged and published like every batch file, fixed per plan."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from stream_ops.dsl.build_plan import build_plan
from stream_ops.errors import CommittedBatchLostError
from stream_ops.examples.wordcount import build_wordcount
from stream_ops.topics.file_topic import FileTopic
from stream_ops.topics.shuffle_files import PartialsShuffle
from stream_ops.topology.plan import Plan


@pytest.fixture
def shuffle(tmp_path: Path) -> PartialsShuffle:
    return PartialsShuffle(FileTopic(tmp_path / "shuffle", queues=2), "long")


def test_a_batch_is_staged_published_at_its_recorded_size_and_replayed_under_the_same_name(shuffle: PartialsShuffle) -> None:
    staged = shuffle.stage_batch(1, 3, 7, 2, ['["a"]', '["b"]'], [4, 5])
    assert staged.name == "t00003-x000000000007-e000002.parquet" and staged.parent == shuffle.topic.pending_path(1)
    sizes = shuffle.staged_sizes(3, 7, 2)
    assert sizes == {"1": staged.stat().st_size}
    assert shuffle.publish_batch(3, 7, 2, sizes) == 1
    assert shuffle.publish_batch(3, 7, 2, sizes) == 0  # idempotent
    assert shuffle.read_queue(1).to_pylist() == [{"key": '["a"]', "value": 4}, {"key": '["b"]', "value": 5}]
    assert str(pq.read_schema(shuffle.topic.queue_path(1) / staged.name)) == "key: string\nvalue: int64"

    again = shuffle.stage_batch(1, 3, 7, 2, ['["a"]', '["b"]'], [4, 5])  # a replay: same name, same bytes
    assert again == staged and shuffle.staged_sizes(3, 7, 2) == sizes


def test_a_committed_file_lost_before_its_publish_stops_the_task(shuffle: PartialsShuffle) -> None:
    staged = shuffle.stage_batch(0, 3, 7, 2, ['["a"]'], [1])
    sizes = shuffle.staged_sizes(3, 7, 2)
    staged.unlink()
    with pytest.raises(CommittedBatchLostError, match="txid 7"):
        shuffle.publish_batch(3, 7, 2, sizes)


def test_older_epochs_staged_files_are_discarded_but_the_committed_one_is_kept(shuffle: PartialsShuffle) -> None:
    old = shuffle.stage_batch(0, 3, 8, 1, ['["a"]'], [1])
    committed = shuffle.stage_batch(0, 3, 7, 1, ['["a"]'], [1])
    crashed = shuffle.topic.pending_path(0) / f".{old.name}.{'0' * 32}.tmp"
    crashed.write_bytes(b"PAR1")
    mine = shuffle.stage_batch(0, 3, 8, 2, ['["a"]'], [1])
    assert shuffle.discard_staged(3, below_epoch=2, keep=(7, 1)) == 2
    assert not old.exists() and not crashed.exists() and committed.exists() and mine.exists()


def test_a_value_the_type_cannot_hold_is_stored_null(shuffle: PartialsShuffle) -> None:
    staged = shuffle.stage_batch(0, 3, 7, 2, ['["a"]', '["b"]', '["c"]'], [1.5, 2**70, 3])
    assert pq.read_table(staged).column("value").to_pylist() == [None, None, 3]
    flags = PartialsShuffle(shuffle.topic, "boolean").stage_batch(1, 3, 7, 2, ['["a"]', '["b"]'], [1, True])
    assert pq.read_table(flags).column("value").to_pylist() == [None, True]


def test_plans_shuffle_partials_in_parquet_and_refuse_another_format(tmp_path: Path) -> None:
    plan = build_plan(build_wordcount(tmp_path / "in", queues=1))
    assert [s.shuffle_format for s in plan.stages] == ["json", "parquet"]
    stored = json.loads(plan.to_json())
    stored["stages"][1]["shuffle_format"] = "json"  # partials in JSON lines: no plan built here says so
    with pytest.raises(ValidationError, match="reads parquet shuffle files, but the plan says 'json'"):
        Plan.model_validate(stored)
    del stored["stages"][1]["shuffle_format"]
    with pytest.raises(ValidationError, match="shuffle_format"):
        Plan.model_validate(stored)
