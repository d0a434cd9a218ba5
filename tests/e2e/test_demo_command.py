"""The README's headless main job: ``stream-ops demo`` prints exact counts and stops everything;
started again on the same home it resumes the topology it finds (counts go on over both runs'
input; ``--fresh`` is tests/integration/cli/test_stack_restart.py); ``stream-ops demo --kafka`` does the same with a local Kafka
broker as the input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from e2e_helpers import skip_without_kafka_jars

REPO = Path(__file__).resolve().parents[2]


def _demo(home: Path, *options: str, started: str = "submitted") -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "stream_ops.cli", "--home", str(home), "demo", "--repeat", "5", "--timeout", "120", *options],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f": {started}" in result.stderr, result.stderr[-3000:]
    leftovers = subprocess.run(["pgrep", "-f", str(home)], capture_output=True, text=True)
    assert leftovers.stdout.strip() == "", f"processes left running: {leftovers.stdout}"
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_demo_prints_exact_counts_resumes_when_started_again_and_leaves_nothing_running(tmp_path):
    first = _demo(tmp_path / "home")
    assert first["counts"] == {"are": 5, "how": 10, "you": 15, "nice": 5, "day": 5}
    # Started again on the same home: the same submission goes on, counting both runs' input.
    again = _demo(tmp_path / "home", started="resumed")
    assert again["topology_id"] == first["topology_id"] and again["started"] == "resumed"
    assert again["counts"] == {"are": 10, "how": 20, "you": 30, "nice": 10, "day": 10}


def test_demo_with_kafka_counts_a_kafka_topic_exactly_and_stops_the_broker(tmp_path):
    skip_without_kafka_jars()
    summary = _demo(tmp_path / "home", "--kafka")
    assert summary["topology_id"].startswith("kafka_wordcount-")
    assert summary["counts"] == {"are": 5, "how": 10, "you": 15, "nice": 5, "day": 5}
