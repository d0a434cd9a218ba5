"""A process told ``--insecure`` says so once in its log (issue 31, item 7): the CLI's early check
and the process's own check share one warning, and a worker that starts itself again without
its environment (an exec, same pid) warns only in the image that runs."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from stream_ops.config import ZooKeeperConfig
from stream_ops.coordination.acl import require_auth
from stream_ops.errors import ZooKeeperAuthRequiredError
from stream_ops.ports import free_port

REPO = Path(__file__).resolve().parents[3]
WARNING = "runs INSECURE"


def test_a_real_worker_that_restarts_itself_warns_once(tmp_path: Path) -> None:
    # Nothing listens on the ZooKeeper port: the worker gets as far as connecting (after every
    # check) and fails there, with no Spark started. The extra variable makes it start itself
    # again without it, as a worker started from a full shell environment does.
    command = [
        sys.executable,
        "-m",
        "stream_ops.cli",
        "--zookeeper",
        f"127.0.0.1:{free_port()}",
        "--home",
        str(tmp_path / "home"),
        "--session-timeout",
        "2",
        "worker",
        "--port",
        str(free_port()),
        "--insecure",
    ]
    env = {**os.environ, "ISSUE31_NOT_ALLOW_LISTED": "1"}
    for name in ("STREAM_OPS_ZK_AUTH", "STREAM_OPS_ZK_AUTH_FILE"):
        env.pop(name, None)
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env, start_new_session=True
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 90
        # Worker.run checks before it connects: once kazoo reports the refused connection (or
        # the worker gave up), every warning the worker will log is in its output.
        for line in proc.stdout:
            lines.append(line)
            if "kazoo" in line or line.startswith("error:"):
                break
            assert time.monotonic() < deadline, "".join(lines)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    output = "".join(lines)
    assert "starting again in this process without" in output and "ISSUE31_NOT_ALLOW_LISTED" in output, output
    assert output.count(WARNING) == 1, output


def test_repeated_checks_warn_once_and_an_early_check_may_stay_silent(caplog: pytest.LogCaptureFixture) -> None:
    chroot = f"/warn-once-{uuid.uuid4().hex[:8]}"  # a key no other test warned for in this process
    insecure = ZooKeeperConfig(hosts="127.0.0.1:2181", chroot=chroot, insecure=True)
    with caplog.at_level(logging.WARNING, logger="stream_ops.coordination.acl"):
        require_auth(insecure, "nimbus", warn=False)
        assert WARNING not in caplog.text
        require_auth(insecure, "nimbus")
        require_auth(insecure, "nimbus")
        require_auth(ZooKeeperConfig(hosts="127.0.0.1:2181", chroot=chroot, insecure=True), "nimbus")
        require_auth(insecure, "supervisor")  # another process kind of this process warns too
    assert [r.getMessage().split(":")[0] for r in caplog.records if WARNING in r.getMessage()] == [
        "nimbus runs INSECURE",
        "supervisor runs INSECURE",
    ]
    with pytest.raises(ZooKeeperAuthRequiredError, match="--insecure"):
        require_auth(ZooKeeperConfig(hosts="127.0.0.1:2181", chroot=chroot), "worker", warn=False)
