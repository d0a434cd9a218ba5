"""Plans and definition-time errors of S4 processing elements: prototypes, several input
streams, broadcast, named outputs, singletons, timers and instance caches."""

from __future__ import annotations

from typing import Any

import pytest

from stream_ops import FileTopic, Topology
from stream_ops.dsl import build_plan
from stream_ops.errors import TopologyDefinitionError
from stream_ops.examples.s4_parity import AlertTotalPE, CardPE, build_s4_parity
from stream_ops.operators import ProcessingElement, Trigger


def test_the_s4_example_plans_prototype_streams_broadcast_outputs_and_a_singleton(tmp_path):
    plan = build_plan(build_s4_parity(tmp_path, limit=5, timer_interval=7, max_instances=100))
    payments, limits, cards, totals = plan.stages
    spec = cards.process
    assert spec.pe_class.endswith(":CardPE") and spec.prototype == {"fields": {"limit": 5}}
    assert spec.key_field == {"payments": "card", "limits": None}
    assert (spec.timer_interval, spec.max_instances, spec.outputs) == (7, 100, ("alerts",))
    assert spec.trigger["seconds_on_event"] == 60
    pay_out, limit_out = payments.outputs[0], limits.outputs[0]
    assert (pay_out.stream, pay_out.key_fields, pay_out.broadcast_unkeyed) == ("payments", ("card",), True)
    assert (limit_out.stream, limit_out.key_fields, limit_out.broadcast_unkeyed) == ("limits", (), True)
    assert [op.side for op in cards.operations if op.kind == "side"] == ["alerts"]
    alerts_out = next(o for o in cards.outputs if getattr(o, "to_stage", None) == totals.index)
    assert (alerts_out.key_fields, alerts_out.broadcast_unkeyed, totals.queues) == ((), False, 1)
    assert totals.process.singleton and totals.process.key_field is None


class OnlyPayments(ProcessingElement):
    def on_payments(self, event: dict[str, Any]) -> None:
        pass


def _topology(tmp_path):
    t = Topology("s4")
    payments = t.source("payments", FileTopic(tmp_path / "p"), schema={"card": "string", "amount": "long"})
    limits = t.source("limits", FileTopic(tmp_path / "l"), schema={"limit": "long"})
    return t, payments, limits


def test_process_errors_name_the_problem(tmp_path):
    t, payments, limits = _topology(tmp_path)
    with pytest.raises(TopologyDefinitionError, match="no on_event or on_limits for the events of 'limits'"):
        t.process(OnlyPayments, streams={"payments": (payments, "card"), "limits": (limits, None)}, out="card")
    with pytest.raises(TopologyDefinitionError, match="at least one stream needs a key field"):
        t.process(CardPE, streams={"limits": (limits, None)}, out="card")
    with pytest.raises(TopologyDefinitionError, match=r"must be \(stream, key_field\)"):
        t.process(CardPE, streams={"payments": payments}, out="card")
    with pytest.raises(TopologyDefinitionError, match="unknown field 'crd'"):
        t.process(CardPE, streams={"payments": (payments, "crd")}, out="card")
    with pytest.raises(TopologyDefinitionError, match="max_instances must be a positive integer"):
        t.process(CardPE, streams={"payments": (payments, "card")}, out="card", max_instances=0)
    with pytest.raises(TopologyDefinitionError, match="timer_interval must be a positive number"):
        t.process(CardPE, streams={"payments": (payments, "card")}, out="card", timer_interval=-1)
    with pytest.raises(TopologyDefinitionError, match="singleton PE has one instance"):
        payments.process(AlertTotalPE, key="card", singleton=True, out="alerts")
    with pytest.raises(TopologyDefinitionError, match="name the key field"):
        payments.process(AlertTotalPE, out="alerts")
    with pytest.raises(TopologyDefinitionError, match="has no on_event"):
        payments.process(OnlyPayments, key="card", out="card")


def test_a_prototype_that_cannot_be_shipped_is_refused_at_definition(tmp_path):
    t, payments, _ = _topology(tmp_path)
    proto = CardPE(limit=3)
    proto.limits = {1, 2}  # a set is not JSON
    with pytest.raises(TopologyDefinitionError, match="limits"):
        payments.process(proto, key="card", out="card", trigger=Trigger.count(1))


def test_undeclared_named_outputs_must_be_read(tmp_path):
    t, payments, limits = _topology(tmp_path)
    t.process(
        CardPE,
        streams={"payments": (payments, "card"), "limits": (limits, None)},
        out={"card": "string"},
        outputs={"alerts": {"card": "string"}},
    ).to_parquet(tmp_path / "out", name="out")
    with pytest.raises(TopologyDefinitionError, match="alerts"):
        build_plan(t)
