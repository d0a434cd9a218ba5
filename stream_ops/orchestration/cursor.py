"""The heartbeat sensor's cursor: typed, JSON-serialisable, and safe to reset.

Dagster stores a sensor cursor as a string between ticks. :class:`HeartbeatCursor` is what the
heartbeat sensor keeps there, per topology name: the submission last observed, its stage names,
each task's committed txid (to report progress between ticks) and when it last advanced (for
the txid-progress check), since when each task has been lost, and the assignment epoch with
the time the sensor first saw it. A rebalance is requested for tasks lost once the epoch has
been in place for the launch grace, with a run key naming the tasks and the epoch, so the same
loss is never requested twice and a fresh assignment gets time to start.

It also carries the sensor's liveness and spreading state, measured by the sensor's own
clock (the nimbus monitor's rule, :mod:`stream_ops.nimbus.monitor`): per topology each task's
heartbeat fingerprint with the time the sensor saw it change (``heartbeats``, a
:class:`~stream_ops.nimbus.monitor.HeartbeatTracker` exported) and the time of the last spread
request (``spread_at``); cluster-wide, since when each worker slot has been live (``slots``, a
:class:`~stream_ops.nimbus.monitor.SlotTracker`). About 30 bytes per task and per slot.

An unreadable cursor (garbage, another version, a schema change) parses as an empty cursor,
which is always safe: the next tick just observes everything afresh.

Example:
    >>> cursor = HeartbeatCursor.parse(None)
    >>> HeartbeatCursor.parse(cursor.to_json()) == cursor
    True
    >>> HeartbeatCursor.parse("not json").topologies
    {}
"""

from __future__ import annotations

import logging
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = ["HeartbeatCursor", "TopologyCursor"]

logger = logging.getLogger(__name__)


class TopologyCursor(BaseModel):
    """What the sensor remembers about one topology between ticks.

    Attributes:
        topology_id: The live submission last observed (a new id means a resubmission).
        stages: Its stage names, to mark their assets inactive if the submission disappears.
        committed_txids: Task id -> committed txid at the last observation.
        lost_since: Task id -> wall-clock time (unix seconds) it was first seen not alive,
            for tasks still lost at the last observation.
        advanced_at: Task id -> wall-clock time its committed txid was last seen to advance
            (the first observation of a task counts as an advance).
        assignment_epoch: The assignment epoch (znode version) at the last observation.
        epoch_seen_at: Wall-clock time the sensor first saw that epoch of this submission.
        health: Topology health at the last observation.
        observed_at: Wall-clock time (unix seconds) of the last observation.
        heartbeats: Task id -> (heartbeat fingerprint, sensor time it last changed); the
            fingerprint is the heartbeat znode's mzxid, None when there is no heartbeat.
        spread_at: Sensor time of the last spread requested for this submission (None: never).
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    topology_id: str
    stages: tuple[str, ...] = ()
    committed_txids: dict[int, int] = Field(default_factory=dict)
    lost_since: dict[int, float] = Field(default_factory=dict)
    advanced_at: dict[int, float] = Field(default_factory=dict)
    assignment_epoch: int | None = None
    epoch_seen_at: float = 0.0
    health: str = "unknown"
    observed_at: float = 0.0
    heartbeats: dict[int, tuple[int | None, float]] = Field(default_factory=dict)
    spread_at: float | None = None


class HeartbeatCursor(BaseModel):
    """The heartbeat sensor's cursor: one :class:`TopologyCursor` per topology name.

    ``slots``: live worker slot -> (registration czxid, sensor time since when it is live).
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    version: Literal[1] = 1
    topologies: dict[str, TopologyCursor] = Field(default_factory=dict)
    slots: dict[str, tuple[int | None, float]] = Field(default_factory=dict)

    def to_json(self) -> str:
        """Compact JSON, as stored by Dagster."""
        return self.model_dump_json()

    @classmethod
    def parse(cls, raw: str | None) -> HeartbeatCursor:
        """Read a stored cursor; ``None``, empty or unreadable text gives an empty cursor.

        Args:
            raw: The cursor string Dagster kept, if any.

        Returns:
            The cursor, or a fresh one (logged as a warning when ``raw`` was unreadable).
        """
        if not raw:
            return cls()
        try:
            return cls.model_validate_json(raw)
        except ValidationError as e:
            logger.warning(
                "heartbeat sensor cursor is unreadable (%d problems, e.g. %s); starting from an empty cursor",
                e.error_count(),
                e.errors()[0]["msg"] if e.errors() else "?",
            )
            return cls()

    def with_topology(self, name: str, entry: TopologyCursor | None) -> HeartbeatCursor:
        """A copy with ``name``'s entry replaced (or removed when ``entry`` is None)."""
        topologies = dict(self.topologies)
        if entry is None:
            topologies.pop(name, None)
        else:
            topologies[name] = entry
        return self.model_copy(update={"topologies": topologies})
