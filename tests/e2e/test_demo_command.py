"""The README's headless main job: ``stream-ops demo`` prints exact counts and stops everything."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_demo_prints_exact_counts_and_leaves_nothing_running(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "stream_ops.cli", "--home", str(tmp_path / "home"), "demo", "--repeat", "5", "--timeout", "120"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["counts"] == {"are": 5, "how": 10, "you": 15, "nice": 5, "day": 5}
    leftovers = subprocess.run(["pgrep", "-f", str(tmp_path / "home")], capture_output=True, text=True)
    assert leftovers.stdout.strip() == "", f"processes left running: {leftovers.stdout}"
