"""Compaction while running, then a move: the new owner rebuilds from snapshot + tail."""

from __future__ import annotations

import json

from click.testing import CliRunner

from stream_ops.cli import main
from stream_ops.examples.wordcount import SAMPLE_SENTENCES, build_wordcount
from stream_ops.local_stack import expected_word_counts, wait_for_counts
from stream_ops.nimbus import describe_topology, live_workers, submit
from stream_ops.nimbus.assignment import reassign
from stream_ops.state.snapshot import latest_snapshot
from stream_ops.topics.producer import produce
from stream_ops.topology.layout import TopologyLayout


def test_compact_then_move_rebuilds_exact_state(worker_pool, zk_store, zk_config, tmp_path, wait_until):
    first = worker_pool.start()
    wait_until(lambda: live_workers(zk_store), 30, "worker registered")
    topology = build_wordcount(tmp_path / "in")
    topology_id = submit(zk_store, worker_pool.cluster, topology, workers=1)
    topic = topology.chains[0].source.topic
    sent = list(SAMPLE_SENTENCES) * 2
    produce(topic, ({"sentence": s} for s in sent))
    wait_for_counts(zk_store, topology.name, "words", expected_word_counts(sent), timeout_s=60)

    out = CliRunner().invoke(
        main,
        [
            "--zookeeper",
            zk_config.hosts,
            "--chroot",
            zk_config.chroot,
            "--home",
            str(worker_pool.cluster.root),
            "compact",
            topology.name,
        ],
    )
    assert out.exit_code == 0, out.output
    compacted = json.loads(out.output.strip().splitlines()[-1])
    assert [c["stage"] for c in compacted] == ["count", "count"] and all(c["keys"] for c in compacted)
    layout = TopologyLayout(worker_pool.cluster, topology_id)
    stage = next(s for s in first._plans[topology_id].stages if s.kind == "keyed")
    assert all(latest_snapshot(layout.snapshot_dir(stage, q)) is not None for q in range(2))

    more = ["how are you"] * 3  # the tail after the snapshot
    produce(topic, ({"sentence": s} for s in more))
    sent += more
    wait_for_counts(zk_store, topology.name, "words", expected_word_counts(sent), timeout_s=60)

    second = worker_pool.start()
    wait_until(lambda: second.worker_id in live_workers(zk_store), 30, "second worker")
    worker_pool.stop(first)
    reassign(zk_store, topology_id)
    wait_until(
        lambda: all(t.owner == second.worker_id for t in describe_topology(zk_store, topology_id).tasks), 60, "tasks moved"
    )
    keyed = [r for r in second._runners.values() if r.stage.kind == "keyed"]
    assert keyed and all(r.state.rebuilt for r in keyed)
    wait_for_counts(zk_store, topology.name, "words", expected_word_counts(sent), timeout_s=60)
