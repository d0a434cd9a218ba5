"""S4 processing elements: per-key lifecycle, triggers, TTL, checkpoints and bad input."""

from __future__ import annotations

import doctest
import json
from typing import Any

import pytest
from counter_pe import CounterPE

import stream_ops.operators.join_bolt as join_bolt_module
import stream_ops.operators.processing_element as pe_module
from stream_ops.errors import StateError, TopologyDefinitionError
from stream_ops.operators import PERuntime, ProcessingElement, Trigger


@pytest.fixture(autouse=True)
def _clear_calls():
    CounterPE.calls.clear()
    yield
    CounterPE.calls.clear()


def _events(*keys: str, start: int = 0) -> list[dict[str, Any]]:
    return [{"user": key, "n": start + i} for i, key in enumerate(keys)]


# --- lifecycle ---------------------------------------------------------------------------


def test_one_instance_per_key_created_once_and_events_in_order():
    runtime = PERuntime(CounterPE, key_field="user")
    assert runtime.process(_events("ann", "bob", "ann"), now=0.0) == []
    assert runtime.process(_events("ann", start=3), now=1.0) == []
    assert runtime.keys == ("ann", "bob")
    assert len(runtime) == 2
    assert CounterPE.calls == [
        ("on_create", "ann"),
        ("on_event", "ann"),
        ("on_create", "bob"),
        ("on_event", "bob"),
        ("on_event", "ann"),
        ("on_event", "ann"),
    ]
    ann = runtime.instance("ann")
    assert isinstance(ann, CounterPE) and ann.key == "ann"
    assert ann.count == 3 and ann.seen == [0, 2, 3]
    assert runtime.instance("nobody") is None


def test_count_trigger_fires_after_every_n_events_per_key():
    runtime = PERuntime(CounterPE, key_field="user", trigger=Trigger.count(2))
    out = runtime.process(_events("ann", "bob", "ann", "ann", "bob", "ann"), now=0.0)
    assert out == [
        {"key": "ann", "count": 2},
        {"key": "bob", "count": 2},
        {"key": "ann", "count": 4},
    ]
    assert all(type(record) is dict for record in out)
    # on_trigger runs right after the on_event that fired it
    assert CounterPE.calls[4:6] == [("on_event", "ann"), ("on_trigger", "ann")]
    assert runtime.tick(now=1e9) == []  # count triggers never fire on ticks


def test_time_trigger_fires_on_tick_and_on_events():
    runtime = PERuntime(CounterPE, key_field="user", trigger=Trigger.every(10))
    runtime.process(_events("ann", "ann"), now=0.0)
    assert runtime.tick(now=9.9) == []
    assert runtime.tick(now=10.0) == [{"key": "ann", "count": 2}]
    assert runtime.tick(now=15.0) == []
    runtime.process(_events("ann"), now=16.0)  # measured from the last firing (10), not the last event
    assert runtime.tick(now=19.9) == []
    assert runtime.tick(now=20.0) == [{"key": "ann", "count": 3}]
    assert runtime.tick(now=20_000.0) == [{"key": "ann", "count": 3}]  # a long gap fires once ...
    assert runtime.tick(now=20_001.0) == []  # ... and does not catch up
    # an event arriving when the interval has passed fires with that event
    assert runtime.process(_events("ann"), now=20_010.0) == [{"key": "ann", "count": 4}]
    assert CounterPE.calls[-2:] == [("on_event", "ann"), ("on_trigger", "ann")]


def test_triggers_combine_with_or_and_a_firing_resets_both():
    trigger = Trigger.count(3) | Trigger.every(10)
    assert trigger == Trigger(every_events=3, every_seconds=10)
    assert Trigger.count(5) | Trigger.count(3) == Trigger.count(3)
    assert Trigger.from_spec(json.loads(json.dumps(trigger.to_spec()))) == trigger
    runtime = PERuntime(CounterPE, key_field="user", trigger=trigger)
    assert runtime.process(_events("ann", "ann"), now=0.0) == []
    assert runtime.tick(now=10.0) == [{"key": "ann", "count": 2}]  # time fires; the event count resets
    assert runtime.process(_events("ann", "ann"), now=11.0) == []
    assert runtime.process(_events("ann"), now=12.0) == [{"key": "ann", "count": 5}]
    assert runtime.tick(now=21.0) == []  # the count firing at 12 reset the time too
    assert runtime.tick(now=22.0) == [{"key": "ann", "count": 5}]


