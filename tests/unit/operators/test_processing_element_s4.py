"""S4 parity of processing elements: event-driven time triggers, on_time timers, prototypes,
singletons, the PE cache (max_instances), several input streams, named outputs, broadcast of
key-less records, and version-2 checkpoints (and reading version 1)."""

from __future__ import annotations

import inspect
import json
import logging
from typing import Any, ClassVar

import pytest
from counter_pe import CounterPE

import stream_ops.operators.processing_element as pe_module
from stream_ops.errors import StateError, TopologyDefinitionError, TopologyLoadError
from stream_ops.operators.processing_element import (
    PERuntime,
    ProcessingElement,
    Trigger,
    prototype_from_spec,
    prototype_spec,
)

CALLS: list[tuple[Any, ...]] = []


@pytest.fixture(autouse=True)
def _clear_calls():
    CALLS.clear()
    CounterPE.calls.clear()
    yield
    CALLS.clear()
    CounterPE.calls.clear()


class TickPE(ProcessingElement):
    """Counts events; says which callback emitted."""

    def on_create(self) -> None:
        self.count = 0

    def on_event(self, event: dict[str, Any]) -> None:
        self.count += 1

    def on_trigger(self, event: dict[str, Any] | None) -> None:
        self.emit(key=self.key, count=self.count, by="tick" if event is None else "event")

    def on_time(self) -> None:
        self.emit(key=self.key, count=self.count, timer=True)

    def on_remove(self) -> None:
        self.emit(key=self.key, final=self.count)


def _k(*keys: str) -> list[dict[str, Any]]:
    return [{"k": key} for key in keys]


# --- 1. event-driven time trigger ------------------------------------------------------------------


def test_time_trigger_on_event_fires_only_with_an_event_after_the_interval():
    runtime = PERuntime(TickPE, "k", Trigger.time(10))
    assert runtime.process(_k("a"), now=0.0) == []
    assert runtime.tick(now=100.0) == []  # ticks never fire it
    assert runtime.process(_k("a"), now=9.9) == []  # measured from creation (0), not from the tick
    assert runtime.process(_k("a"), now=10.0) == [{"key": "a", "count": 3, "by": "event"}]
    assert runtime.process(_k("a"), now=19.0) == []
    assert runtime.process(_k("a"), now=1000.0) == [{"key": "a", "count": 5, "by": "event"}]  # once ...
    assert runtime.process(_k("a"), now=1001.0) == []  # ... no catch-up


def test_time_trigger_on_event_combined_with_a_tick_trigger():
    runtime = PERuntime(TickPE, "k", Trigger.every(30) | Trigger.time(10))
    runtime.process(_k("a"), now=0.0)
    assert runtime.tick(now=15.0) == []  # 15 s passed, but only every(30) counts on ticks
    assert runtime.process(_k("a"), now=15.0) == [{"key": "a", "count": 2, "by": "event"}]
    assert runtime.tick(now=44.0) == []
    assert runtime.tick(now=45.0) == [{"key": "a", "count": 2, "by": "tick"}]  # 30 s after the firing at 15


def test_trigger_time_representation_combination_and_specs():
    assert Trigger.time(5, on_event=False) == Trigger.every(5)
    assert Trigger.time(5) == Trigger(seconds_on_event=5)
    combined = Trigger.time(10) | Trigger.every(30) | Trigger.time(4) | Trigger.count(7)
    assert combined == Trigger(every_events=7, every_seconds=30, seconds_on_event=4)
    assert Trigger.time(10).fires(0, 10.0) and not Trigger.time(10).fires(0, 9.0)
    assert not Trigger.time(10).fires(0, 10.0, tick=True)
    assert not Trigger.count(1).fires(5, 0.0, tick=True)
    assert Trigger.every(10).fires(0, 10.0, tick=True)
    spec = (Trigger.count(3) | Trigger.time(10)).to_spec()
    assert spec == {"every_events": 3, "every_seconds": None, "seconds_on_event": 10}
    assert Trigger.from_spec(json.loads(json.dumps(spec))) == Trigger.count(3) | Trigger.time(10)
    # seconds_on_event is written only when set
    assert Trigger.count(3).to_spec() == {"every_events": 3, "every_seconds": None}
    assert Trigger.from_spec({"every_events": 3, "every_seconds": 5}) == Trigger.count(3) | Trigger.every(5)
    with pytest.raises(TopologyLoadError, match="lacks every_seconds"):
        Trigger.from_spec({"every_events": 3})


