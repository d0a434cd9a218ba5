"""The commit protocol under machine crashes, stale owners and a checkpoint behind ZooKeeper.

Each test reproduces one hole of the protocol review: files a committed batch needs that are
lost (an OS crash on storage without fsync), a stale owner resuming in the middle of its start,
a Spark checkpoint rolled back behind ZooKeeper, a stop that closes the state under a running
batch, and aggregate values a keyed stage cannot combine.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from runners import make_runner

from stream_ops import FileTopic, Sum, Topology, TransactionalMapState
from stream_ops.config import ClusterConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import CommittedBatchLostError, OwnershipLostError, ReplayError, TaskStoppingError
from stream_ops.examples.wordcount import build_wordcount
from stream_ops.hashing import encode_key
from stream_ops.nimbus.submission import submit
from stream_ops.runtime import batch_compute
from stream_ops.runtime.ownership import acquire
from stream_ops.runtime.task_runner import TaskRunner
from stream_ops.topics.file_topic import batch_file_name
from stream_ops.topics.shuffle_files import PartialsShuffle

SOURCE_SCHEMA = "sentence string, _corrupt_record string"


def _runner(store, spark, cluster, topology_id, worker_id, stage, **settings):
    return make_runner(store, spark, cluster, topology_id, worker_id, stage=stage, **settings)


def _sentences(spark, *sentences):
    return spark.createDataFrame([(s, None) for s in sentences], SOURCE_SCHEMA)


def _partials(spark, counts: dict[str, int | None]):
    return spark.createDataFrame([(encode_key([w]), n) for w, n in counts.items()], "key string, value long")


@pytest.fixture
def cluster(tmp_path) -> ClusterConfig:
    return ClusterConfig(root=tmp_path / "cluster")


def test_a_stale_owner_resuming_in_its_start_leaves_the_new_owners_files(spark, zk_config, cluster, tmp_path):
    with ZkStore.connect(zk_config) as admin, ZkStore.connect(zk_config) as store_x:
        topology_id = submit(admin, cluster, build_wordcount(tmp_path / "in", queues=1), workers=1)
        x = _runner(store_x, spark, cluster, topology_id, "host-x:1", stage=0)
        # X takes the task, then stalls before _prepare_state (a GC pause past its session).
        x.ownership = acquire(store_x, topology_id, x.task.task_id, "host-x:1")
        admin.delete(ZkPaths.owner(topology_id, x.task.task_id))
        y = _runner(admin, spark, cluster, topology_id, "host-y:2", stage=0)
        y.prepare()
        y.process_batch(_sentences(spark, "how are you"), 0)
        shuffle = y.layout.shuffle_topic(y.plan.stage(1))
        in_flight = shuffle.stage_batch(0, y.task.task_id, 1, y.ownership.epoch, [{"key": '["x"]', "value": 1}])

        with pytest.raises(OwnershipLostError):  # X resumes: it checks before deleting anything
            x._prepare_state()
        # ... and had the check raced the takeover, it still deletes only epochs below its own
        shuffle.discard_staged(x.task.task_id, below_epoch=x.ownership.epoch, keep=None)
        assert in_flight.exists()
        with pytest.raises(OwnershipLostError):  # nor does X start a query on the shared checkpoint
            x.start_query()
        assert x.query is None

        in_flight.unlink()
        y.process_batch(_sentences(spark, "nice day"), 1)
        published = sorted(p.name for p in shuffle.files(0))
        assert published == [batch_file_name(y.task.task_id, txid, y.ownership.epoch, ".parquet") for txid in (0, 1)]
        y.stop()


def test_lost_staged_outputs_of_a_committed_batch_stop_the_task_loudly(spark, zk_config, cluster, tmp_path, monkeypatch):
    with ZkStore.connect(zk_config) as admin:
        topology_id = submit(admin, cluster, build_wordcount(tmp_path / "in", queues=1), workers=1)
        a = _runner(admin, spark, cluster, topology_id, "host-a:1", stage=0)
        a.prepare()

        def crash_after_commit(*args, **kwargs):
            raise SystemExit("simulated machine crash after the ZooKeeper commit")

        monkeypatch.setattr(FileTopic, "publish_batch", crash_after_commit)
        with pytest.raises(SystemExit):
            a.process_batch(_sentences(spark, "how are you"), 0)
        monkeypatch.undo()
        a.stop()
        shuffle = a.layout.shuffle_topic(a.plan.stage(1))
        staged = shuffle.pending_path(0) / batch_file_name(a.task.task_id, 0, a.ownership.epoch, ".parquet")
        assert staged.exists()
        staged.unlink()  # the OS crash lost what the commit vouched for

        b = _runner(admin, spark, cluster, topology_id, "host-b:2", stage=0)
        with pytest.raises(CommittedBatchLostError, match="committed batch txid 0"):
            b.prepare()
        assert not admin.exists(ZkPaths.owner(topology_id, b.task.task_id))  # released again
        assert shuffle.files(0) == []


def test_a_cut_short_state_topic_file_stops_the_keyed_task_loudly(spark, zk_config, cluster, tmp_path):
    with ZkStore.connect(zk_config) as admin:
        topology_id = submit(admin, cluster, build_wordcount(tmp_path / "in", queues=1), workers=1)
        a = _runner(admin, spark, cluster, topology_id, "host-a:1", stage=1)
        a.prepare()
        a.process_batch(_partials(spark, {"how": 2, "you": 1}), 0)
        a.process_batch(_partials(spark, {"how": 1}), 1)
        a.stop()
        state_topic = a.layout.state_topic(a.stage)
        last = state_topic.queue_path(0) / batch_file_name(a.task.task_id, 1, a.ownership.epoch, ".arrow")
        last.write_bytes(last.read_bytes()[:-10])  # the end of the committed batch's file is gone

        b = _runner(admin, spark, cluster, topology_id, "host-b:2", stage=1)
        with pytest.raises(ReplayError, match="cut short|not JSON"):
            b.prepare()
        last.unlink()
        with pytest.raises(ReplayError, match="txid 1 have no state-topic file"):
            b.prepare()


def test_every_batch_of_a_keyed_task_writes_its_state_topic_file(spark, zk_config, cluster, tmp_path):
    with ZkStore.connect(zk_config) as admin:
        topology_id = submit(admin, cluster, build_wordcount(tmp_path / "in", queues=1), workers=1)
        a = _runner(admin, spark, cluster, topology_id, "host-a:1", stage=1)
        a.prepare()
        a.process_batch(_partials(spark, {"how": 2}), 0)
        a.process_batch(_partials(spark, {}), 1)  # nothing changed
        a.stop()
        names = [p.name for p in a.layout.state_topic(a.stage).files(0)]
        assert names == [batch_file_name(a.task.task_id, txid, a.ownership.epoch, ".arrow") for txid in (0, 1)]


def test_a_stop_that_closes_the_state_under_a_running_batch_refuses_its_commit(spark, zk_config, cluster, tmp_path, monkeypatch):
    with ZkStore.connect(zk_config) as admin:
        topology_id = submit(admin, cluster, build_wordcount(tmp_path / "in", queues=1), workers=1)
        a = _runner(admin, spark, cluster, topology_id, "host-a:1", stage=1, stop_wait_s=0.2)
        a.prepare()
        a.process_batch(_partials(spark, {"how": 2}), 0)
        computing, release = threading.Event(), threading.Event()
        real_keyed_batch = batch_compute.keyed_batch

        def slow_keyed_batch(df, stage):
            result = real_keyed_batch(df, stage)
            computing.set()
            release.wait(30)
            return result

        monkeypatch.setattr(batch_compute, "keyed_batch", slow_keyed_batch)
        errors: list[BaseException] = []

        def run():
            try:
                a.process_batch(_partials(spark, {"how": 1}), 1)
            except BaseException as e:  # noqa: BLE001 - the test inspects it
                errors.append(e)

        thread = threading.Thread(target=run)
        thread.start()
        assert computing.wait(30)
        a.stop()  # gives up waiting after 0.2 s and closes the state
        release.set()
        thread.join(30)
        assert len(errors) == 1 and isinstance(errors[0], TaskStoppingError), errors
        record = admin.get_json(ZkPaths.transactional_task(topology_id, a.task.task_id))[0]
        assert record["committed_txid"] == 0
        names = [p.name for p in a.layout.state_topic(a.stage).files(0)]
        assert names == [batch_file_name(a.task.task_id, 0, a.ownership.epoch, ".arrow")]


def _sum_topology(path: Path) -> Topology:
    topology = Topology("sums")
    sums = (
        topology.source("amounts", FileTopic(path, queues=1), schema={"word": "string", "n": "long"})
        .group_by("word")
        .persistent_aggregate(Sum("n"), out="total", state=TransactionalMapState)
    )
    topology.query("totals", sums)
    return topology


def test_a_partial_the_keyed_stage_cannot_combine_is_a_dead_letter(spark, zk_config, cluster, tmp_path):
    with ZkStore.connect(zk_config) as admin:
        topology_id = submit(admin, cluster, _sum_topology(tmp_path / "in"), workers=1)
        a = _runner(admin, spark, cluster, topology_id, "host-a:1", stage=1)
        a.prepare()
        a.process_batch(_partials(spark, {"a": None, "b": 5}), 0)  # a null partial from an older writer
        a.process_batch(_partials(spark, {"a": 2, "b": 1}), 1)
        assert a.lookup([("a",), ("b",)]) == [2, 6]
        a.stop()
        letters = [record for _, _, record in a.layout.dead_letter_topic().read_queue(0)]
        assert len(letters) == 1 and "null" in letters[0]["error"] and letters[0]["txid"] == 0


def test_a_null_sum_field_is_a_dead_letter_at_the_source_stage(spark, zk_config, cluster, tmp_path):
    with ZkStore.connect(zk_config) as admin:
        topology_id = submit(admin, cluster, _sum_topology(tmp_path / "in"), workers=1)
        a = _runner(admin, spark, cluster, topology_id, "host-a:1", stage=0)
        a.prepare()
        df = spark.createDataFrame(
            [("a", None, None), ("a", 3, None), ("b", 4, None)], "word string, n long, _corrupt_record string"
        )
        a.process_batch(df, 0)
        a.stop()
        shuffle = a.layout.shuffle_topic(a.plan.stage(1))
        partials = {r["key"]: r["value"] for r in PartialsShuffle(shuffle, "long").read_queue(0).to_pylist()}
        assert partials == {'["a"]': 3, '["b"]': 4}
        letters = [record for _, _, record in a.layout.dead_letter_topic().read_queue(0)]
        assert len(letters) == 1 and "'n' is null or missing" in letters[0]["error"]


def _wait_committed(store: ZkStore, topology_id: str, task_id: int, txid: int, runner: TaskRunner) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        record = store.get_json(ZkPaths.transactional_task(topology_id, task_id))[0]
        if record["committed_txid"] >= txid:
            return
        assert runner.is_running(), runner.failure()
        time.sleep(0.1)
    raise AssertionError(f"txid {txid} not committed in time")


def _land(path: Path, name: str, sentence: str, mtime: float | None = None) -> None:
    queue = path / "queue-00000"
    queue.mkdir(parents=True, exist_ok=True)
    tmp = queue / f".{name}.tmp"
    tmp.write_text(f'{{"sentence": "{sentence}"}}\n')
    if mtime is not None:
        import os

        os.utime(tmp, (mtime, mtime))
    tmp.rename(queue / name)


@pytest.mark.parametrize("new_input", [False, True], ids=["same-plan", "other-plan"])
def test_a_checkpoint_rolled_back_two_batches(spark, zk_config, cluster, tmp_path, new_input):
    source = tmp_path / "in"
    with ZkStore.connect(zk_config) as admin:
        topology_id = submit(admin, cluster, build_wordcount(source, queues=1), workers=1)
        runner = _runner(admin, spark, cluster, topology_id, "host-a:1", stage=0, trigger_seconds=0.1, max_files_per_trigger=1)
        checkpoint = runner.layout.checkpoint_dir(runner.task.task_id)
        runner.start()
        now = time.time()
        _land(source, "f0.jsonl", "how are you", now - 30)
        _wait_committed(admin, topology_id, runner.task.task_id, 0, runner)
        saved = tmp_path / "checkpoint-after-0"
        shutil.copytree(checkpoint, saved)
        _land(source, "f1.jsonl", "nice day", now - 20)
        _wait_committed(admin, topology_id, runner.task.task_id, 1, runner)
        _land(source, "f2.jsonl", "how nice", now - 10)
        _wait_committed(admin, topology_id, runner.task.task_id, 2, runner)
        runner.stop()

        shutil.rmtree(checkpoint)
        shutil.copytree(saved, checkpoint)  # rolled back two batches, as a machine crash or a restore would
        if new_input:
            _land(source, "f0b.jsonl", "late file", now - 25)  # older than f1: Spark plans it for batch 1
        again = _runner(admin, spark, cluster, topology_id, "host-a:1", stage=0, trigger_seconds=0.1, max_files_per_trigger=1)
        again.start()
        shuffle = again.layout.shuffle_topic(again.plan.stage(1))
        deadline = time.monotonic() + 60
        if new_input:
            while again.is_running() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not again.is_running()
            failure = again.failure() or ""
            assert "plans batch 1 with 1 input file(s), but txid 1 was committed with 1 other file(s)" in failure, failure
            again.stop()
        else:
            # Spark re-plans batches 1 and 2 with the very files they had: skipped, nothing doubled.
            _land(source, "f3.jsonl", "day", now)
            _wait_committed(admin, topology_id, again.task.task_id, 3, again)
            again.stop()
            words = Counter()
            for record in PartialsShuffle(shuffle, "long").read_queue(0).to_pylist():
                words[record["key"]] += record["value"]
            expected = Counter(encode_key([w]) for s in ("how are you", "nice day", "how nice", "day") for w in s.split())
            assert words == expected