def test_ttl_removes_idle_instances_with_on_remove():
    runtime = PERuntime(CounterPE, key_field="user", trigger=Trigger.count(100), ttl_seconds=30)
    runtime.process(_events("ann"), now=0.0)
    runtime.process(_events("bob"), now=20.0)
    assert runtime.tick(now=29.0) == []
    assert runtime.tick(now=30.0) == [{"key": "ann", "count": 1, "final": True}]
    assert runtime.keys == ("bob",)
    assert runtime.tick(now=50.0) == [{"key": "bob", "count": 1, "final": True}]
    assert runtime.keys == ()
    # a key that comes back gets a fresh instance: on_create again, counting from zero
    runtime.process(_events("ann"), now=60.0)
    assert runtime.instance("ann").count == 1
    assert [c for c in CounterPE.calls if c[0] in ("on_create", "on_remove")] == [
        ("on_create", "ann"),
        ("on_create", "bob"),
        ("on_remove", "ann"),
        ("on_remove", "bob"),
        ("on_create", "ann"),
    ]


def test_an_event_for_an_expired_key_replaces_the_instance_without_a_tick():
    runtime = PERuntime(CounterPE, key_field="user", ttl_seconds=30)
    runtime.process(_events("ann", "ann"), now=0.0)
    assert runtime.process(_events("ann"), now=29.0) == []  # still alive: activity at 29
    assert runtime.process(_events("ann"), now=59.0) == [{"key": "ann", "count": 3, "final": True}]
    assert runtime.instance("ann").count == 1


def test_time_trigger_fires_before_ttl_removal_in_the_same_tick():
    runtime = PERuntime(CounterPE, key_field="user", trigger=Trigger.every(30), ttl_seconds=30)
    runtime.process(_events("ann"), now=0.0)
    assert runtime.tick(now=30.0) == [{"key": "ann", "count": 1}, {"key": "ann", "count": 1, "final": True}]


# --- checkpoints -------------------------------------------------------------------------


def _run(runtime: PERuntime, batches) -> list:
    out = []
    for records, now in batches:
        out.extend(runtime.process(records, now))
        out.extend(runtime.tick(now))
    return out


def test_checkpoint_restore_skips_on_create_and_continues_counting_exactly():
    trigger = Trigger.count(4) | Trigger.every(25)
    batches = [
        (_events("ann", "bob", "ann"), 0.0),
        (_events("ann", "ann", "bob", start=3), 10.0),
        (_events("bob", start=5), 20.0),
        # --- checkpoint here ---
        (_events("ann", "bob", "bob", "ann", start=6), 30.0),
        (_events("ann", start=10), 40.0),
        ([], 60.0),
        (_events("cid", "ann", start=11), 70.0),
    ]
    uninterrupted = _run(PERuntime(CounterPE, "user", trigger, ttl_seconds=100), batches)

    first = PERuntime(CounterPE, "user", trigger, ttl_seconds=100)
    before = _run(first, batches[:3])
    checkpoint = json.loads(json.dumps(first.checkpoint()))  # JSON-able, and survives a round trip
    CounterPE.calls.clear()
    restored = PERuntime.restore(checkpoint, CounterPE, "user", trigger, ttl_seconds=100)
    assert CounterPE.calls == [("on_restore", "ann"), ("on_restore", "bob")]
    assert restored.keys == ("ann", "bob")
    after = _run(restored, batches[3:])

    assert before + after == uninterrupted
    assert ("on_create", "ann") not in CounterPE.calls and ("on_create", "bob") not in CounterPE.calls
    assert ("on_create", "cid") in CounterPE.calls  # new keys are still created normally
    assert restored.instance("ann").seen == [0, 2, 3, 4, 6, 9, 10, 12]
    again = PERuntime.restore(restored.checkpoint(), CounterPE, "user", trigger, ttl_seconds=100)
    assert again.checkpoint() == restored.checkpoint()


def test_checkpoint_holds_public_fields_and_trigger_bookkeeping():
    runtime = PERuntime(CounterPE, key_field="user", trigger=Trigger.count(10))
    runtime.process(_events("ann", "ann"), now=5.0)
    runtime.instance("ann")._scratch = object()  # private: not checkpointed
    checkpoint = runtime.checkpoint()
    assert checkpoint["pe_class"] == "counter_pe:CounterPE"
    assert checkpoint["key_field"] == "user"
    assert checkpoint["instances"] == [
        {
            "key": "ann",
            "fields": {"count": 2, "seen": [0, 1]},
            "events_since_trigger": 2,
            "last_trigger": 5.0,
            "last_event": 5.0,
            "last_time": 5.0,
            "last_use": 0,
        }
    ]
    assert checkpoint["version"] == 2 and checkpoint["singleton"] is False
    # the checkpoint is a copy: later changes do not leak into it
    runtime.instance("ann").seen.append(99)
    assert checkpoint["instances"][0]["fields"]["seen"] == [0, 1]


class SetPE(ProcessingElement):
    def on_create(self) -> None:
        self.users: Any = set()

    def on_event(self, event: dict[str, Any]) -> None:
        self.users.add(event["user"])