# --- 2. on_time timer ----------------------------------------------------------------------------------


def test_on_time_fires_per_instance_from_tick_without_catch_up():
    runtime = PERuntime(TickPE, "k", timer_interval=10)
    runtime.process(_k("a"), now=0.0)
    runtime.process(_k("b"), now=5.0)
    assert runtime.tick(now=9.0) == []
    assert runtime.tick(now=10.0) == [{"key": "a", "count": 1, "timer": True}]
    assert runtime.tick(now=15.0) == [{"key": "b", "count": 1, "timer": True}]
    assert runtime.process(_k("a"), now=16.0) == []  # events neither fire nor reset the timer
    assert runtime.tick(now=19.9) == []
    assert runtime.tick(now=20.0) == [{"key": "a", "count": 2, "timer": True}]
    assert runtime.tick(now=1000.0) == [{"key": "a", "count": 2, "timer": True}, {"key": "b", "count": 1, "timer": True}]
    assert runtime.tick(now=1009.0) == []
    assert runtime.tick(now=1010.0) == [{"key": "a", "count": 2, "timer": True}, {"key": "b", "count": 1, "timer": True}]


def test_tick_order_is_trigger_then_timer_then_removal():
    runtime = PERuntime(TickPE, "k", Trigger.every(10), ttl_seconds=10, timer_interval=10)
    runtime.process(_k("a"), now=0.0)
    assert runtime.tick(now=10.0) == [
        {"key": "a", "count": 1, "by": "tick"},
        {"key": "a", "count": 1, "timer": True},
        {"key": "a", "final": 1},
    ]


class FailingTimerPE(TickPE):
    def on_time(self) -> None:
        self.emit(lost=True)
        self.emit(lost=True, stream="side")
        raise RuntimeError("boom")


def test_a_failing_on_time_is_a_dead_letter_and_its_emits_are_discarded():
    runtime = PERuntime(FailingTimerPE, "k", timer_interval=10)
    runtime.process(_k("a"), now=0.0)
    assert runtime.tick(now=10.0) == []
    assert runtime.take_side_outputs() == {}
    assert runtime.take_dead_letters() == [{"key": "a", "record": None, "error": "FailingTimerPE.on_time: RuntimeError: boom"}]
    assert runtime.tick(now=15.0) == []  # the failed call still counts as the last on_time
    assert runtime.take_dead_letters() == []


def test_on_time_defaults_to_doing_nothing():
    runtime = PERuntime(CounterPE, "user", timer_interval=1)
    runtime.process([{"user": "ann"}], now=0.0)
    assert runtime.tick(now=5.0) == [] and runtime.dead_letters == []


# --- 3. prototypes ---------------------------------------------------------------------------------------


class ThresholdPE(ProcessingElement):
    init_calls: ClassVar[int] = 0

    def __init__(self, threshold: int, labels: list[str] | None = None) -> None:
        super().__init__()
        ThresholdPE.init_calls += 1
        self.threshold = threshold
        self.labels = labels if labels is not None else []
        self._compiled = f"compiled-{threshold}"  # private: copied with the prototype, not shipped in a spec

    def on_create(self) -> None:
        self.count = 0
        self.labels.append(f"made-{self.key}")

    def on_event(self, event: dict[str, Any]) -> None:
        self.count += 1
        if self.count == self.threshold:
            self.emit(key=self.key, reached=self.threshold, labels=list(self.labels), compiled=getattr(self, "_compiled", None))


