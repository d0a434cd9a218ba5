"""S4's counter example: a processing element per word counts its events and emits the count
every N events (or S seconds); the latest emitted count per word is kept in a map state."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from stream_ops import FileTopic, Max, OpaqueMapState, Topology
from stream_ops.examples.wordcount import split
from stream_ops.operators import ProcessingElement, Trigger


class WordCounterPE(ProcessingElement):
    """Counts the events of one word (S4's ``CounterPE``)."""

    def on_create(self) -> None:
        self.count = 0

    def on_event(self, event: dict[str, Any]) -> None:
        self.count += 1

    def on_trigger(self, event: dict[str, Any] | None) -> None:
        self.emit(word=self.key, count=self.count)


EVERY_THIRD_EVENT = Trigger.count(3)
"""The example's default trigger: ``on_trigger`` after every third event of a key."""


def build_counter(
    input_path: str | os.PathLike[str],
    *,
    name: str = "pe-counter",
    queues: int = 1,
    trigger: Trigger = EVERY_THIRD_EVENT,
    ttl_seconds: float | None = None,
) -> Topology:
    """Sentences -> words -> one WordCounterPE per word -> latest count per word."""
    topology = Topology(name)
    words = topology.source("sentences", FileTopic(input_path, queues), schema={"sentence": "string"}).each(
        split, out="word", fields=["sentence"]
    )
    emitted = words.process(
        WordCounterPE, key="word", trigger=trigger, ttl_seconds=ttl_seconds, out={"word": "string", "count": "long"}
    )
    latest = emitted.group_by("word").persistent_aggregate(Max("count"), out="count", state=OpaqueMapState, name="latest")
    topology.query("latest", latest)
    return topology


def topology() -> Topology:
    """The example on ``$STREAM_OPS_HOME/input/pe-counter``."""
    return build_counter(Path(os.environ.get("STREAM_OPS_HOME", "var/stream_ops")).resolve() / "input" / "pe-counter")
