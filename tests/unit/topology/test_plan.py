"""The plan cuts stages at the shuffle and numbers tasks over the whole topology."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

from stream_ops import TransactionalMapState
from stream_ops.dsl.build_plan import build_plan
from stream_ops.examples.windows import build_windows
from stream_ops.examples.wordcount import build_wordcount
from stream_ops.hashing import partition_for, stable_hash
from stream_ops.topology import Plan


def test_wordcount_plan_has_two_stages_and_one_task_per_queue(tmp_path):
    plan = build_plan(build_wordcount(tmp_path / "in", queues=3))
    assert [(s.name, s.kind, s.queues) for s in plan.stages] == [("sentences", "source", 3), ("count", "keyed", 3)]
    assert [(t.task_id, t.stage, t.queue) for t in plan.tasks] == [
        (0, 0, 0),
        (1, 0, 1),
        (2, 0, 2),
        (3, 1, 0),
        (4, 1, 1),
        (5, 1, 2),
    ]
    source, keyed = plan.stages
    (shuffle,) = source.outputs
    assert shuffle.kind == "partials" and shuffle.to_stage == 1 and shuffle.key_fields == ("word",)
    assert keyed.state is not None and keyed.state.kind == "opaque" and keyed.from_stage == 0
    assert plan.queries["words"].stage == 1


def test_state_kind_and_group_queues_are_kept(tmp_path):
    topology = build_wordcount(tmp_path / "in", queues=2, state=TransactionalMapState)
    plan = build_plan(topology)
    assert plan.stage(1).state.kind == "transactional"


def test_plan_json_round_trip(tmp_path):
    plan = build_plan(build_wordcount(tmp_path / "in"))
    assert Plan.from_json(plan.to_json()) == plan


def test_a_stored_plan_without_the_watermark_channels_is_refused(tmp_path):
    plan = build_plan(build_windows(tmp_path / "in", queues=2))
    event_time = [s.index for s in plan.stages if s.event_time]
    assert event_time and all(plan.stage(i).progress_channels for i in event_time)
    for index in event_time:
        stored = json.loads(plan.to_json())
        del stored["stages"][index]["progress_channels"]
        with pytest.raises(ValidationError, match="lists no progress_channels for its watermark.*resubmit the topology"):
            Plan.from_json(json.dumps(stored))


def test_stable_hash_is_the_same_in_another_process():
    keys = [["how"], ["are"], ["you"], [1, "x"], ["ünïcode"]]
    here = [stable_hash(k) for k in keys]
    code = "import json,sys; from stream_ops.hashing import stable_hash; print(json.dumps([stable_hash(k) for k in json.loads(sys.argv[1])]))"
    import json

    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(keys)],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123", "PATH": ""},
    )
    assert json.loads(out.stdout) == here


def test_partition_is_within_range_and_spreads():
    queues = 4
    counts = [0] * queues
    for i in range(4000):
        q = partition_for([f"word{i}"], queues)
        assert 0 <= q < queues
        counts[q] += 1
    assert min(counts) > 800
