"""S4's processing elements as S4 users know them: a configured prototype, two input streams
with per-stream handlers, a key-less control stream broadcast to every instance, a named output
stream, ``on_time`` summaries, an instance cache with ``on_remove``, and a singleton PE.

::

    payments (FileTopic) ─┐
                          ├─ CardPE(limit=3) per card ─┬─ default: summaries (on_time, on_remove) ─ to_parquet(card_summaries)
    limits (FileTopic) ───┘   (limits: no key,         └─ "alerts" ─ AlertTotalPE (singleton) ─ to_parquet(alert_totals)
                              broadcast)

* ``CardPE(limit=3)`` is a prototype: every card's instance is a copy of it (S4's
  ``PE prototype``), so each starts with ``limit == 3``.
* A payment reaches its card's instance (``on_payments``); a record of ``limits`` has no key
  and reaches every live instance on every task (``on_limits``, S4's broadcast), changing the
  limit of the cards seen so far.
* Past the limit, each payment emits an alert to the named stream ``alerts``
  (``emit(..., stream="alerts")``); the singleton ``AlertTotalPE`` counts all alerts and emits
  the running total on every alert (``Trigger.count(1)``).
* Every ``timer_interval`` seconds each instance writes a summary of its card (``on_time``);
  at most ``max_instances`` cards are kept per task, the least recently used one is removed
  with a final summary (``on_remove``).
* ``Trigger.time(60, on_event=True)``: S4's time trigger, fired by the first payment a minute
  after the last firing, emits a checkpoint summary marked ``"trigger"``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from stream_ops import FileTopic, Topology
from stream_ops.operators import ProcessingElement, Trigger

PAYMENTS = {"card": "string", "amount": "long"}
LIMITS = {"limit": "long"}
SUMMARY = {"card": "string", "payments": "long", "total": "long", "limit": "long", "reason": "string"}
ALERT = {"card": "string", "payments": "long", "limit": "long"}


class CardPE(ProcessingElement):
    """One card: counts its payments and alerts past ``limit`` (a prototype's setting)."""

    def __init__(self, limit: int = 3) -> None:
        super().__init__()
        self.limit = limit

    def on_create(self) -> None:
        self.payments = 0
        self.total = 0

    def on_payments(self, event: dict[str, Any]) -> None:
        self.payments += 1
        self.total += int(event["amount"])
        if self.payments > self.limit:
            self.emit({"card": self.key, "payments": self.payments, "limit": self.limit}, stream="alerts")

    def on_limits(self, event: dict[str, Any]) -> None:
        self.limit = int(event["limit"])

    def on_trigger(self, event: dict[str, Any] | None) -> None:
        self._summary("trigger")

    def on_time(self) -> None:
        self._summary("timer")

    def on_remove(self) -> None:
        self._summary("removed")

    def _summary(self, reason: str) -> None:
        self.emit(card=self.key, payments=self.payments, total=self.total, limit=self.limit, reason=reason)


class AlertTotalPE(ProcessingElement):
    """One instance for all alerts (S4's singleton PE): the running number of alerts."""

    def on_create(self) -> None:
        self.alerts = 0

    def on_event(self, event: dict[str, Any]) -> None:
        self.alerts += 1

    def on_trigger(self, event: dict[str, Any] | None) -> None:
        self.emit(alerts=self.alerts)


def build_s4_parity(
    root: str | os.PathLike[str],
    *,
    name: str = "s4-parity",
    queues: int = 2,
    limit: int = 3,
    timer_interval: float = 30.0,
    max_instances: int = 10_000,
) -> Topology:
    """The graph of the module doc on ``root/payments`` and ``root/limits`` (FileTopics),
    writing ``root/card_summaries`` and ``root/alert_totals``."""
    root = Path(root)
    topology = Topology(name)
    payments = topology.source("payments", FileTopic(root / "payments", queues), schema=PAYMENTS)
    limits = topology.source("limits", FileTopic(root / "limits", 1), schema=LIMITS)
    summaries = topology.process(
        CardPE(limit=limit),
        streams={"payments": (payments, "card"), "limits": (limits, None)},
        out=SUMMARY,
        outputs={"alerts": ALERT},
        trigger=Trigger.time(60, on_event=True),
        timer_interval=timer_interval,
        max_instances=max_instances,
        name="cards",
    )
    summaries.to_parquet(root / "card_summaries", name="card_summaries")
    alerts = topology.stream("alerts")
    totals = alerts.process(AlertTotalPE, singleton=True, trigger=Trigger.count(1), out={"alerts": "long"}, name="alert-total")
    totals.to_parquet(root / "alert_totals", name="alert_totals")
    return topology


def topology() -> Topology:
    """The example on ``$STREAM_OPS_HOME/input/s4-parity``."""
    return build_s4_parity(Path(os.environ.get("STREAM_OPS_HOME", "var/stream_ops")).resolve() / "input" / "s4-parity")
