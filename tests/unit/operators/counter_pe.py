"""S4's counter example as a real processing element, shared by the operator tests.

Counts the events of each key and emits ``{"key", "count"}`` when the trigger fires (every N
events and/or every S seconds), and a final record when the instance is removed. The
lifecycle log (class attribute, cleared by tests) records every callback, to check order.
"""

from __future__ import annotations

from typing import Any

from stream_ops.operators import ProcessingElement


class CounterPE(ProcessingElement):
    """Count events per key (S4's ``CounterPE``)."""

    calls: list[tuple[str, Any]] = []
    """Every callback as ``(name, key)``, across instances (class-level test probe)."""

    def on_create(self) -> None:
        self.count = 0
        self.seen: list[Any] = []
        CounterPE.calls.append(("on_create", self.key))

    def on_event(self, event: dict[str, Any]) -> None:
        self.count += 1
        self.seen.append(event.get("n"))
        CounterPE.calls.append(("on_event", self.key))

    def on_trigger(self, event: dict[str, Any] | None) -> None:
        self.emit(key=self.key, count=self.count)
        CounterPE.calls.append(("on_trigger", self.key))

    def on_remove(self) -> None:
        self.emit({"key": self.key, "count": self.count}, final=True)
        CounterPE.calls.append(("on_remove", self.key))

    def on_restore(self) -> None:
        CounterPE.calls.append(("on_restore", self.key))
