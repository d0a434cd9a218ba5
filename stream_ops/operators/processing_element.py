"""S4's processing elements: one instance per key, event and trigger callbacks, as a pure core.

A :class:`ProcessingElement` subclass holds the state of one key. :class:`PERuntime` routes
records to the instance of their key, creating it on first use, fires triggers, expires idle
instances and checkpoints everything as JSON. Nothing here reads a clock: ``now`` (processing
time in seconds) is passed in by the caller.

Lifecycle of an instance (S4's ``org.apache.s4.core.ProcessingElement``):

* ``on_create()``: once, when the first record of a key arrives. Initialise per-key fields
  here, not in ``__init__`` (as in S4, where instances are clones of a prototype).
* ``on_event(event)``: for every record of the key, in arrival order.
* ``on_trigger(event)``: after ``on_event`` when the :class:`Trigger` fires on that event, or
  from :meth:`PERuntime.tick` for a time trigger, then with ``event=None``.
* ``on_remove()``: before an instance is dropped because it was idle (no record) for
  ``ttl_seconds``. S4 keeps instances forever unless a PE cache with expiry is configured;
  here ``ttl_seconds=None`` keeps them forever too.
* ``on_restore()`` (not in S4): after an instance is rebuilt from a checkpoint, instead of
  ``on_create``. Use it to rebuild private (``_``-prefixed) fields, which are not checkpointed.

``self.emit(record)`` / ``self.emit(field=value, ...)`` collects an output record (a dict);
:meth:`PERuntime.process` and :meth:`PERuntime.tick` return what was emitted.

Triggers: ``Trigger.count(n)`` fires after every ``n`` events of the key;
``Trigger.every(seconds)`` fires when ``seconds`` of processing time have passed since the
last firing (or since the instance was created), checked on each event and on ``tick(now)``;
a long gap fires once, it does not catch up. ``a | b`` fires when either fires, and a firing
resets both (the event count and the time). S4 checks the time since the *last event*
instead, so a busy key there never fires on time alone.

Checkpoints: per key, the instance's public fields (``vars()`` without names starting with
``_``, which are framework internals or private fields) and the trigger bookkeeping. Public
fields must be JSON values (``None``, bool, int, float, str, list, dict with str keys); a
tuple or set is refused rather than silently coming back as a list.

Bad input never stops a task: a record without a usable key, or whose ``on_event`` /
``on_trigger`` raises, is set aside in :attr:`PERuntime.dead_letters` (drain them with
:meth:`PERuntime.take_dead_letters`); output emitted by the failing call is discarded. State
the failing call changed before raising is kept, as in S4, which logs and carries on.

Example, S4's counter: count events per key, emit the count every 3 events or every 60 s:

    >>> class CounterPE(ProcessingElement):
    ...     def on_create(self) -> None:
    ...         self.count = 0
    ...
    ...     def on_event(self, event) -> None:
    ...         self.count += 1
    ...
    ...     def on_trigger(self, event) -> None:
    ...         self.emit(key=self.key, count=self.count)
    ...
    ...     def on_remove(self) -> None:
    ...         self.emit(key=self.key, count=self.count, final=True)
    >>> runtime = PERuntime(CounterPE, key_field="user", trigger=Trigger.count(3) | Trigger.every(60))
    >>> runtime.process([{"user": "ann"}, {"user": "bob"}, {"user": "ann"}, {"user": "ann"}], now=0.0)
    [{'key': 'ann', 'count': 3}]
    >>> runtime.tick(now=60.0)
    [{'key': 'ann', 'count': 3}, {'key': 'bob', 'count': 1}]
    >>> restored = PERuntime.restore(runtime.checkpoint(), CounterPE, "user", Trigger.count(3) | Trigger.every(60))
    >>> restored.process([{"user": "bob"}] * 3, now=61.0)
    [{'key': 'bob', 'count': 4}]
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from stream_ops.errors import StateError, TopologyDefinitionError
from stream_ops.topology.field_paths import value_or_none

logger = logging.getLogger(__name__)

Record = dict[str, Any]
Key = str | int | float | bool

CHECKPOINT_VERSION = 1


# --- triggers --------------------------------------------------------------------------


@dataclass(frozen=True)
class Trigger:
    """When ``on_trigger`` fires: after ``every_events`` events and/or ``every_seconds`` seconds.

    Build with :meth:`count` and :meth:`every`, combine with ``|``.

    Attributes:
        every_events: Fire after this many events since the last firing (``None``: never).
        every_seconds: Fire once this much processing time passed since the last firing.
    """

    every_events: int | None = None
    every_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.every_events is None and self.every_seconds is None:
            raise TopologyDefinitionError("a trigger needs Trigger.count(n) or Trigger.every(seconds)")
        if self.every_events is not None and (
            isinstance(self.every_events, bool) or not isinstance(self.every_events, int) or self.every_events <= 0
        ):
            raise TopologyDefinitionError(f"Trigger.count(n) needs a positive integer, got {self.every_events!r}")
        if self.every_seconds is not None and (
            isinstance(self.every_seconds, bool)
            or not isinstance(self.every_seconds, (int, float))
            or not math.isfinite(self.every_seconds)
            or self.every_seconds <= 0
        ):
            raise TopologyDefinitionError(f"Trigger.every(seconds) needs a positive number, got {self.every_seconds!r}")

    @classmethod
    def count(cls, n: int) -> Trigger:
        """Fire after every ``n`` events of a key."""
        return cls(every_events=n)

    @classmethod
    def every(cls, seconds: float) -> Trigger:
        """Fire when ``seconds`` of processing time passed since the last firing."""
        return cls(every_seconds=seconds)

    def __or__(self, other: Trigger) -> Trigger:
        if not isinstance(other, Trigger):
            return NotImplemented
        return Trigger(
            every_events=_min(self.every_events, other.every_events), every_seconds=_min(self.every_seconds, other.every_seconds)
        )

    def fires(self, events_since: int, seconds_since: float) -> bool:
        """Whether the trigger fires, given the events and seconds since it last fired."""
        if self.every_events is not None and events_since >= self.every_events:
            return True
        return self.every_seconds is not None and seconds_since >= self.every_seconds

    def to_spec(self) -> dict[str, Any]:
        """JSON description for the plan."""
        return {"every_events": self.every_events, "every_seconds": self.every_seconds}

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> Trigger:
        """Inverse of :meth:`to_spec`."""
        return cls(every_events=spec.get("every_events"), every_seconds=spec.get("every_seconds"))


def _min(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else min(a, b)


# --- the processing element ------------------------------------------------------------


class ProcessingElement(ABC):
    """Base class of keyed processing elements; one instance per key (S4's PE instance).

    Subclasses implement :meth:`on_event` and usually :meth:`on_create` and :meth:`on_trigger`;
    the others default to doing nothing. Instances are made by :class:`PERuntime` with no
    constructor arguments. Attributes whose names start with ``_`` are not checkpointed.
    """

    _pe_key: Any
    _pe_emitted: list[Record]

    def __init__(self) -> None:
        self._pe_key = None
        self._pe_emitted = []

    @property
    def key(self) -> Any:
        """The key of this instance (S4's ``getId()``)."""
        return self._pe_key

    def on_create(self) -> None:
        """Called once when the instance for a key is created; initialise fields here."""

    @abstractmethod
    def on_event(self, event: Record) -> None:
        """Called for every record of this key, in arrival order."""

    def on_trigger(self, event: Record | None) -> None:
        """Called when the trigger fires; ``event`` is ``None`` when fired by ``tick``."""

    def on_remove(self) -> None:
        """Called before the instance is dropped for being idle longer than the TTL."""

    def on_restore(self) -> None:
        """Called after the instance was rebuilt from a checkpoint (``on_create`` is not)."""

    def emit(self, record: Mapping[str, Any] | None = None, /, **fields: Any) -> None:
        """Collect an output record: a mapping, keyword fields, or both (keywords win)."""
        out = {**(dict(record) if record is not None else {}), **fields}
        try:
            self._pe_emitted.append(out)
        except AttributeError:  # a subclass __init__ that did not call super().__init__()
            self._pe_emitted = [out]

    def _take_emitted(self) -> list[Record]:
        emitted = getattr(self, "_pe_emitted", [])
        self._pe_emitted = []
        return emitted


def public_fields(pe: ProcessingElement) -> dict[str, Any]:
    """The instance's checkpointed fields: ``vars()`` without names starting with ``_``."""
    return {name: value for name, value in vars(pe).items() if not name.startswith("_")}


def _class_ref(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _check_json(value: Any, where: str) -> None:
    """Raise StateError unless ``value`` survives a JSON round trip unchanged."""
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise StateError(f"{where} is {value!r}, which JSON cannot hold; store a finite number or None")
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check_json(item, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for k, item in value.items():
            if not isinstance(k, str):
                raise StateError(f"{where} has the non-string key {k!r}; JSON turns it into a string, so use string keys")
            _check_json(item, f"{where}[{k!r}]")
        return
    raise StateError(
        f"{where} holds a {type(value).__name__}, which is not a JSON value and cannot be checkpointed; "
        "store None/bool/int/float/str/list/dict, or name the field with a leading '_' and rebuild it in on_restore()"
    )


def _copy_json(value: Any) -> Any:
    if isinstance(value, list):
        return [_copy_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _copy_json(v) for k, v in value.items()}
    return value


# --- the runtime -----------------------------------------------------------------------


@dataclass
class _Slot:
    """One live instance and its trigger/TTL bookkeeping."""

    pe: ProcessingElement
    events_since_trigger: int
    last_trigger: float
    last_event: float


class PERuntime:
    """Runs one PE class over keyed records: lazy instances, triggers, TTL, checkpoints.

    Instances live in creation order; :meth:`tick` visits them in that order, so output is
    deterministic for a given input and sequence of ``now`` values.

    Args:
        pe_class: The :class:`ProcessingElement` subclass (constructible without arguments).
        key_field: Record field whose value selects the instance (str, int, float or bool).
        trigger: When ``on_trigger`` fires, or ``None`` for never.
        ttl_seconds: Remove an instance (calling ``on_remove``) once no record reached it for
            this long; checked by :meth:`tick` and when its next record arrives (the old
            instance is removed, then a new one created). ``None`` keeps instances forever.

    Raises:
        TopologyDefinitionError: a bad class, key field or TTL.

    Example (one micro-batch; see the module docstring for a runnable one)::

        runtime = PERuntime(CounterPE, key_field="user", trigger=Trigger.count(100), ttl_seconds=3600)
        out = runtime.process(records, now=batch_time)
        out += runtime.tick(now=batch_time)
    """

    def __init__(
        self,
        pe_class: type[ProcessingElement],
        key_field: str,
        trigger: Trigger | None = None,
        ttl_seconds: float | None = None,
    ) -> None:
        if not (isinstance(pe_class, type) and issubclass(pe_class, ProcessingElement)):
            raise TopologyDefinitionError(f"PERuntime needs a ProcessingElement subclass, got {pe_class!r}")
        if not isinstance(key_field, str) or not key_field:
            raise TopologyDefinitionError(f"PERuntime key_field must be a field name, got {key_field!r}")
        if trigger is not None and not isinstance(trigger, Trigger):
            raise TopologyDefinitionError(f"trigger must be a Trigger (Trigger.count(n), Trigger.every(s)), got {trigger!r}")
        if ttl_seconds is not None and (
            isinstance(ttl_seconds, bool)
            or not isinstance(ttl_seconds, (int, float))
            or not math.isfinite(ttl_seconds)
            or ttl_seconds <= 0
        ):
            raise TopologyDefinitionError(f"ttl_seconds must be a positive number or None, got {ttl_seconds!r}")
        self.pe_class = pe_class
        self.key_field = key_field
        self.trigger = trigger
        self.ttl_seconds = ttl_seconds
        self._slots: dict[Any, _Slot] = {}
        self.dead_letters: list[dict[str, Any]] = []
        """Records set aside: ``{"key", "record", "error"}`` (``record`` is None for tick-time failures)."""

    # --- introspection -------------------------------------------------------------------

    @property
    def keys(self) -> tuple[Any, ...]:
        """Keys with a live instance, in creation order."""
        return tuple(self._slots)

    def instance(self, key: Any) -> ProcessingElement | None:
        """The live instance of ``key``, if any."""
        slot = self._slots.get(key)
        return None if slot is None else slot.pe

    def __len__(self) -> int:
        return len(self._slots)

    def take_dead_letters(self) -> list[dict[str, Any]]:
        """Return and clear the records set aside since the last call."""
        letters, self.dead_letters = self.dead_letters, []
        return letters

    # --- processing ------------------------------------------------------------------------

    def process(self, records: Iterable[Mapping[str, Any]], now: float) -> list[Record]:
        """Feed records seen at processing time ``now``; returns the records emitted, in order."""
        out: list[Record] = []
        for record in records:
            key = value_or_none(record, self.key_field) if isinstance(record, Mapping) else None
            if key is None or not isinstance(key, (str, int, float)):
                self._dead(key, record, f"record has no usable key field {self.key_field!r} (got {key!r})")
                continue
            slot = self._slots.get(key)
            if slot is not None and self._expired(slot, now):
                out.extend(self._remove(key, slot))
                slot = None
            if slot is None:
                slot = self._create(key, record, now, out)
                if slot is None:
                    continue
            slot.last_event = now
            if not self._call(slot, "on_event", record, key, record, out):
                continue
            slot.events_since_trigger += 1
            if self.trigger is not None and self.trigger.fires(slot.events_since_trigger, now - slot.last_trigger):
                slot.events_since_trigger, slot.last_trigger = 0, now
                self._call(slot, "on_trigger", record, key, record, out)
        return out

    def tick(self, now: float) -> list[Record]:
        """Advance processing time: fire due time triggers, then remove idle instances.

        Each instance, in creation order, first gets ``on_trigger(None)`` if its time trigger
        is due, then ``on_remove()`` if it has been idle for ``ttl_seconds``.
        """
        out: list[Record] = []
        every = None if self.trigger is None else self.trigger.every_seconds
        for key, slot in list(self._slots.items()):
            if every is not None and now - slot.last_trigger >= every:
                slot.events_since_trigger, slot.last_trigger = 0, now
                self._call(slot, "on_trigger", None, key, None, out)
            if self._expired(slot, now):
                out.extend(self._remove(key, slot))
        return out

    def _expired(self, slot: _Slot, now: float) -> bool:
        return self.ttl_seconds is not None and now - slot.last_event >= self.ttl_seconds

    def _new_instance(self, key: Any) -> ProcessingElement:
        pe = self.pe_class()
        pe._pe_key = key
        pe._pe_emitted = []
        return pe

    def _create(self, key: Any, record: Mapping[str, Any], now: float, out: list[Record]) -> _Slot | None:
        try:
            pe = self._new_instance(key)
        except Exception as e:  # noqa: BLE001 - user code may raise anything; it must not stop the task
            self._dead(key, record, f"{self.pe_class.__name__}(): {type(e).__name__}: {e}")
            return None
        slot = _Slot(pe, events_since_trigger=0, last_trigger=now, last_event=now)
        if not self._call(slot, "on_create", None, key, record, out):
            return None
        self._slots[key] = slot
        logger.debug("created %s instance for key %r", self.pe_class.__name__, key)
        return slot

    def _remove(self, key: Any, slot: _Slot) -> list[Record]:
        out: list[Record] = []
        self._call(slot, "on_remove", None, key, None, out)
        del self._slots[key]
        logger.debug("removed idle %s instance for key %r", self.pe_class.__name__, key)
        return out

    def _call(self, slot: _Slot, method: str, arg: Any, key: Any, record: Mapping[str, Any] | None, out: list[Record]) -> bool:
        """Run one callback; its emits go to ``out``, or to the dead letters if it raises."""
        fn = getattr(slot.pe, method)
        try:
            fn(arg) if method in ("on_event", "on_trigger") else fn()
        except Exception as e:  # noqa: BLE001 - user code may raise anything; it must not stop the task
            slot.pe._take_emitted()
            self._dead(key, record, f"{self.pe_class.__name__}.{method}: {type(e).__name__}: {e}")
            return False
        out.extend(slot.pe._take_emitted())
        return True

    def _dead(self, key: Any, record: Any, error: str) -> None:
        self.dead_letters.append({"key": key, "record": record, "error": error})

    # --- checkpoints -------------------------------------------------------------------------

    def checkpoint(self) -> dict[str, Any]:
        """JSON-able snapshot of every instance's public fields and trigger bookkeeping.

        Raises:
            StateError: a public field is not a JSON value (the message names the key and field).
        """
        instances = []
        for key, slot in self._slots.items():
            fields = public_fields(slot.pe)
            for name, value in fields.items():
                _check_json(value, f"{self.pe_class.__name__} field {name!r} of key {key!r}")
            instances.append(
                {
                    "key": key,
                    "fields": _copy_json(fields),
                    "events_since_trigger": slot.events_since_trigger,
                    "last_trigger": slot.last_trigger,
                    "last_event": slot.last_event,
                }
            )
        return {
            "version": CHECKPOINT_VERSION,
            "pe_class": _class_ref(self.pe_class),
            "key_field": self.key_field,
            "instances": instances,
        }

    @classmethod
    def restore(
        cls,
        checkpoint: Mapping[str, Any],
        pe_class: type[ProcessingElement],
        key_field: str,
        trigger: Trigger | None = None,
        ttl_seconds: float | None = None,
    ) -> PERuntime:
        """A runtime holding the instances of ``checkpoint``, rebuilt without calling ``on_create``.

        Each instance gets its public fields back, then ``on_restore()``. Trigger counts and
        times carry over, so counting continues exactly where the checkpoint left it.

        Raises:
            StateError: the checkpoint is malformed or was taken for another PE class or key field.
        """
        runtime = cls(pe_class, key_field, trigger, ttl_seconds)
        if checkpoint.get("version") != CHECKPOINT_VERSION:
            raise StateError(f"PE checkpoint version {checkpoint.get('version')!r} is not {CHECKPOINT_VERSION}")
        if checkpoint.get("pe_class") != _class_ref(pe_class) or checkpoint.get("key_field") != key_field:
            raise StateError(
                f"PE checkpoint was taken for {checkpoint.get('pe_class')} keyed by {checkpoint.get('key_field')!r}, "
                f"not {_class_ref(pe_class)} keyed by {key_field!r}; restore it with the same class and key field"
            )
        try:
            entries = [
                (
                    entry["key"],
                    dict(entry["fields"]),
                    int(entry["events_since_trigger"]),
                    float(entry["last_trigger"]),
                    float(entry["last_event"]),
                )
                for entry in checkpoint["instances"]
            ]
        except (KeyError, TypeError, ValueError) as e:
            raise StateError(f"malformed PE checkpoint ({type(e).__name__}: {e})") from e
        for key, fields, events_since, last_trigger, last_event in entries:
            pe = runtime._new_instance(key)
            for name, value in fields.items():
                setattr(pe, name, _copy_json(value))
            pe.on_restore()
            runtime._slots[key] = _Slot(pe, events_since, last_trigger, last_event)
        logger.info("restored %d %s instances", len(entries), pe_class.__name__)
        return runtime
