"""The keyed stage reading its shuffle queue with the queue source, on real streaming queries.

Its offsets are per upstream task the highest txid read, and the files its committed batches
read are deleted; an upstream task that publishes a consumed batch again finds it consumed, not
lost. A file limit per trigger splits a backlog without losing or doubling a file. A
checkpoint started with Spark's file source keeps it, and one written by the queue source does
not start where the source cannot be loaded.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from runners import make_runner

from stream_ops import TransactionalMapState
from stream_ops.config import ClusterConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import ConfigError
from stream_ops.examples.wordcount import build_wordcount
from stream_ops.hashing import encode_key
from stream_ops.nimbus.submission import submit
from stream_ops.spark import shuffle_queue
from stream_ops.spark.checkpoint import batch_offsets
from stream_ops.topics.shuffle_files import PartialsShuffle

BATCHES = [["how", "are", "you", "how"], ["you", "you", "nice"], ["how", "day"], ["day", "nice"]]


def _publish(shuffle: PartialsShuffle, task: int, txid: int, words: list[str]) -> None:
    """What upstream task ``task`` publishes for ``txid`` after its commit."""
    counts = Counter(words)
    shuffle.stage_batch(0, task, txid, 1, [encode_key([w]) for w in counts], list(counts.values()))
    shuffle.publish_batch(task, txid, 1, shuffle.staged_sizes(task, txid, 1))


def _wait(condition, what) -> None:
    deadline = time.monotonic() + 90
    while not condition():
        assert time.monotonic() < deadline, what() if callable(what) else what
        time.sleep(0.05)


def _committed(store: ZkStore, topology_id: str, task_id: int) -> int:
    return store.get_json(ZkPaths.transactional_task(topology_id, task_id))[0]["committed_txid"]


def _keyed_runner(admin: ZkStore, spark, cluster: ClusterConfig, topology_id: str, **settings):
    """The runner of the word count's keyed task (queue 0), and the shuffle feeding it."""
    runner = make_runner(admin, spark, cluster, topology_id, "host-a:1", stage=1, trigger_seconds=0.1, **settings)
    return runner, PartialsShuffle(runner.layout.shuffle_topic(runner.stage), "long")


def _run_first_batch(admin: ZkStore, topology_id: str, runner, shuffle: PartialsShuffle) -> None:
    """Start ``runner``, publish txid 0 upstream, wait for its commit, stop."""
    runner.start()
    try:
        _publish(shuffle, 0, 0, BATCHES[0])
        _wait(lambda: _committed(admin, topology_id, runner.task.task_id) == 0, "txid 0 committed")
    finally:
        runner.stop()


def _exact(runner, batches: list[list[str]]) -> bool:
    truth = Counter(w for batch in batches for w in batch)
    return runner.lookup([(w,) for w in sorted(truth)]) == [truth[w] for w in sorted(truth)]


def test_offsets_stay_per_task_and_consumed_files_are_deleted(spark, zk_config, tmp_path):
    cluster = ClusterConfig(root=tmp_path / "cluster")
    topology = build_wordcount(tmp_path / "in", queues=1, state=TransactionalMapState)
    with ZkStore.connect(zk_config) as admin:
        topology_id = submit(admin, cluster, topology, workers=1)
        runner, shuffle = _keyed_runner(admin, spark, cluster, topology_id)
        task, topic = runner.task.task_id, shuffle.topic
        checkpoint = runner.layout.checkpoint_dir(task)
        runner.start()
        try:
            time.sleep(0.5)  # five triggers over an empty queue: no batch (an empty batch 0 would shift every txid)
            assert not list((checkpoint / "offsets").glob("[0-9]*"))
            for txid in range(3):
                _publish(shuffle, 0, txid, BATCHES[txid])
                _wait(lambda txid=txid: _committed(admin, topology_id, task) == txid, f"txid {txid} committed")
            assert batch_offsets(checkpoint, 2) == [{"queueTxids": {"0": 2}}]
            # Batch 2 deletes what batches 0 and 1 read, after recording it as consumed.
            _wait(
                lambda: [p.name for p in topic.files(0)] == ["t00000-x000000000002-e000001.parquet"],
                lambda: f"consumed files deleted; the queue holds {sorted(p.name for p in topic.queue_path(0).iterdir())}",
            )
            assert topic.consumed_txids(0) == {0: 1}
            assert not (checkpoint / "sources").exists()  # no file-source log
            # The upstream task starts again and publishes its committed txid 1 once more: its
            # file is gone because it was read, which is not a loss.
            assert shuffle.publish_batch(0, 1, 1, {"0": 123}) == 0
            assert _exact(runner, BATCHES[:3])
            assert runner.lag().files == 0
        finally:
            runner.stop()

        _publish(shuffle, 0, 3, BATCHES[3])
        restarted = make_runner(admin, spark, cluster, topology_id, "host-a:1", stage=1, trigger_seconds=0.1)
        assert restarted.lag().files == 1
        restarted.start()
        try:
            _wait(lambda: _committed(admin, topology_id, task) == 3, "txid 3 committed after the restart")
            _wait(lambda: _exact(restarted, BATCHES), "exact counts")
        finally:
            restarted.stop()


