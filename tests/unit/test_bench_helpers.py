"""The benchmarks' own logic that decides what they report: CPU read from ``/proc`` (reaped
children included, the harness's threads left out of an in-process engine), the join
benchmark's input and ground truth, and the Kafka Streams peer's build refusing to run without
Maven (so the benchmark skips the peer with the reason)."""

from __future__ import annotations

import argparse
import importlib.util
import math
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _bench_module(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))  # the scripts import their shared rig as `harness`
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def harness(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return _bench_module("harness", monkeypatch)


@pytest.fixture
def join_kafka(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return _bench_module("join_kafka", monkeypatch)


def test_a_process_tree_counts_the_cpu_of_children_that_already_ended(harness: ModuleType) -> None:
    busy = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"
    parent = subprocess.Popen(["sh", "-c", f'{sys.executable} -c "{busy}"; exec sleep 30'])
    try:
        deadline = time.monotonic() + 20
        while len(harness.process_tree(parent.pid)) > 1 or harness.tree_cpu_s(parent.pid) < 0.25:
            assert time.monotonic() < deadline, "the busy child did not finish in 20 s"
            time.sleep(0.05)
        assert harness.process_tree(parent.pid) == [parent.pid]  # the child is gone, reaped by sh (now sleep)
        assert harness.process_cpu_s(parent.pid, reaped_children=False) < 0.2  # sh and sleep did next to nothing
        assert harness.tree_cpu_s(parent.pid) >= 0.25  # the reaped child's CPU is still counted
    finally:
        parent.kill()
        parent.wait()
    assert harness.process_cpu_s(parent.pid) == 0.0  # gone


def test_the_harness_threads_are_subtracted_from_an_in_process_engine_only(harness: ModuleType) -> None:
    before = {"bench": 10.0, "spark": 5.0, "kafka-streams": 0.0, "broker": 1.0, "zookeeper": 1.0}
    after = {"bench": 14.0, "spark": 8.0, "kafka-streams": 6.0, "broker": 2.5, "zookeeper": 1.5}
    in_process = harness.cpu_use(harness.IN_PROCESS, before, after, harness_s=1.0)
    assert (in_process.engine_s, in_process.broker_s, in_process.zookeeper_s) == (6.0, 1.5, 0.5)  # 4 + 3 - 1
    assert in_process.process_s == 3.0
    peer = harness.cpu_use(("kafka-streams",), before, after, harness_s=1.0)
    assert peer.engine_s == 6.0


def _args(**overrides: float) -> argparse.Namespace:
    values = {"seed": 3, "ads": 5, "impressions": 400, "clicks": 100, "span": 60.0, "window": 10.0, "lag": 2.0}
    values.update({"jitter": 1.0, "partitions": 2, **overrides})
    return argparse.Namespace(**values)


def test_the_join_ground_truth_pairs_a_click_with_the_impressions_of_its_ad_and_window(join_kafka: ModuleType) -> None:
    inputs = join_kafka.Inputs(
        impressions=[
            [{"imp_id": "i1", "ad": "a", "ts": 9.999}, {"imp_id": "i2", "ad": "a", "ts": 10.0}],
            [{"imp_id": "i3", "ad": "b", "ts": 12.0}, {"imp_id": "i4", "ad": "a", "ts": 19.5}],
        ],
        clicks=[[{"click_id": "c1", "ad": "a", "ts": 15.0}], [{"click_id": "c2", "ad": "a", "ts": 20.0}]],
    )
    rows = join_kafka.expected_rows(inputs, 10.0)
    assert rows == {("a", "c1", "i2"): 1, ("a", "c1", "i4"): 1}  # [10, 20): not i1 (before), i3 (ad b), c2 (next window)


def test_the_join_input_is_never_later_than_the_jitter_and_closing_records_close_every_window(join_kafka: ModuleType) -> None:
    args = _args()
    inputs = join_kafka.make_inputs(args)
    assert inputs.records == 400 + 100 + 2 * 2
    for partitions in (inputs.impressions, inputs.clicks):
        assert len(partitions) == 2
        data = [r for p in partitions for r in p[:-1]]
        last_end = max(math.floor(r["ts"] / args.window) + 1 for r in data) * args.window
        for records in partitions:
            closing = records[-1]
            assert closing["ts"] > last_end + args.lag  # the watermark passes every data window
            highest = -math.inf
            for r in records[:-1]:
                assert r["ts"] > highest - args.jitter  # out of order by less than the jitter: never late
                highest = max(highest, r["ts"])
    rows = join_kafka.expected_rows(inputs, args.window)
    assert rows and not any(ad.startswith("close") for ad, _, _ in rows)  # closing records join nothing


def test_the_kafka_streams_peer_without_maven_is_refused_with_the_reason(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    peer = _bench_module("kafka_streams_peer", monkeypatch)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("MAVEN_HOME", raising=False)
    monkeypatch.delenv("M2_HOME", raising=False)
    with pytest.raises(peer.PeerBuildError, match="Maven"):
        peer.build(cache_dir=tmp_path / "cache")


def test_the_kafka_streams_peer_is_built_again_only_when_its_project_changes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    peer = _bench_module("kafka_streams_peer", monkeypatch)
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "pom.xml").write_text("<project/>")
    (project / "src" / "A.java").write_text("class A {}")
    first = peer.project_digest(project)
    (project / "target").mkdir()
    (project / "target" / "A.class").write_bytes(b"built")
    assert peer.project_digest(project) == first  # build output is not the project
    (project / "src" / "A.java").write_text("class A { int x; }")
    assert peer.project_digest(project) != first


def test_the_join_input_dealt_round_robin_puts_each_partitions_records_in_it_in_order(join_kafka: ModuleType) -> None:
    for partitions in (1, 2, 3):
        inputs = join_kafka.make_inputs(_args(partitions=partitions, impressions=401, clicks=103))
        for topic in (inputs.impressions, inputs.clicks):
            dealt: list[list[dict[str, object]]] = [[] for _ in range(partitions)]
            for i, record in enumerate(join_kafka.dealt_round_robin(topic)):
                dealt[i % partitions].append(record)  # produce_json(partitions=n): record i to partition i % n
            assert dealt == topic
    with pytest.raises(ValueError, match="round-robin"):
        join_kafka.dealt_round_robin([[{"a": 1}], [{"a": 2}, {"a": 3}]])
