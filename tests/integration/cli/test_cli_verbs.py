"""The ``stream-ops`` verbs against a real ZooKeeper (no Spark: nothing here runs tasks)."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from stream_ops.cli import main
from stream_ops.coordination.paths import ZkPaths
from stream_ops.topics.file_topic import FileTopic


@pytest.fixture
def cli(zk_config, tmp_path, monkeypatch):
    monkeypatch.setenv("STREAM_OPS_HOME", str(tmp_path / "home"))
    runner = CliRunner()

    def run(*args: str, input: str | None = None, ok: bool = True):  # noqa: A002 - CliRunner.invoke's name
        result = runner.invoke(
            main,
            ["--zookeeper", zk_config.hosts, "--chroot", zk_config.chroot, "--home", str(tmp_path / "home"), *args],
            input=input,
            catch_exceptions=False,
        )
        if ok:
            assert result.exit_code == 0, result.output
        return result

    return run


def test_submit_list_status_deactivate_activate_kill(cli, zk_store):
    topology_id = (
        cli("submit", "stream_ops.examples.wordcount:topology", "--workers", "2", "--conf", "topology.debug=true")
        .output.strip()
        .splitlines()[-1]
    )
    assert re.fullmatch(r"wordcount-\d+-\d+", topology_id)

    listed = json.loads(cli("list", "--json").output)
    assert [(t["topology_id"], t["status"], t["num_tasks"], t["conf"]) for t in listed] == [
        (topology_id, "ACTIVE", 4, {"topology.debug": True})
    ]
    status = json.loads(cli("status", "wordcount", "--json").output)
    assert status["health"] == "down"  # no worker runs it
    assert [t["committed_txid"] for t in status["tasks"]] == [-1, -1, -1, -1]

    cli("deactivate", "wordcount")
    assert zk_store.get_json(ZkPaths.storm(topology_id))[0]["status"] == "INACTIVE"
    cli("activate", "wordcount")
    assert zk_store.get_json(ZkPaths.storm(topology_id))[0]["status"] == "ACTIVE"

    again = cli("submit", "stream_ops.examples.wordcount:topology", ok=False)
    assert again.exit_code == 1 and "already running" in again.output

    cli("kill", "wordcount")
    assert not zk_store.exists(ZkPaths.storm(topology_id))
    missing = cli("status", "wordcount", ok=False)
    assert missing.exit_code == 1 and "no running topology named 'wordcount'" in missing.output


def test_cluster_wide_topology_defaults_apply_unless_the_topology_conf_sets_the_key(cli, zk_store, monkeypatch):
    monkeypatch.setenv("STREAM_OPS_TOPOLOGY_DEFAULTS", "state_topic=kafka state_topic_bootstrap=kafka:9092")
    topology_id = (
        cli("submit", "stream_ops.examples.wordcount:topology", "--conf", "state_topic_bootstrap=other:9092")
        .output.strip()
        .splitlines()[-1]
    )
    conf = zk_store.get_json(ZkPaths.storm(topology_id))[0]["conf"]
    assert conf == {"state_topic": "kafka", "state_topic_bootstrap": "other:9092"}
    cli("kill", "wordcount")
    bad = cli("--topology-default", "no-equals-sign", "list", ok=False)
    assert bad.exit_code == 2 and "--topology-default" in bad.output


def test_submit_of_a_bad_reference_is_one_clear_line(cli):
    result = cli("submit", "stream_ops.examples.nope:topology", ok=False)
    assert result.exit_code == 1
    assert "cannot import module 'stream_ops.examples.nope'" in result.output
    assert "Traceback" not in result.output


def test_produce_by_key_and_round_robin(cli, tmp_path):
    lines = "\n".join(json.dumps({"word": w}) for w in ["a", "b", "c", "a", "a"]) + "\n"
    out = json.loads(cli("produce", str(tmp_path / "t"), "--queues", "3", "--key", "word", input=lines).output)
    assert out["written"] == 5
    topic = FileTopic(tmp_path / "t", 3)
    by_queue = {q: [r["word"] for _, _, r in topic.read_queue(q)] for q in range(3)}
    assert sorted(w for ws in by_queue.values() for w in ws) == ["a", "a", "a", "b", "c"]
    assert sum("a" in ws for ws in by_queue.values()) == 1  # one key, one queue

    bad = cli("produce", str(tmp_path / "t"), "--queues", "3", input='{"word": "x"}\nnot json\n', ok=False)
    assert bad.exit_code == 1 and "line 2: not JSON" in bad.output


def test_rebalance_without_workers_leaves_tasks_waiting(cli):
    cli("submit", "stream_ops.examples.wordcount:topology")
    out = json.loads(cli("rebalance", "wordcount").output)
    assert out["tasks"] == {}
