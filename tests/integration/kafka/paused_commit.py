"""Running an owner's batch until it holds an open Kafka transaction, for the zombie tests of the
Kafka sink and the Kafka shuffle: the batch runs on a thread whose writer, once it has produced
the batch, stops before committing its Kafka transaction until released."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest


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
