"""``stream-ops status`` says its key counts are RocksDB's estimate (issue 31, item 4): the column
is ``~KEYS`` with a footnote, and the JSON carries ``state_keys_estimate`` besides the
``state_keys`` earlier releases wrote."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from stream_ops.cli import main
from stream_ops.config import ZooKeeperConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import HeartbeatRecord
from stream_ops.nimbus.status import STATE_KEYS_NOTE


def _status(zk_config: ZooKeeperConfig, tmp_path: Path, *args: str) -> Result:
    base = ["--zookeeper", zk_config.hosts, "--chroot", zk_config.chroot, "--home", str(tmp_path / "home")]
    result = CliRunner().invoke(main, [*base, "status", "wordcount", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def test_status_labels_the_key_count_as_an_estimate(
    zk_config: ZooKeeperConfig,
    tmp_path: Path,
    fake_worker: Callable[[int], Any],
    submit_wordcount: Callable[..., str],
) -> None:
    worker = fake_worker(6700)
    topology_id = submit_wordcount(workers=1)
    plain = _status(zk_config, tmp_path).output
    assert "~KEYS" in plain.splitlines()[1] and " KEYS " not in plain
    assert STATE_KEYS_NOTE not in plain  # no keys yet: nothing to explain

    task = worker.assigned(topology_id)[-1]  # the keyed stage's task
    beat = HeartbeatRecord(worker_id=worker.worker_id, time=time.time(), epoch=1, state_keys=183)
    worker.store.create_json(ZkPaths.heartbeat(topology_id, task), beat.to_json_obj(), ephemeral=True)

    text = _status(zk_config, tmp_path).output
    row = next(line for line in text.splitlines() if line.split()[0] == str(task))
    assert "183" in row.split()
    assert f"  {STATE_KEYS_NOTE}" in text.splitlines()
    assert "estimate" in STATE_KEYS_NOTE

    tasks = json.loads(_status(zk_config, tmp_path, "--json").output)["tasks"]
    keyed = next(t for t in tasks if t["task_id"] == task)
    assert (keyed["state_keys_estimate"], keyed["state_keys"]) == (183, 183)
    assert all("state_keys_estimate" in t for t in tasks)

    help_text = CliRunner().invoke(main, ["status", "--help"]).output
    assert "~KEYS" in help_text and "estimate" in help_text