def test_a_file_limit_splits_a_backlog_of_two_upstream_tasks(spark, zk_config, tmp_path):
    cluster = ClusterConfig(root=tmp_path / "cluster")
    topology = build_wordcount(tmp_path / "in", queues=1, state=TransactionalMapState)
    with ZkStore.connect(zk_config) as admin:
        topology_id = submit(admin, cluster, topology, workers=1)
        runner, shuffle = _keyed_runner(admin, spark, cluster, topology_id, max_files_per_trigger=3)
        published = []
        for txid in range(4):
            for upstream in (5, 6):
                words = BATCHES[(txid + upstream) % len(BATCHES)]
                _publish(shuffle, upstream, txid, words)
                published.append(words)
        runner.start()
        try:
            _wait(lambda: _exact(runner, published), "exact counts over the backlog")
            checkpoint = runner.layout.checkpoint_dir(runner.task.task_id)
            last = _committed(admin, topology_id, runner.task.task_id)
            planned = [shuffle_queue.offset_txids(checkpoint, b) for b in range(last + 1)]
        finally:
            runner.stop()
    assert planned[-1] == {5: 3, 6: 3}
    sizes = [sum(end[t] - before.get(t, -1) for t in end) for before, end in zip([{}, *planned], planned)]
    assert all(0 < size <= 3 for size in sizes), sizes
    assert sum(sizes) == 8


def test_a_checkpoint_keeps_the_source_that_started_it(spark, zk_config, tmp_path, monkeypatch):
    cluster = ClusterConfig(root=tmp_path / "cluster")
    topology = build_wordcount(tmp_path / "in", queues=1, state=TransactionalMapState)
    with ZkStore.connect(zk_config) as admin:
        topology_id = submit(admin, cluster, topology, workers=1)

        # Started where the queue source cannot be loaded: Spark's file source from the start.
        monkeypatch.setattr(shuffle_queue, "loadable", lambda spark, name: False)
        first, shuffle = _keyed_runner(admin, spark, cluster, topology_id)
        task, topic = first.task.task_id, shuffle.topic
        checkpoint = first.layout.checkpoint_dir(task)
        _run_first_batch(admin, topology_id, first, shuffle)
        assert shuffle_queue.checkpoint_reader(checkpoint) == "files"

        # The source is loadable again: the task goes on with the file source, which keeps its files.
        monkeypatch.undo()
        second = make_runner(admin, spark, cluster, topology_id, "host-a:1", stage=1, trigger_seconds=0.1)
        second.start()
        try:
            for txid in (1, 2):
                _publish(shuffle, 0, txid, BATCHES[txid])
                _wait(lambda txid=txid: _committed(admin, topology_id, task) == txid, f"txid {txid} committed")
            _wait(lambda: _exact(second, BATCHES[:3]), "exact counts")
        finally:
            second.stop()
        assert shuffle_queue.checkpoint_reader(checkpoint) == "files"
        assert len(topic.files(0)) == 3
        assert topic.consumed_txids(0) == {}