def test_instances_are_deep_copies_of_a_prototype():
    ThresholdPE.init_calls = 0
    prototype = ThresholdPE(2, ["x"])
    runtime = PERuntime(prototype, "k")
    assert runtime.pe_class is ThresholdPE
    out = runtime.process(_k("a", "b", "a", "b"), now=0.0)
    assert out == [
        {"key": "a", "reached": 2, "labels": ["x", "made-a"], "compiled": "compiled-2"},
        {"key": "b", "reached": 2, "labels": ["x", "made-b"], "compiled": "compiled-2"},
    ]
    assert prototype.labels == ["x"]  # copies, not shared
    assert ThresholdPE.init_calls == 1  # only the prototype itself was constructed
    prototype.threshold = 99  # the runtime holds its own copy
    assert runtime.process(_k("c", "c"), now=1.0) == [
        {"key": "c", "reached": 2, "labels": ["x", "made-c"], "compiled": "compiled-2"}
    ]


def test_prototype_spec_round_trip_skips_the_subclass_init():
    ThresholdPE.init_calls = 0
    spec = prototype_spec(ThresholdPE(3, ["x"]))
    assert spec == {"fields": {"threshold": 3, "labels": ["x"]}}
    rebuilt = prototype_from_spec(ThresholdPE, json.loads(json.dumps(spec)))
    assert ThresholdPE.init_calls == 1
    assert isinstance(rebuilt, ThresholdPE) and rebuilt.key is None
    assert (rebuilt.threshold, rebuilt.labels) == (3, ["x"]) and not hasattr(rebuilt, "_compiled")
    rebuilt.labels.append("y")
    assert spec["fields"]["labels"] == ["x"]  # the spec is not shared with the instance
    out = PERuntime(rebuilt, "k").process(_k("a", "a", "a"), now=0.0)
    assert out == [{"key": "a", "reached": 3, "labels": ["x", "y", "made-a"], "compiled": None}]


def test_restore_rebuilds_instances_from_the_prototype_then_applies_the_checkpoint():
    runtime = PERuntime(ThresholdPE(2, ["x"]), "k")
    runtime.process(_k("a"), now=0.0)
    checkpoint = json.loads(json.dumps(runtime.checkpoint()))
    assert checkpoint["instances"][0]["fields"] == {"threshold": 2, "labels": ["x", "made-a"], "count": 1}
    restored = PERuntime.restore(checkpoint, ThresholdPE(5), "k")
    # threshold and labels come from the checkpoint, the private field from the new prototype
    assert restored.process(_k("a"), now=1.0) == [{"key": "a", "reached": 2, "labels": ["x", "made-a"], "compiled": "compiled-5"}]
    assert restored.process(_k("b"), now=1.0) == []  # new keys: copies of the new prototype (threshold 5)
    assert restored.instance("b").threshold == 5


def test_bad_prototypes():
    with pytest.raises(TopologyDefinitionError, match="ThresholdPE prototype field 'labels' holds a set"):
        prototype_spec(ThresholdPE(1, {"x"}))  # type: ignore[arg-type]
    with pytest.raises(TopologyDefinitionError, match="ProcessingElement instance"):
        prototype_spec(ThresholdPE)  # type: ignore[arg-type]
    with pytest.raises(TopologyDefinitionError, match="'fields'"):
        prototype_from_spec(ThresholdPE, {"threshold": 1})
    with pytest.raises(TopologyDefinitionError, match="field name '_secret'"):
        prototype_from_spec(ThresholdPE, {"fields": {"_secret": 1}})
    with pytest.raises(TopologyDefinitionError, match="prototype field 'labels' holds a tuple"):
        prototype_from_spec(ThresholdPE, {"fields": {"labels": (1,)}})
    with pytest.raises(TopologyDefinitionError, match="ProcessingElement subclass"):
        prototype_from_spec(dict, {"fields": {}})  # type: ignore[arg-type]


# --- 4. singleton -------------------------------------------------------------------------------------


def test_a_singleton_gets_every_record_without_a_key():
    runtime = PERuntime(TickPE, None, Trigger.count(3), singleton=True)
    assert runtime.process([{"k": "a"}, {}, {"other": 1}], now=0.0) == [{"key": None, "count": 3, "by": "event"}]
    assert runtime.keys == (None,) and runtime.instance(None).count == 3
    assert runtime.dead_letters == []
    restored = PERuntime.restore(json.loads(json.dumps(runtime.checkpoint())), TickPE, None, Trigger.count(3), singleton=True)
    assert restored.process([{}, {}, {}], now=1.0) == [{"key": None, "count": 6, "by": "event"}]
    with pytest.raises(StateError, match="singleton"):
        PERuntime.restore(runtime.checkpoint(), TickPE, "k")