def test_checkpoint_refuses_fields_that_are_not_json():
    runtime = PERuntime(SetPE, key_field="user")
    runtime.process([{"user": "ann"}], now=0.0)
    with pytest.raises(StateError, match="field 'users' of key 'ann' holds a set"):
        runtime.checkpoint()
    runtime.instance("ann").users = {1: "int key"}
    with pytest.raises(StateError, match="non-string key 1"):
        runtime.checkpoint()
    runtime.instance("ann").users = (1, 2)
    with pytest.raises(StateError, match="holds a tuple"):
        runtime.checkpoint()


def test_restore_refuses_another_class_key_field_or_garbage():
    runtime = PERuntime(CounterPE, key_field="user")
    runtime.process(_events("ann"), now=0.0)
    checkpoint = runtime.checkpoint()
    with pytest.raises(StateError, match="taken for counter_pe:CounterPE keyed by 'user'"):
        PERuntime.restore(checkpoint, SetPE, "user")
    with pytest.raises(StateError, match="keyed by 'user', not .* keyed by 'account'"):
        PERuntime.restore(checkpoint, CounterPE, "account")
    with pytest.raises(StateError, match="malformed PE checkpoint"):
        PERuntime.restore({**checkpoint, "instances": [{"key": "ann"}]}, CounterPE, "user")
    with pytest.raises(StateError, match="version"):
        PERuntime.restore({**checkpoint, "version": 99}, CounterPE, "user")


# --- bad input and bad definitions -------------------------------------------------------------


class FussyPE(ProcessingElement):
    def on_create(self) -> None:
        self.total = 0

    def on_event(self, event: dict[str, Any]) -> None:
        self.emit(seen=event["v"])
        if event["v"] < 0:
            raise ValueError("negative value")
        self.total += event["v"]

    def on_trigger(self, event: dict[str, Any] | None) -> None:
        self.emit(key=self.key, total=self.total)


def test_bad_records_become_dead_letters_and_processing_continues():
    runtime = PERuntime(FussyPE, key_field="k", trigger=Trigger.count(2))
    out = runtime.process(
        # {"v": 5} has no key and no instance is alive yet: broadcast to nobody, dropped
        [{"v": 5}, {"k": "a", "v": 1}, {"k": ["x"], "v": 5}, {"k": "a", "v": -1}, {"k": "a", "v": 2}, "junk"],
        now=0.0,
    )
    # the failing event's emits are discarded and it does not count towards the trigger
    assert out == [{"seen": 1}, {"seen": 2}, {"key": "a", "total": 3}]
    letters = runtime.take_dead_letters()
    assert [(d["key"], d["record"]) for d in letters] == [
        (["x"], {"k": ["x"], "v": 5}),
        ("a", {"k": "a", "v": -1}),
        (None, "junk"),
    ]
    assert "no usable key field 'k' (got ['x']" in letters[0]["error"]
    assert letters[1]["error"] == "FussyPE.on_event: ValueError: negative value"
    assert "not a mapping" in letters[2]["error"]
    assert runtime.take_dead_letters() == []


def test_a_record_without_a_key_is_broadcast_to_live_instances_not_a_dead_letter():
    runtime = PERuntime(FussyPE, key_field="k", trigger=Trigger.count(2))
    runtime.process([{"k": "a", "v": 1}, {"k": "b", "v": 10}], now=0.0)
    # reaches a then b (creation order); it is each one's second event, so count(2) fires for both
    out = runtime.process([{"v": 5}, {"k": None, "v": 1}], now=1.0)
    assert out == [
        {"seen": 5},
        {"key": "a", "total": 6},
        {"seen": 5},
        {"key": "b", "total": 15},
        {"seen": 1},
        {"seen": 1},
    ]
    assert runtime.keys == ("a", "b") and runtime.take_dead_letters() == []


def test_emit_accepts_a_mapping_and_keywords():
    pe = CounterPE()
    pe.emit({"a": 1, "b": 2}, b=3)
    pe.emit(c=4)
    assert pe._take_emitted() == [{"a": 1, "b": 3}, {"c": 4}]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Trigger.count(0), "positive integer"),
        (lambda: Trigger.count(1.5), "positive integer"),
        (lambda: Trigger.every(0), "positive number"),
        (lambda: Trigger(), "needs Trigger.count"),
        (lambda: PERuntime(dict, "k"), "ProcessingElement subclass"),
        (lambda: PERuntime(CounterPE, ""), "key_field"),
        (lambda: PERuntime(CounterPE, "k", trigger=3), "must be a Trigger"),
        (lambda: PERuntime(CounterPE, "k", ttl_seconds=0), "ttl_seconds"),
    ],
)
def test_bad_definitions(build, message):
    with pytest.raises(TopologyDefinitionError, match=message):
        build()


# --- documentation examples run -----------------------------------------------------------------


@pytest.mark.parametrize("module", [pe_module, join_bolt_module])
def test_docstring_examples(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0
