"""Automatic snapshots: compact a task's state-topic queue once its tail since the last
snapshot grows past a threshold, so no failover replays more than that tail.

The owner of a stateful task counts the entries and bytes it appends to its queue; when
either passes the topology's threshold it compacts the queue in the background, under the
same ZooKeeper lock as ``stream-ops compact`` and the Dagster schedule, at the committed txid.
A compaction that finds the lock taken is simply tried again after the next batches.

Thresholds come from the submission's conf (``submit(..., conf={...})``):
``snapshot_after_entries`` (default 500,000) and ``snapshot_after_bytes`` (default 256 MiB);
0 turns that trigger off.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stream_ops.errors import ConfigError

logger = logging.getLogger(__name__)


class SnapshotPolicy(BaseModel):
    """When a task snapshots its state by itself."""

    model_config = ConfigDict(frozen=True)

    after_entries: int = Field(500_000, ge=0, description="State-topic entries since the last snapshot (0: never).")
    after_bytes: int = Field(256 * 1024 * 1024, ge=0, description="State-topic bytes since the last snapshot (0: never).")

    @classmethod
    def from_conf(cls, conf: Mapping[str, Any]) -> SnapshotPolicy:
        """The policy of a topology's conf (``snapshot_after_entries``, ``snapshot_after_bytes``).

        Raises:
            ConfigError: a value that is not a non-negative integer.
        """
        values = {
            name: conf[key]
            for name, key in (("after_entries", "snapshot_after_entries"), ("after_bytes", "snapshot_after_bytes"))
            if key in conf
        }
        try:
            return cls(**values)
        except ValidationError as e:
            raise ConfigError(f"topology conf: snapshot thresholds must be non-negative integers: {e}") from None

    def due(self, entries: int, size: int) -> bool:
        """Whether a tail of ``entries`` entries and ``size`` bytes calls for a snapshot."""
        return (self.after_entries > 0 and entries >= self.after_entries) or (self.after_bytes > 0 and size >= self.after_bytes)


class AutoSnapshot:
    """Counts one task's tail and runs ``compact()`` in the background when the policy says so.

    ``compact`` snapshots the queue at the committed txid (and deletes the files it covers);
    it may raise (the lock is taken, the disk is full): that is logged and tried again later.
    """

    def __init__(self, policy: SnapshotPolicy, compact: Callable[[], object], *, name: str) -> None:
        self.policy = policy
        self._compact = compact
        self._name = name
        self._entries = 0
        self._bytes = 0
        self._running: threading.Thread | None = None
        self.snapshots = 0

    @property
    def tail(self) -> tuple[int, int]:
        """(entries, bytes) appended since the last snapshot began."""
        return self._entries, self._bytes

    def appended(self, entries: int, size: int) -> None:
        """A committed batch appended ``entries`` entries of ``size`` bytes; maybe start a snapshot."""
        self._entries += entries
        self._bytes += size
        if not self.policy.due(self._entries, self._bytes) or (self._running is not None and self._running.is_alive()):
            return
        logger.info("%s: state-topic tail of %d entries / %d bytes: snapshotting", self._name, self._entries, self._bytes)
        self._entries = self._bytes = 0  # what comes from now on is the next tail
        self._running = threading.Thread(target=self._run, name=f"snapshot-{self._name}", daemon=True)
        self._running.start()

    def _run(self) -> None:
        try:
            self._compact()
            self.snapshots += 1
        except Exception as e:  # noqa: BLE001 - a failed snapshot is tried again later, the task goes on
            logger.warning("%s: automatic snapshot failed (tried again later): %s", self._name, e)

    def wait(self, timeout_s: float) -> None:
        """Wait for a running snapshot (tests, shutdown)."""
        if self._running is not None:
            self._running.join(timeout_s)