def test_a_singleton_with_several_streams():
    runtime = PERuntime(TickPE, {"a": None, "b": None}, singleton=True)
    runtime.process([{}], now=0.0, stream="a")
    runtime.process([{}], now=0.0, stream="b")
    runtime.process([{}], now=0.0, stream="c")
    assert runtime.instance(None).count == 2
    assert [d["error"] for d in runtime.take_dead_letters()] == [
        "record arrived on stream 'c', which this PE does not read (it reads ['a', 'b'])"
    ]


# --- 5. max_instances (S4's PE cache) ------------------------------------------------------------------


def test_max_instances_evicts_the_least_recently_used_first():
    runtime = PERuntime(TickPE, "k", max_instances=2)
    assert runtime.process(_k("a", "b", "a"), now=0.0) == []
    assert runtime.process(_k("c"), now=1.0) == [{"key": "b", "final": 1}]  # b: used least recently
    assert runtime.keys == ("a", "c")
    assert runtime.process(_k("b"), now=2.0) == [{"key": "a", "final": 2}]
    assert runtime.keys == ("c", "b") and runtime.instance("b").count == 1  # a fresh instance


def test_max_instances_with_ttl():
    runtime = PERuntime(TickPE, "k", ttl_seconds=10, max_instances=2)
    runtime.process(_k("a"), now=0.0)
    runtime.process(_k("b"), now=5.0)
    assert runtime.tick(now=10.0) == [{"key": "a", "final": 1}]
    assert runtime.process(_k("c"), now=11.0) == []  # room left by the TTL
    assert runtime.process(_k("d"), now=12.0) == [{"key": "b", "final": 1}]
    assert runtime.keys == ("c", "d")


def test_lru_order_survives_a_checkpoint():
    batches = [(_k("a", "b", "c"), 0.0), (_k("a"), 1.0), (_k("d"), 2.0), (_k("e"), 3.0), (_k("a", "f"), 4.0)]

    def run(runtime: PERuntime, part: list) -> list:
        return [record for records, now in part for record in runtime.process(records, now)]

    uninterrupted = run(PERuntime(TickPE, "k", max_instances=3), batches)
    assert uninterrupted == [{"key": "b", "final": 1}, {"key": "c", "final": 1}, {"key": "d", "final": 1}]
    first = PERuntime(TickPE, "k", max_instances=3)
    before = run(first, batches[:2])
    checkpoint = json.loads(json.dumps(first.checkpoint()))
    assert [(i["key"], i["last_use"]) for i in checkpoint["instances"]] == [("a", 2), ("b", 0), ("c", 1)]
    restored = PERuntime.restore(checkpoint, TickPE, "k", max_instances=3)
    assert before + run(restored, batches[2:]) == uninterrupted
    # restored with a smaller cache: the next creation evicts down to the limit, least recent first
    small = PERuntime.restore(checkpoint, TickPE, "k", max_instances=1)
    assert small.process(_k("z"), now=5.0) == [{"key": "b", "final": 1}, {"key": "c", "final": 1}, {"key": "a", "final": 2}]


# --- 6. several input streams -------------------------------------------------------------------------


class RouterPE(ProcessingElement):
    def on_create(self) -> None:
        self.n = 0

    def on_words(self, event: dict[str, Any]) -> None:
        CALLS.append(("on_words", self.key, event["w"]))
        self.n += 1

    def on_event(self, event: dict[str, Any], stream: str | None) -> None:  # type: ignore[override]
        CALLS.append(("on_event", self.key, stream))
        self.n += 1

    def on_trigger(self, event: dict[str, Any] | None) -> None:
        self.emit(key=self.key, n=self.n)

    def on_time(self) -> None:
        CALLS.append(("on_time", self.key))


class PlainPE(ProcessingElement):
    def on_event(self, event: dict[str, Any]) -> None:
        CALLS.append(("plain", self.key, event.get("x")))


