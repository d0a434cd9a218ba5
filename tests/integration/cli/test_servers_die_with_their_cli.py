"""``stream-ops zookeeper start`` and ``kafka start`` keep their JVM in its own session, so a
signal to the CLI's process group does not reach it; yet a SIGKILL of the CLI must not leave it
running (issue 31, item 1). Real processes: the CLI is SIGKILLed as a whole process group and
the JVM, found in the process tree before the kill, must be gone within seconds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stream_ops.kafka.jars import broker_jar_set, cached_jar_set
from stream_ops.ports import free_port

REPO = Path(__file__).resolve().parents[3]
GONE_WITHIN_S = 15.0  # the kernel signals at once; generous for a loaded machine


def _stat(pid: int) -> tuple[int, str, int] | None:
    """``(parent pid, state, start time in ticks)`` of a process, None when there is none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    return int(fields[1]), fields[0], int(fields[19])


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None and stat[0] == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int, started: int) -> bool:
    """Whether the process ``pid`` that started at ``started`` still runs (a zombie does not)."""
    stat = _stat(pid)
    return stat is not None and stat[2] == started and stat[1] != "Z"


def _kill_cli_and_check_the_jvm_goes(command: list[str], ready: str) -> None:
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, start_new_session=True
    )
    jvm: tuple[int, int] | None = None
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        for line in proc.stdout:
            lines.append(line)
            if ready in line:
                break
            assert time.monotonic() < deadline, "".join(lines)
        assert ready in "".join(lines), "".join(lines)
        java = [
            pid for pid in _children(proc.pid) if "java" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        ]
        assert len(java) == 1, f"one JVM expected under the CLI (pid {proc.pid}), found {java}"
        stat = _stat(java[0])
        assert stat is not None
        jvm = (java[0], stat[2])
        assert os.getpgid(jvm[0]) != proc.pid, "the JVM is in its own session, out of reach of the group's signals"

        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        deadline = time.monotonic() + GONE_WITHIN_S
        while _alive(*jvm):
            assert time.monotonic() < deadline, f"the JVM (pid {jvm[0]}) outlived its SIGKILLed CLI by {GONE_WITHIN_S} s"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        if jvm is not None and _alive(*jvm):
            os.killpg(jvm[0], signal.SIGKILL)  # what the old code left behind


def test_zookeeper_dies_with_its_sigkilled_cli(tmp_path: Path) -> None:
    port = free_port()
    _kill_cli_and_check_the_jvm_goes(
        [sys.executable, "-m", "stream_ops.cli", "zookeeper", "start", "--port", str(port), "--data-dir", str(tmp_path / "zk")],
        ready=f"ZooKeeper serving on 127.0.0.1:{port}",
    )


def test_kafka_dies_with_its_sigkilled_cli(tmp_path: Path) -> None:
    if cached_jar_set(broker_jar_set()) is None:
        pytest.skip("the Kafka broker jars are not cached (python -m stream_ops.kafka.jars fetches them)")
    port = free_port()
    _kill_cli_and_check_the_jvm_goes(
        [sys.executable, "-m", "stream_ops.cli", "kafka", "start", "--port", str(port), "--data-dir", str(tmp_path / "kafka")],
        ready=f"Kafka serving on 127.0.0.1:{port}",
    )
