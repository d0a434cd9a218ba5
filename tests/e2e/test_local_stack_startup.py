"""The local stack's worker process (``stream-ops demo`` / ``dev``) starts once: it is given the
allow-listed environment, the rest said as arguments, so it never starts itself again without
it (which imported everything a second time, ~1 s of every start-up); and it starts while
ZooKeeper does."""

from __future__ import annotations

from pathlib import Path

import pytest

from stream_ops.local_stack import LocalStack


def test_the_stacks_worker_starts_once_with_the_allow_listed_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_OPS_TEST_NOT_ALLOW_LISTED", "x")
    with LocalStack(home=tmp_path / "home", workers=1, nimbus=False) as stack:
        worker = stack.worker_processes[0]
        environ = Path(f"/proc/{worker.proc.pid}/environ").read_bytes().split(b"\0")
        names = {item.split(b"=", 1)[0].decode() for item in environ if item}
        assert not names & {"STREAM_OPS_TEST_NOT_ALLOW_LISTED", "STREAM_OPS_ZOOKEEPER", "STREAM_OPS_HOME"}
        log = worker.log.read_text()
        assert "registered" in log
        assert "starting again in this process" not in log, log
