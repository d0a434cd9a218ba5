"""Trident's state API for user-managed state: ``partition_persist`` and ``state_query``.

A :class:`StateFactory` makes one :class:`State` per partition (task) of the stage that
persists. Each batch the runtime calls ``state.begin_commit(txid)``, then
``updater.update_state(state, tuples, collector)``, then ``state.commit(txid)``, before it
commits the batch in ZooKeeper. As in Trident, the State decides how exactly-once it is: a
transactional or opaque State stores the txid with each value and applies Trident's rules
(see ``stream_ops.examples.wordcount_db``); a plain one is at-least-once.

``state_query`` calls ``query.batch_retrieve(state, args)`` once per batch and partition and
``query.execute(tuple, result, collector)`` per record.

Factories, updaters and query functions travel in the plan by reference: pass a
module-level class, or an instance of a module-level dataclass (its fields are stored as JSON).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any


class State(ABC):
    """A partition of user-managed state (Trident's ``State``)."""

    @abstractmethod
    def begin_commit(self, txid: int) -> None:
        """Called before the updates of batch ``txid``."""

    @abstractmethod
    def commit(self, txid: int) -> None:
        """Called after the updates of batch ``txid``; make them durable here."""

    def close(self) -> None:
        """Release resources when the task stops (optional)."""


class StateFactory(ABC):
    """Makes the State of one partition (Trident's ``StateFactory``)."""

    @abstractmethod
    def make_state(self, partition: int, num_partitions: int) -> State:
        """The State of ``partition`` (0-based) out of ``num_partitions``."""


class Collector:
    """Collects the records an updater or query function emits (Trident's ``TridentCollector``)."""

    def __init__(self, out_fields: Sequence[str] = ()) -> None:
        self.out_fields = tuple(out_fields)
        self.emitted: list[Any] = []

    def emit(self, values: Any) -> None:
        """Emit one output: a value (one out field), a list/tuple (several) or a mapping."""
        self.emitted.append(values)


class StateUpdater(ABC):
    """Applies one batch of records to a State (Trident's ``StateUpdater``)."""

    @abstractmethod
    def update_state(self, state: State, tuples: list[Mapping[str, Any]], collector: Collector) -> None:
        """Apply ``tuples`` (records with the persisted fields) to ``state``."""


class QueryFunction(ABC):
    """Reads a State for a batch of records (Trident's ``QueryFunction``)."""

    @abstractmethod
    def batch_retrieve(self, state: Any, args: list[Mapping[str, Any]]) -> list[Any]:
        """One result per record of ``args`` (records with the query fields)."""

    @abstractmethod
    def execute(self, tuple: Mapping[str, Any], result: Any, collector: Collector) -> None:  # noqa: A002 - Trident's name
        """Emit zero or more outputs for one record and its result."""


class MapGet(QueryFunction):
    """Trident's ``MapGet``: the current value of each key in a map state."""

    def batch_retrieve(self, state: Any, args: list[Mapping[str, Any]]) -> list[Any]:
        return state.multi_get([tuple(a.values()) for a in args])

    def execute(self, tuple: Mapping[str, Any], result: Any, collector: Collector) -> None:  # noqa: A002
        collector.emit(result)
