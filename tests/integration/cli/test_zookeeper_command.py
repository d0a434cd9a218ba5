"""``stream-ops zookeeper start`` runs a real server and stops cleanly on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from stream_ops.coordination.embedded import four_letter_word
from stream_ops.ports import free_port


def test_zookeeper_start_serves_and_stops_on_sigterm(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "stream_ops.cli", "zookeeper", "start", "--port", str(port), "--data-dir", str(tmp_path / "zk")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if "Mode:" in four_letter_word("127.0.0.1", port, "srvr"):
                    break
            except OSError:
                pass
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "ZooKeeper did not answer"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        output = proc.stdout.read()
        assert f"127.0.0.1:{port}" in output
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_missing_java_is_one_clear_error(tmp_path):
    env = {**os.environ, "PATH": "/nonexistent", "JAVA_HOME": ""}
    result = subprocess.run(
        [sys.executable, "-m", "stream_ops.cli", "zookeeper", "start", "--port", str(free_port()), "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 1
    assert "Java" in result.stderr and "Traceback" not in result.stderr
