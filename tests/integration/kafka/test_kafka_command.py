"""``stream-ops kafka start`` runs a real broker, creates the topics it is asked for, keeps them
across a restart and stops cleanly on SIGTERM; :func:`produce_json` feeds a topic of it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from stream_ops.kafka.producing import produce_json
from stream_ops.ports import free_port


def _start(port: int, data_dir: Path, *topics: str) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "stream_ops.cli", "kafka", "start", "--port", str(port), "--data-dir", str(data_dir)]
    for topic in topics:
        args += ["--topic", topic]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _wait_serving(proc: subprocess.Popen[str], bootstrap: str) -> list[str]:
    """The output lines up to "Kafka serving on <bootstrap>" (after the topics were created)."""
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if f"Kafka serving on {bootstrap}" in line:
            return lines
    raise AssertionError("the broker did not report serving:\n" + "".join(lines))


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0


def _partitions(bootstrap: str) -> dict[str, int]:
    topics = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics
    return {name: len(t.partitions) for name, t in topics.items() if not name.startswith("__")}


def test_kafka_start_creates_topics_keeps_them_across_a_restart_and_stops_on_sigterm(
    tmp_path: Path, kafka_broker_jars: list[Path]
) -> None:
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    proc = _start(port, tmp_path / "kafka", "sentences:2", "counts")
    try:
        _wait_serving(proc, bootstrap)
        assert _partitions(bootstrap) == {"sentences": 2, "counts": 1}
        assert produce_json(bootstrap, "sentences", [{"n": i} for i in range(6)], partitions=2) == 6
        _stop(proc)
        assert not (tmp_path / "kafka").joinpath("kafka.log").read_text().count("ERROR Exiting Kafka")

        proc = _start(port, tmp_path / "kafka", "sentences:2")  # asked again: kept as it is
        _wait_serving(proc, bootstrap)
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "t", "auto.offset.reset": "earliest"})
        consumer.subscribe(["sentences"])
        seen: list[tuple[int, int]] = []
        deadline = time.monotonic() + 30
        while len(seen) < 6 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                seen.append((message.partition(), json.loads(message.value())["n"]))
        consumer.close()
        assert sorted(seen) == [(0, 0), (0, 2), (0, 4), (1, 1), (1, 3), (1, 5)]
        _stop(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_bad_topic_option_is_one_clear_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "stream_ops.cli", "kafka", "start", "--data-dir", str(tmp_path), "--topic", "t:zero"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "NAME:PARTITIONS" in result.stderr and "Traceback" not in result.stderr