def test_per_stream_dispatch_and_triggers_count_every_stream():
    runtime = PERuntime(RouterPE, {"words": "w", "counts": "c", "time": "c"}, Trigger.count(2))
    assert runtime.streams == ("words", "counts", "time")
    assert runtime.process([{"w": "hi"}], now=0.0, stream="words") == []
    assert runtime.process([{"c": "hi"}], now=0.0, stream="counts") == [{"key": "hi", "n": 2}]
    runtime.process([{"c": "hi"}], now=0.0, stream="time")  # a lifecycle name: on_event, not on_time
    assert CALLS == [("on_words", "hi", "hi"), ("on_event", "hi", "counts"), ("on_event", "hi", "time")]


def test_a_single_key_field_accepts_any_stream_name():
    runtime = PERuntime(RouterPE, "w")
    runtime.process([{"w": "a"}], now=0.0, stream="words")
    runtime.process([{"w": "a"}], now=0.0, stream="other")
    runtime.process([{"w": "a"}], now=0.0)
    assert CALLS == [("on_words", "a", "a"), ("on_event", "a", "other"), ("on_event", "a", None)]
    plain = PERuntime(PlainPE, "x")
    plain.process([{"x": 1}], now=0.0, stream="words")
    assert CALLS[-1] == ("plain", 1, 1)


def test_records_of_an_unknown_stream_are_dead_letters():
    runtime = PERuntime(RouterPE, {"words": "w"})
    assert runtime.process([{"w": "a"}], now=0.0, stream="other") == []
    assert runtime.process([{"w": "a"}], now=0.0) == []
    letters = runtime.take_dead_letters()
    assert [(d["key"], d["record"]) for d in letters] == [(None, {"w": "a"}), (None, {"w": "a"})]
    assert letters[0]["error"] == "record arrived on stream 'other', which this PE does not read (it reads ['words'])"
    assert "stream None" in letters[1]["error"]
    assert len(runtime) == 0 and CALLS == []


def test_on_event_arity_is_inspected_once_per_runtime(monkeypatch):
    calls = []
    real = inspect.signature

    def counting(obj: Any, *args: Any, **kwargs: Any) -> inspect.Signature:
        calls.append(obj)
        return real(obj, *args, **kwargs)

    monkeypatch.setattr(pe_module.inspect, "signature", counting)
    runtime = PERuntime(RouterPE, {"words": "w", "counts": "c"})
    for now in range(3):
        runtime.process([{"w": "a"}], now=float(now), stream="words")
        runtime.process([{"c": "a"}, {"c": "b"}], now=float(now), stream="counts")
    assert len(calls) == 1


# --- 7. named output streams -----------------------------------------------------------------------


class SplitPE(ProcessingElement):
    def on_event(self, event: dict[str, Any]) -> None:
        self.emit(key=self.key, v=event["v"])
        if event["v"] < 0:  # a field named "stream" goes in the mapping
            self.emit({"key": self.key, "v": event["v"], "stream": "raw"}, stream="alerts")
        if event["v"] == 0:
            self.emit(x=1, stream="audit")
            raise ValueError("zero")
        if event["v"] == 99:
            self.emit(x=1, stream="")

    def on_remove(self) -> None:
        self.emit(key=self.key, stream="removed")


def test_named_outputs_are_kept_apart_and_taken_separately():
    runtime = PERuntime(SplitPE, "k", ttl_seconds=10)
    out = runtime.process(
        [{"k": "a", "v": 1}, {"k": "a", "v": -2}, {"k": "b", "v": 0}, {"k": "b", "v": -3}, {"k": "b", "v": 99}], now=0.0
    )
    assert out == [{"key": "a", "v": 1}, {"key": "a", "v": -2}, {"key": "b", "v": -3}]
    assert runtime.take_side_outputs() == {
        "alerts": [{"key": "a", "v": -2, "stream": "raw"}, {"key": "b", "v": -3, "stream": "raw"}]
    }
    assert runtime.take_side_outputs() == {}
    assert [d["error"] for d in runtime.take_dead_letters()] == [
        "SplitPE.on_event: ValueError: zero",  # its default and "audit" emits are both discarded
        "SplitPE.on_event: TopologyDefinitionError: emit(stream=...) needs a non-empty stream name, got ''",
    ]
    assert runtime.tick(now=10.0) == []
    assert runtime.take_side_outputs() == {"removed": [{"key": "a"}, {"key": "b"}]}


