"""The supervisor: keeps N worker processes alive on this host (Storm's supervisor).

It registers ``/supervisors/{host}`` (ephemeral) with its slots and worker pids, starts one
``stream-ops worker`` per slot port and restarts any that exits, with a backoff that grows
while a slot keeps crashing and resets once a worker has stayed up.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stream_ops.config import ZooKeeperConfig
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import CoordinationError
from stream_ops.runtime.processes import spawn, stop_process, worker_command

logger = logging.getLogger(__name__)

MAX_BACKOFF_S = 30.0
HEALTHY_AFTER_S = 60.0


@dataclass
class Slot:
    """One worker slot the supervisor keeps filled."""

    port: int
    proc: subprocess.Popen[Any] | None = None
    started_at: float = 0.0
    restarts: int = 0
    backoff_s: float = 1.0
    next_start: float = 0.0
    history: list[int] = field(default_factory=list)


class Supervisor:
    """Starts and restarts the worker processes of one host.

    Args:
        zookeeper: cluster ZooKeeper (also given to the workers).
        home: shared cluster directory (given to the workers).
        host: name workers register under.
        ports: one slot per port.
        worker_args: extra ``stream-ops worker`` options.
        log_dir: where worker logs go (default ``home/logs``).
    """

    def __init__(
        self,
        zookeeper: ZooKeeperConfig,
        home: Path,
        *,
        host: str,
        ports: Sequence[int],
        worker_args: Sequence[str] = (),
        log_dir: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.zookeeper = zookeeper
        self.home = home
        self.host = host
        self.slots = [Slot(port) for port in ports]
        self.worker_args = list(worker_args)
        self.log_dir = log_dir or home / "logs"
        self.clock = clock

    def _start(self, slot: Slot) -> None:
        cmd = worker_command(self.zookeeper, self.home, host=self.host, port=slot.port, extra_args=self.worker_args)
        slot.proc = spawn(cmd, self.log_dir / f"worker-{self.host}-{slot.port}.log", env=os.environ)
        slot.started_at = self.clock()
        slot.history.append(slot.proc.pid)
        logger.info("supervisor %s: worker %s:%d started (pid %d)", self.host, self.host, slot.port, slot.proc.pid)

    def check_slots(self) -> bool:
        """Restart exited workers whose backoff has passed; True if any pid changed."""
        now = self.clock()
        changed = False
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is None:
                if now - slot.started_at > HEALTHY_AFTER_S:
                    slot.backoff_s = 1.0
                continue
            if slot.proc is not None:
                logger.warning(
                    "supervisor %s: worker on port %d exited with %s; restarting in %.1f s",
                    self.host,
                    slot.port,
                    slot.proc.returncode,
                    slot.backoff_s,
                )
                slot.proc = None
                slot.next_start = now + slot.backoff_s
                slot.backoff_s = min(slot.backoff_s * 2, MAX_BACKOFF_S)
                slot.restarts += 1
            if now >= slot.next_start:
                self._start(slot)
                changed = True
        return changed

    def record(self) -> dict[str, Any]:
        """What ``/supervisors/{host}`` holds."""
        return {
            "host": self.host,
            "pid": os.getpid(),
            "slots": [{"port": s.port, "pid": s.proc.pid if s.proc else None, "restarts": s.restarts} for s in self.slots],
        }

    def run(self, stop: threading.Event, *, poll_interval_s: float = 0.5) -> None:
        """Keep the slots filled until ``stop`` is set; then stop every worker."""
        with ZkStore.connect(self.zookeeper) as store:
            path = ZkPaths.supervisor(self.host)
            store.ensure_path(ZkPaths.SUPERVISORS)
            try:
                store.create_json(path, self.record(), ephemeral=True)
            except CoordinationError as e:
                raise CoordinationError(f"another supervisor is registered for host {self.host}: {e}") from e
            try:
                while not stop.is_set():
                    if self.check_slots():
                        try:
                            store.set_json(path, self.record())
                        except CoordinationError as e:
                            logger.warning("supervisor %s: could not update %s: %s", self.host, path, e)
                    stop.wait(poll_interval_s)
            finally:
                for slot in self.slots:
                    if slot.proc is not None:
                        stop_process(slot.proc)
                logger.info("supervisor %s stopped its %d workers", self.host, len(self.slots))