def test_a_queue_checkpoint_does_not_start_without_the_source(spark, zk_config, tmp_path, monkeypatch):
    cluster = ClusterConfig(root=tmp_path / "cluster")
    topology = build_wordcount(tmp_path / "in", queues=1, state=TransactionalMapState)
    with ZkStore.connect(zk_config) as admin:
        topology_id = submit(admin, cluster, topology, workers=1)
        _run_first_batch(admin, topology_id, *_keyed_runner(admin, spark, cluster, topology_id))
        monkeypatch.setattr(shuffle_queue, "loadable", lambda spark, name: False)
        again = make_runner(admin, spark, cluster, topology_id, "host-a:1", stage=1, trigger_seconds=0.1)
        with pytest.raises(shuffle_queue.ShuffleSourceUnavailableError, match="install a JDK"):
            again.start()
        again.stop()


def _two_source_keyed_runner(admin: ZkStore, spark, cluster: ClusterConfig, tmp_path):
    """The keyed task of queue 0 of a word count whose source stage has two tasks (0 and 1)."""
    topology = build_wordcount(tmp_path / "in", queues=2, state=TransactionalMapState)
    topology_id = submit(admin, cluster, topology, workers=1)
    runner, shuffle = _keyed_runner(admin, spark, cluster, topology_id)
    return topology_id, runner, shuffle


def test_half_a_round_waits_for_the_other_upstream_task_and_one_batch_reads_both(spark, zk_config, tmp_path):
    cluster = ClusterConfig(root=tmp_path / "cluster")
    spark.conf.set(shuffle_queue.ROUND_WAIT_CONF, "60000")  # far longer than the test
    try:
        with ZkStore.connect(zk_config) as admin:
            topology_id, runner, shuffle = _two_source_keyed_runner(admin, spark, cluster, tmp_path)
            checkpoint = runner.layout.checkpoint_dir(runner.task.task_id)
            _publish(shuffle, 0, 0, BATCHES[0])  # before the start: its first trigger sees half a round
            runner.start()
            try:
                time.sleep(0.6)  # six triggers
                assert not list((checkpoint / "offsets").glob("[0-9]*")), "half a round ran a batch"
                _publish(shuffle, 1, 0, BATCHES[1])
                _wait(lambda: _committed(admin, topology_id, runner.task.task_id) == 0, "txid 0 committed")
                assert shuffle_queue.offset_txids(checkpoint, 0) == {0: 0, 1: 0}, "one batch reads the round"
                _wait(lambda: _exact(runner, BATCHES[:2]), "exact counts")
            finally:
                runner.stop()
    finally:
        spark.conf.unset(shuffle_queue.ROUND_WAIT_CONF)


def test_the_round_wait_ends_and_a_lone_upstream_task_is_read(spark, zk_config, tmp_path):
    cluster = ClusterConfig(root=tmp_path / "cluster")
    spark.conf.set(shuffle_queue.ROUND_WAIT_CONF, "400")
    try:
        with ZkStore.connect(zk_config) as admin:
            topology_id, runner, shuffle = _two_source_keyed_runner(admin, spark, cluster, tmp_path)
            checkpoint = runner.layout.checkpoint_dir(runner.task.task_id)
            runner.start()
            try:
                time.sleep(0.3)  # the query runs and finds nothing
                published = time.monotonic()
                _publish(shuffle, 1, 0, BATCHES[2])
                _wait(lambda: _committed(admin, topology_id, runner.task.task_id) == 0, "txid 0 committed")
                assert time.monotonic() - published >= 0.4, "read before the round wait ended"
                assert shuffle_queue.offset_txids(checkpoint, 0) == {1: 0}
                assert _exact(runner, BATCHES[2:3])
            finally:
                runner.stop()
    finally:
        spark.conf.unset(shuffle_queue.ROUND_WAIT_CONF)


def test_the_round_wait_is_a_number_of_milliseconds(spark):
    assert shuffle_queue.round_wait_ms(spark, 0.25) == 250
    spark.conf.set(shuffle_queue.ROUND_WAIT_CONF, "0")
    try:
        assert shuffle_queue.round_wait_ms(spark, 0.25) == 0
        spark.conf.set(shuffle_queue.ROUND_WAIT_CONF, "soon")
        with pytest.raises(ConfigError, match="shuffleRoundWaitMs is 'soon'"):
            shuffle_queue.round_wait_ms(spark, 0.25)
    finally:
        spark.conf.unset(shuffle_queue.ROUND_WAIT_CONF)