# --- 8. broadcast of key-less records -----------------------------------------------------------------


def test_a_key_less_stream_reaches_every_live_instance_in_creation_order():
    runtime = PERuntime(RouterPE, {"words": "w", "control": None})
    runtime.process([{"w": "a"}, {"w": "b"}, {"w": "a"}], now=0.0, stream="words")
    CALLS.clear()
    runtime.process([{"cmd": 1}], now=1.0, stream="control")
    assert CALLS == [("on_event", "a", "control"), ("on_event", "b", "control")]
    assert runtime.keys == ("a", "b")


def test_a_key_less_record_with_no_live_instance_is_dropped(caplog):
    runtime = PERuntime(TickPE, "k")
    with caplog.at_level(logging.DEBUG, logger=pe_module.__name__):
        assert runtime.process([{"x": 1}, {"k": None}], now=0.0) == []
    assert len(runtime) == 0 and runtime.dead_letters == []
    assert sum("dropped a key-less record" in r.getMessage() for r in caplog.records) == 2


def test_a_broadcast_neither_postpones_the_ttl_nor_makes_an_instance_recent():
    runtime = PERuntime(TickPE, "k", ttl_seconds=10)
    runtime.process(_k("a"), now=0.0)
    runtime.process(_k("b"), now=5.0)
    # at 12, a has been idle for 12 s: removed instead of receiving the broadcast; b gets it
    assert runtime.process([{}], now=12.0) == [{"key": "a", "final": 1}]
    assert runtime.instance("b").count == 2
    assert runtime.tick(now=15.0) == [{"key": "b", "final": 2}]  # idle since 5 despite the broadcast

    cache = PERuntime(TickPE, "k", max_instances=2)
    cache.process(_k("a", "b"), now=0.0)
    cache.process([{}], now=1.0)
    assert cache.process(_k("c"), now=2.0) == [{"key": "a", "final": 2}]


# --- checkpoints: a mid-stream round trip with every feature, version 1 --------------------------------


class FullPE(ProcessingElement):
    def __init__(self, tag: str) -> None:
        super().__init__()
        self.tag = tag

    def on_create(self) -> None:
        self.n = 0
        self.seen: list[Any] = []

    def on_clicks(self, event: dict[str, Any]) -> None:
        if event["i"] < 0:
            raise ValueError("negative click")
        self.n += 1
        self.seen.append(event["i"])

    def on_event(self, event: dict[str, Any], stream: str | None) -> None:  # type: ignore[override]
        self.seen.append(f"{stream}:{event['i']}")

    def on_trigger(self, event: dict[str, Any] | None) -> None:
        self.emit(key=self.key, tag=self.tag, n=self.n, seen=list(self.seen), on="tick" if event is None else "event")

    def on_time(self) -> None:
        self.emit(key=self.key, n=self.n, stream="timer")

    def on_remove(self) -> None:
        self.emit(key=self.key, n=self.n, stream="removed")


FULL_BATCHES: list[tuple[str, list[dict[str, Any]], float]] = [
    ("clicks", [{"user": "ann", "i": 0}, {"user": "bob", "i": 1}, {"user": "ann", "i": 2}], 0.0),
    ("control", [{"i": 3}], 2.0),
    ("clicks", [{"user": "ann", "i": 4}, {"user": "cid", "i": 5}, {"user": "bob", "i": -1}], 5.0),
    ("clicks", [{"user": "bob", "i": 6}], 8.0),
    ("control", [{"i": 7}], 13.0),
    ("clicks", [{"user": "dan", "i": 8}, {"user": "ann", "i": 9}, {"user": None, "i": 10}], 21.0),
    ("nope", [{"user": "ann", "i": 11}], 22.0),
    ("clicks", [{"user": "cid", "i": 12}], 41.0),
    ("control", [{"i": 13}], 70.0),
    ("clicks", [{"user": "eve", "i": 14}, {"user": "eve", "i": 15}, {"user": "eve", "i": 16}], 71.0),
]


