"""A keyed task on the queue source accounts for every upstream txid its batches read up to.

Real ZooKeeper and Spark: an upstream task whose batches had no rows for the task's queue
skipped txids there, and the keyed batch reading across them counts exactly; Spark delivers
a committed batch again after a crash and it finds its files; a committed file lost in the
middle of a batch's range stops the task with ``CommittedBatchLostError`` naming it, instead
of committing without it. A chained JSON-lines file reads in Spark as the records it was
given (the previous txid in its first line is not a column).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path

from stream_ops import TransactionalMapState
from stream_ops.compute import decision, stage_query
from stream_ops.config import ClusterConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.examples.wordcount import build_wordcount
from stream_ops.hashing import encode_key
from stream_ops.helpers.spark_ddl import schema_ddl
from stream_ops.nimbus.submission import read_storm, submit
from stream_ops.runtime.task_runner import RunnerSettings, TaskRunner
from stream_ops.runtime.user_code import load_user_code
from stream_ops.spark import shuffle_queue
from stream_ops.topics.file_topic import FileTopic, batch_file_name
from stream_ops.topics.shuffle_files import PartialsShuffle, previous_txid
from stream_ops.topology.layout import TopologyLayout

UPSTREAM = 0
"""The source task publishing by hand into the keyed stage's two queues."""


class CrashAfterPublishError(RuntimeError):
    """The keyed task "crashes" after its ZooKeeper commit, before Spark logs the batch done."""


def _runner(store: ZkStore, spark, cluster: ClusterConfig, topology_id: str) -> TaskRunner:
    """The runner of queue 0 of the word count's keyed stage, always connected."""
    plan = load_user_code(cluster, read_storm(store, topology_id), spark)
    connected = threading.Event()
    connected.set()
    return TaskRunner(
        zk=store,
        spark=spark,
        layout=TopologyLayout(cluster, topology_id),
        plan=plan,
        task=plan.task_for(1, 0),
        worker_id="host-a:1",
        settings=RunnerSettings(commit_wait_s=2, trigger_seconds=0.1, shuffle_trigger_seconds=0.1),
        connected=connected,
    )


def _publish(shuffle: PartialsShuffle, txid: int, queue: int, words: list[str]) -> None:
    """Upstream txid ``txid``, whose rows all went to ``queue``: staged, committed, published."""
    counts = Counter(words)
    shuffle.stage_batch(queue, UPSTREAM, txid, 1, [encode_key([w]) for w in counts], list(counts.values()))
    shuffle.publish_batch(UPSTREAM, txid, 1, shuffle.staged_sizes(UPSTREAM, txid, 1))


def _wait(condition, what) -> None:
    deadline = time.monotonic() + 90
    while not condition():
        assert time.monotonic() < deadline, what() if callable(what) else what
        time.sleep(0.05)


def _committed(store: ZkStore, topology_id: str, task_id: int) -> int:
    found = store.get_json(ZkPaths.transactional_task(topology_id, task_id))
    assert found is not None
    return int(found[0]["committed_txid"])


def _exact(runner: TaskRunner, words: list[str]) -> bool:
    truth = Counter(words)
    return runner.lookup([(w,) for w in sorted(truth)]) == [truth[w] for w in sorted(truth)]


