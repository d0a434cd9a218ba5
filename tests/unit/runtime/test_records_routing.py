"""Where a stage's whole records go: by key, broadcast to every queue when key-less (S4), and
the progress rows an event-time window stage's watermark is built from."""

from __future__ import annotations

import json
from collections import defaultdict

from stream_ops import Count, FileTopic, Records, Session, Sliding, Topology, Tumbling
from stream_ops.config import ClusterConfig
from stream_ops.dsl import build_plan
from stream_ops.examples.s4_parity import build_s4_parity
from stream_ops.examples.windows import build_windows
from stream_ops.hashing import encode_key, partition_for, partition_of_encoded
from stream_ops.operators.window_partials import WindowPartials
from stream_ops.runtime.stage_outputs import StageOutputs
from stream_ops.runtime.stage_processors import PROGRESS_STREAM, data_rows, progress_reports, window_partials
from stream_ops.topology.layout import TopologyLayout


def _route(plan, stage_index, queue, records, tmp_path):
    stage = plan.stage(stage_index)
    outputs = StageOutputs(
        plan=plan,
        stage=stage,
        task=plan.task_for(stage_index, queue),
        layout=TopologyLayout(ClusterConfig(root=tmp_path), "t-1-1"),
    )
    by_queue: dict[int, list[dict]] = defaultdict(list)
    outputs._shuffle_records(stage.outputs[0], records, by_queue)
    return {q: [(line["stream"], json.loads(line["record"])) for line in lines] for q, lines in by_queue.items()}


def test_keyed_records_go_to_their_queue_and_key_less_ones_to_every_queue(tmp_path):
    plan = build_plan(build_s4_parity(tmp_path / "in", queues=2))
    payments = [{"card": f"c{i}", "amount": i} for i in range(6)]
    routed = _route(plan, 0, 1, payments, tmp_path)
    for queue, lines in routed.items():
        assert all(partition_for([r["card"]], 2) == queue for _, r in lines)
    assert sum(len(lines) for lines in routed.values()) == 6
    assert _route(plan, 1, 0, [{"limit": 5}], tmp_path) == {0: [("limits", {"limit": 5})], 1: [("limits", {"limit": 5})]}


def test_a_null_key_is_broadcast_to_every_instance_task(tmp_path):
    plan = build_plan(build_s4_parity(tmp_path / "in", queues=3))
    routed = _route(plan, 0, 0, [{"card": None, "amount": 1}], tmp_path)
    assert sorted(routed) == [0, 1, 2]


def test_an_event_time_window_stage_gets_the_largest_event_time_on_every_queue(tmp_path):
    plan = build_plan(build_windows(tmp_path / "in", queues=2))
    clicks = [
        {"user": "u1", "page": "p", "ts": 12.5},
        {"user": "u2", "page": "p", "ts": 30.0},
        {"user": "u3", "page": "p", "ts": None},
    ]
    stage = plan.stage(0)
    window_stage = plan.stage(stage.outputs[0].to_stage)
    assert window_stage.progress_channels == ("0/0", "0/1")
    routed = _route(plan, 0, 1, clicks, tmp_path)
    for queue in (0, 1):
        reports = [r for s, r in routed[queue] if s == PROGRESS_STREAM]
        assert reports == [{"channel": "0/1", "max_event": 30.0}]
        rows = [(s, None, r) for s, r in routed[queue]]
        assert progress_reports(rows) == [("0/1", 30.0)]


def test_window_partials_go_to_the_queue_of_their_key_and_count_in_the_progress_row(tmp_path):
    plan = build_plan(build_windows(tmp_path / "in", queues=2))
    stage = plan.stage(0)
    output = stage.outputs[0]
    assert output.window_partials is not None and output.window_partials["aggregator"] == {"kind": "Count"}
    outputs = StageOutputs(
        plan=plan, stage=stage, task=plan.task_for(0, 1), layout=TopologyLayout(ClusterConfig(root=tmp_path), "t-1-1")
    )
    users = [f"u{i}" for i in range(8)]
    rows = [(10.0, 20.0, encode_key([u]), 2) for u in users]
    outputs.event_times_sent = {}
    by_queue: dict[int, list[dict]] = defaultdict(list)
    outputs._shuffle_records(output, [{"user": "u0", "page": "p", "ts": 12.5}], by_queue, WindowPartials(rows, 16, 19.5))
    for queue, lines in by_queue.items():
        partials = window_partials([(line["stream"], line["key"], json.loads(line["record"])) for line in lines])
        assert partials and all(partition_for(json.loads(key), 2) == queue for _, _, key, _ in partials)
        assert [json.loads(line["record"]) for line in lines if line["stream"] == PROGRESS_STREAM] == [
            {"channel": "0/1", "max_event": 19.5}
        ]
    found = [
        p
        for lines in by_queue.values()
        for p in window_partials([(x["stream"], x["key"], json.loads(x["record"])) for x in lines])
    ]
    assert sorted(found) == sorted(rows)
    assert outputs.event_times_sent == {output.to_stage: 19.5}
    home = by_queue[partition_for(["u0"], 2)]
    assert [r for _, r in data_rows([(x["stream"], x["key"], json.loads(x["record"])) for x in home])] == [
        {"user": "u0", "page": "p", "ts": 12.5}
    ]


def test_only_windows_whose_lateness_a_source_can_bound_take_partials(tmp_path):
    def records_output(shape, **kwargs):
        t = Topology("w")
        clicks = t.source("clicks", FileTopic(tmp_path / "in", 1), schema={"user": "string", "ts": "double"})
        clicks.window(shape, **kwargs).group_by("user").aggregate(Count(), out="n").to_parquet(tmp_path / "out", name="out")
        return build_plan(t).stage(0).outputs[0]

    event = {"time": "event", "timestamp_field": "ts", "lag": 2}
    assert records_output(Tumbling(10), **event).window_partials is not None
    assert records_output(Sliding(10, 5), **event).window_partials is not None
    assert records_output(Session(10), **event).window_partials is None
    assert records_output(Tumbling(10), **event, idle_timeout=30).window_partials is None
    assert records_output(Tumbling(10)).window_partials is None
    assert records_output(Tumbling(Records(3))).window_partials is None


def test_an_encoded_key_goes_to_the_queue_of_the_key_it_encodes():
    keys = [["ann"], ["dé"], [1], [1.0], [True], [None], [2.5], ["a", 3], [], ['q"uote\\'], [2**60]]
    for key in keys:
        for queues in (1, 2, 7):
            assert partition_of_encoded(encode_key(key), queues) == partition_for(key, queues)