def _full_runtime(checkpoint: dict[str, Any] | None = None) -> PERuntime:
    args: tuple[Any, ...] = (
        FullPE("p"),
        {"control": None, "clicks": "user"},
        Trigger.count(3) | Trigger.time(7) | Trigger.every(20),
    )
    options: dict[str, Any] = {"ttl_seconds": 25, "timer_interval": 6, "max_instances": 2}
    if checkpoint is None:
        return PERuntime(*args, **options)
    return PERuntime.restore(checkpoint, *args, **options)


def _run_full(runtime: PERuntime, batches: list) -> list:
    log = []
    for stream, records, now in batches:
        log.append(("process", runtime.process(records, now, stream=stream)))
        log.append(("tick", runtime.tick(now)))
        log.append(("side", runtime.take_side_outputs()))
        log.append(("dead", runtime.take_dead_letters()))
    return log


@pytest.mark.parametrize("split", range(1, len(FULL_BATCHES)))
def test_a_mid_stream_checkpoint_changes_nothing(split):
    uninterrupted = _run_full(_full_runtime(), FULL_BATCHES)
    first = _full_runtime()
    before = _run_full(first, FULL_BATCHES[:split])
    checkpoint = json.loads(json.dumps(first.checkpoint()))
    assert checkpoint["version"] == 2
    assert checkpoint["key_field"] == {"clicks": "user", "control": None}
    restored = _full_runtime(checkpoint)
    assert restored.checkpoint() == checkpoint
    assert before + _run_full(restored, FULL_BATCHES[split:]) == uninterrupted


def test_the_full_run_exercises_every_feature():
    """Hand-derived: count(3) | time(7) on events | every(20) on ticks, TTL 25, timer 6, cache of 2."""
    log = _run_full(_full_runtime(), FULL_BATCHES)
    by_batch = [log[i : i + 4] for i in range(0, len(log), 4)]
    non_empty = [[entry for entry in batch if entry[1]] for batch in by_batch]

    def fired(key: str, n: int, seen: list, on: str) -> dict[str, Any]:
        return {"key": key, "tag": "p", "n": n, "seen": seen, "on": on}

    assert non_empty == [
        [],  # @0: ann, bob created; ann has 2 events
        # @2: the broadcast is ann's 3rd event (count fires; n counts clicks only); bob's 2nd
        [("process", [fired("ann", 2, [0, 2, "control:3"], "event")])],
        # @5: cid evicts bob (least recent), then bob evicts ann; bob's failing click is a dead letter
        [
            ("side", {"removed": [{"key": "bob", "n": 1}, {"key": "ann", "n": 3}]}),
            (
                "dead",
                [{"key": "bob", "record": {"user": "bob", "i": -1}, "error": "FullPE.on_clicks: ValueError: negative click"}],
            ),
        ],
        [],  # @8: bob's click; no timer yet (created at 5)
        # @13: the broadcast comes 8 s after creation: time(7) fires for cid and bob; then their timers
        [
            ("process", [fired("cid", 1, [5, "control:7"], "event"), fired("bob", 1, [6, "control:7"], "event")]),
            ("side", {"timer": [{"key": "cid", "n": 1}, {"key": "bob", "n": 1}]}),
        ],
        # @21: dan evicts cid, ann evicts bob; the key-less click reaches dan and ann through on_clicks
        [("side", {"removed": [{"key": "cid", "n": 1}, {"key": "bob", "n": 1}]})],
        [
            (
                "dead",
                [
                    {
                        "key": None,
                        "record": {"user": "ann", "i": 11},
                        "error": "record arrived on stream 'nope', which this PE does not read (it reads ['control', 'clicks'])",
                    }
                ],
            )
        ],
        # @41: cid evicts dan (the broadcast did not make dan recent); ann: every(20) fires on the tick, then its timer
        [
            ("tick", [fired("ann", 2, [9, 10], "tick")]),
            ("side", {"removed": [{"key": "dan", "n": 2}], "timer": [{"key": "ann", "n": 2}]}),
        ],
        # @70: both instances are idle for 25 s or more: removed instead of receiving the broadcast
        [("side", {"removed": [{"key": "ann", "n": 2}, {"key": "cid", "n": 1}]})],
        [("process", [fired("eve", 3, [14, 15, 16], "event")])],
    ]