def test_skipped_txids_are_read_across_and_a_lost_one_stops_the_task(spark, zk_config, tmp_path, monkeypatch):
    cluster = ClusterConfig(root=tmp_path / "cluster")
    topology = build_wordcount(tmp_path / "in", queues=2, state=TransactionalMapState)
    spark.conf.set(shuffle_queue.ROUND_WAIT_CONF, "0")  # one upstream task of two publishes
    try:
        with ZkStore.connect(zk_config) as admin:
            topology_id = submit(admin, cluster, topology, workers=1)
            first = _runner(admin, spark, cluster, topology_id)
            task = first.task.task_id
            shuffle = PartialsShuffle(first.layout.shuffle_topic(first.stage), "long")
            queue = shuffle.topic.queue_path(0)
            counted = ["how", "are", "you", "how"] + ["day", "nice"]
            _publish(shuffle, 0, 0, counted[:4])
            _publish(shuffle, 1, 1, ["other", "queue"])  # no rows for queue 0
            _publish(shuffle, 2, 0, counted[4:])

            read: list[tuple[int, list[str]]] = []  # (batch, its files) each time a batch finds its files
            real_batch_files = stage_query.batch_files

            def noting_batch_files(checkpoint: Path, batch_id: int, input_dir: Path, suffix: str) -> list[Path]:
                files = real_batch_files(checkpoint, batch_id, input_dir, suffix)
                read.append((batch_id, [p.name for p in files]))
                return files

            monkeypatch.setattr(stage_query, "batch_files", noting_batch_files)

            # Batch 0 reads txids 0-2 (1 vouched for by the file of 2), commits, and "crashes".
            real_publish = TaskRunner._publish

            def publish_then_crash(runner: TaskRunner, txid: int, epoch: int) -> None:
                real_publish(runner, txid, epoch)
                if runner is first:
                    raise CrashAfterPublishError(f"txid {txid} committed")

            monkeypatch.setattr(TaskRunner, "_publish", publish_then_crash)
            first.start()
            try:
                _wait(lambda: first.failure() is not None, "batch 0 crashed after its commit")
                assert _committed(admin, topology_id, task) == 0
                assert shuffle_queue.offset_txids(first.layout.checkpoint_dir(task), 0) == {UPSTREAM: 2}
            finally:
                first.stop()

            # Spark delivers committed batch 0 again: its files are all there; then txids 3-4.
            second = _runner(admin, spark, cluster, topology_id)
            second.start()
            try:
                _wait(lambda: len(read) == 2, lambda: f"batch 0 delivered again; batches read: {read}")
                batch_0 = [batch_file_name(UPSTREAM, t, 1, ".parquet") for t in (0, 2)]
                assert read == [(0, batch_0), (0, batch_0)]
                assert _exact(second, counted), "counts over the skipped txid"
                _publish(shuffle, 3, 1, ["elsewhere"])
                _publish(shuffle, 4, 0, ["day"])
                counted.append("day")
                _wait(lambda: _committed(admin, topology_id, task) == 1, "batch 1 committed")
                assert _exact(second, counted)
            finally:
                second.stop()

            # While the task is down, txid 5's committed file in queue 0 is lost.
            _publish(shuffle, 5, 0, ["lost"])
            _publish(shuffle, 6, 1, ["elsewhere"])
            _publish(shuffle, 7, 0, ["after"])
            (queue / batch_file_name(UPSTREAM, 5, 1, ".parquet")).unlink()
            third = _runner(admin, spark, cluster, topology_id)
            third.start()
            try:
                _wait(lambda: third.failure() is not None, "the batch over the lost file failed")
                failure = third.failure() or ""
                assert "CommittedBatchLostError" in failure and "t00000-x000000000005-e*.parquet" in failure, failure
                assert _committed(admin, topology_id, task) == 1, "nothing committed without the lost file"
                assert _exact(third, counted)
            finally:
                third.stop()
    finally:
        spark.conf.unset(shuffle_queue.ROUND_WAIT_CONF)


def test_a_chained_json_file_reads_in_spark_as_the_records_it_was_given(spark, tmp_path):
    topic = FileTopic(tmp_path / "shuffle", queues=1, chained=True)
    lines = [{"stream": "words", "key": encode_key([w]), "record": f'{{"word": "{w}"}}'} for w in ("how", "are")]
    for txid in range(2):
        topic.stage_batch(0, UPSTREAM, txid, 1, lines)
        topic.publish_batch(UPSTREAM, txid, 1, topic.staged_sizes(UPSTREAM, txid, 1))
    files = [str(p) for p in topic.files(0)]
    assert [previous_txid(Path(f)) for f in files] == [-1, 0]
    read = spark.read.schema(schema_ddl({"stream": "string", "key": "string", "record": "string"})).json(files)
    assert sorted(decision.records_batch(read)) == sorted(
        [("words", line["key"], json.loads(line["record"])) for line in lines] * 2
    )
