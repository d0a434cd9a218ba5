"""What step 2 of the commit protocol computed for one batch, filled in as the steps go."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stream_ops.operators.window_partials import WindowPartials


@dataclass
class ComputedBatch:
    """One batch of a task between Spark's part of step 2 and its commit."""

    rows_in: int
    records: list[dict[str, Any]] = field(default_factory=list)
    """The records at the stage's input tap, when its operations run on the driver."""
    outputs: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    """Records per stage output index."""
    output_partials: dict[int, list[tuple[str, Any]]] = field(default_factory=dict)
    """Partial aggregates Spark computed per partials output."""
    window_partials: dict[int, WindowPartials] = field(default_factory=dict)
    """Partials per (window, key) per records output into an event-time window stage, sent
    besides its whole records (:mod:`stream_ops.operators.window_partials`)."""
    partials: list[tuple[str, Any]] = field(default_factory=list)
    """(encoded key, partial aggregate) a keyed stage applies to its state."""
    dead: list[dict[str, Any]] = field(default_factory=list)
    side: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Records of the processor's named side streams (late records, named output streams)."""
    rows: list[tuple[str, str | None, dict[str, Any]]] = field(default_factory=list)
    """The shuffled (stream, key, record) rows a records stage's processor reads."""
    driver_operations: bool = False
    """Whether the stage's record operations still have to run on the driver."""
    updated_keys: int = 0
