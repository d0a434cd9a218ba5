"""Stages that read a shuffle trigger more often than the sources: a batch their upstream
committed waits at most their own trigger interval."""

from __future__ import annotations

from runners import make_runner

from stream_ops.config import ClusterConfig
from stream_ops.coordination.store import ZkStore
from stream_ops.examples.wordcount import build_wordcount
from stream_ops.nimbus.submission import submit


def _trigger_ms(runner) -> int:
    assert runner.query is not None
    return int(runner.query._jsq.streamingQuery().trigger().intervalMs())


def test_a_stage_reading_a_shuffle_runs_on_the_shuffle_trigger(spark, zk_config, tmp_path):
    cluster = ClusterConfig(root=tmp_path / "cluster")
    with ZkStore.connect(zk_config) as store:
        topology_id = submit(store, cluster, build_wordcount(tmp_path / "in", queues=1), workers=1)
        runners = [
            make_runner(
                store, spark, cluster, topology_id, "host:1", stage=stage, trigger_seconds=0.4, shuffle_trigger_seconds=0.1
            )
            for stage in (0, 1)
        ]
        try:
            for runner in runners:
                runner.start()
            assert [runner.stage.reads_source for runner in runners] == [True, False]
            assert [_trigger_ms(runner) for runner in runners] == [400, 100]
        finally:
            for runner in runners:
                runner.stop()