def test_restore_reads_version_1_checkpoints():
    v1 = {
        "version": 1,
        "pe_class": "counter_pe:CounterPE",
        "key_field": "user",
        "instances": [
            {
                "key": "ann",
                "fields": {"count": 2, "seen": [0, 1]},
                "events_since_trigger": 2,
                "last_trigger": 0.0,
                "last_event": 5.0,
            },
            {
                "key": "bob",
                "fields": {"count": 1, "seen": [2]},
                "events_since_trigger": 1,
                "last_trigger": 3.0,
                "last_event": 3.0,
            },
        ],
    }
    restored = PERuntime.restore(v1, CounterPE, "user", Trigger.count(3), timer_interval=10, max_instances=2)
    assert restored.keys == ("ann", "bob")
    instances = restored.checkpoint()["instances"]
    # defaults: the timer restarts from the last trigger; recency follows the last events
    assert [(i["key"], i["last_time"], i["last_use"]) for i in instances] == [("ann", 0.0, 1), ("bob", 3.0, 0)]
    assert restored.process([{"user": "ann", "n": 3}], now=6.0) == [{"key": "ann", "count": 3}]
    assert restored.process([{"user": "cid", "n": 4}], now=7.0) == [{"key": "bob", "count": 1, "final": True}]


def test_restore_compares_key_field_mappings_in_canonical_form():
    runtime = PERuntime(RouterPE, {"words": "w", "control": None})
    runtime.process([{"w": "a"}], now=0.0, stream="words")
    checkpoint = runtime.checkpoint()
    assert list(checkpoint["key_field"]) == ["control", "words"]
    assert PERuntime.restore(checkpoint, RouterPE, {"control": None, "words": "w"}).keys == ("a",)
    with pytest.raises(StateError, match="keyed by"):
        PERuntime.restore(checkpoint, RouterPE, {"words": "w"})
    with pytest.raises(StateError, match="keyed by"):
        PERuntime.restore(checkpoint, RouterPE, "w")


# --- bad definitions -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Trigger.time(0), r"Trigger.time\(seconds, on_event=True\) needs a positive number"),
        (lambda: Trigger(seconds_on_event=float("inf")), "Trigger.time"),
        (lambda: Trigger.time(5, on_event="yes"), "on_event"),
        (lambda: Trigger(), "Trigger.time"),
        (lambda: PERuntime(TickPE, "k", timer_interval=0), "timer_interval"),
        (lambda: PERuntime(TickPE, "k", timer_interval=float("nan")), "timer_interval"),
        (lambda: PERuntime(TickPE, "k", timer_interval=True), "timer_interval"),
        (lambda: PERuntime(TickPE, "k", max_instances=0), "max_instances"),
        (lambda: PERuntime(TickPE, "k", max_instances=1.5), "max_instances"),
        (lambda: PERuntime(TickPE, "k", max_instances=True), "max_instances"),
        (lambda: PERuntime(TickPE, "k", singleton=True), "pass key_field=None"),
        (lambda: PERuntime(TickPE, None), "singleton=True"),
        (lambda: PERuntime(TickPE, None, singleton=1), "singleton must be True or False"),
        (lambda: PERuntime(TickPE, {}), "mapping is empty"),
        (lambda: PERuntime(TickPE, {"": "k"}), "stream name ''"),
        (lambda: PERuntime(TickPE, {"a": 3}), "stream 'a' must be a field name or None"),
        (lambda: PERuntime(TickPE, {"a": None, "b": None}), "every stream is key-less"),
        (lambda: PERuntime(TickPE, {"a": "k"}, singleton=True), "stream 'a' must map to None"),
        (lambda: PERuntime(object(), "k"), "ProcessingElement subclass or instance"),
    ],
)
def test_bad_definitions(build, message):
    with pytest.raises(TopologyDefinitionError, match=message):
        build()
