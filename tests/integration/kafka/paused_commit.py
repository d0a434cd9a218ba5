"""An owner's batch stopped inside its open Kafka transaction, for the crash and zombie tests of
the Kafka sink and the Kafka shuffle: :func:`crash_before_kafka_commit` makes the writer die
after producing a batch, :class:`PausedCommit` holds it there on a thread until released."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest


class SimulatedCrashError(Exception):
    """Stands for the process dying at that point."""


def crash_before_kafka_commit(monkeypatch: pytest.MonkeyPatch, writer_cls: Any, txid: int) -> Callable[[], None]:
    """Make ``writer_cls`` die after producing batch ``txid`` and before committing its
    transaction (raising :class:`SimulatedCrashError`, aborting nothing, as a dead process);
    returns what undoes it (the next owner commits normally)."""
    real_commit = writer_cls._commit

    def crashing_commit(writer: Any) -> None:
        if writer.delivered_txid == txid - 1:  # delivering txid: its messages are produced
            writer._producer.flush(10)
            raise SimulatedCrashError("after producing, before commit_transaction")
        real_commit(writer)

    monkeypatch.setattr(writer_cls, "_commit", crashing_commit)
    monkeypatch.setattr(writer_cls, "_abandon", lambda writer: None)

    def undo() -> None:
        monkeypatch.setattr(writer_cls, "_commit", real_commit)

    return undo


class PausedCommit:
    """``run()`` on a thread, paused in ``writer_cls._commit`` (after its messages were flushed)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, writer_cls: Any, run: Callable[[], object]) -> None:
        self._run = run
        self._paused, self._resume = threading.Event(), threading.Event()
        self.errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._target)
        real_commit = writer_cls._commit
        thread = self._thread

        def pausing_commit(writer: Any) -> None:
            if threading.current_thread() is thread:
                writer._producer.flush(10)
                self._paused.set()
                self._resume.wait(30)
            real_commit(writer)

        monkeypatch.setattr(writer_cls, "_commit", pausing_commit)

    def _target(self) -> None:
        try:
            self._run()
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            self.errors.append(e)

    def start(self) -> None:
        """Start the batch and return once its Kafka transaction is open and unfinished."""
        self._thread.start()
        assert self._paused.wait(60), "the batch never reached its Kafka commit"

    def finish(self) -> list[BaseException]:
        """Let the commit go on; the errors the batch raised."""
        self._resume.set()
        self._thread.join(60)
        return self.errors
