"""S4's processing elements: one instance per key, event, trigger and timer callbacks, as a pure core.

A :class:`ProcessingElement` subclass holds the state of one key. :class:`PERuntime` routes
records to the instance of their key, creating it on first use, fires triggers and timers,
expires idle instances, bounds their number and checkpoints everything as JSON. Nothing here
reads a clock: ``now`` (processing time in seconds) is passed in by the caller.

Lifecycle of an instance (S4's ``org.apache.s4.core.ProcessingElement``):

* ``on_create()``: once, when the first record of a key arrives. Initialise per-key fields
  here, not in ``__init__``. With a *prototype* (a configured instance given to
  :class:`PERuntime` instead of the class, as S4's prototype PEs), each instance is a
  ``copy.deepcopy`` of it, so its configured fields are already set.
* ``on_event(event)``: for every record of the key, in arrival order. With several input
  streams (:meth:`PERuntime.process` ``stream=``), a method ``on_<stream>(event)`` receives
  that stream's records if the class has one (lifecycle names such as ``time`` or ``trigger``
  excepted); otherwise ``on_event(event, stream)`` if it takes two arguments, else
  ``on_event(event)``.
* ``on_trigger(event)``: after the event handler when the :class:`Trigger` fires on that
  event, or from :meth:`PERuntime.tick` for a tick-driven time trigger, then with ``event=None``.
* ``on_time()``: every ``timer_interval`` seconds, from :meth:`PERuntime.tick` (S4's
  ``setTimerInterval`` / ``onTime``); a long gap fires once, it does not catch up.
* ``on_remove()``: before an instance is dropped, because it was idle (no record of its key)
  for ``ttl_seconds`` or because creating another would exceed ``max_instances`` (S4's PE
  cache: the least recently used instance goes). Without either, instances live forever.
* ``on_restore()`` (not in S4): after an instance is rebuilt from a checkpoint, instead of
  ``on_create``. Use it to rebuild private (``_``-prefixed) fields, which are not checkpointed.

``singleton=True`` runs one instance (``key`` None) for every record, keyed or not.

Key-less records (broadcast): a record whose key field is missing or None, or that arrives on
a stream whose key field is None, reaches every live instance in creation order (S4's
broadcast); it creates none, and with none alive it is dropped. For each instance it is an
event like any other: it counts towards count triggers and may fire them. It does not make an
instance recently used: it neither postpones the TTL nor changes the ``max_instances`` order.

``self.emit(record)`` / ``self.emit(field=value, ...)`` collects an output record (a dict);
:meth:`PERuntime.process` and :meth:`PERuntime.tick` return what was emitted.
``self.emit(record, stream="alerts")`` sends it to a named output stream instead; drain those
with :meth:`PERuntime.take_side_outputs`.

Triggers: ``Trigger.count(n)`` fires after every ``n`` events of the key.
``Trigger.every(seconds)`` (= ``Trigger.time(seconds, on_event=False)``) fires when
``seconds`` of processing time have passed since the last firing (or since the instance was
created), checked on each event and on ``tick(now)``. ``Trigger.time(seconds)`` (S4's
``setTrigger(type, n, interval, unit)``) is checked on events only: it fires with the first
event arriving ``seconds`` after the last firing, never from a tick. A long gap fires once,
it does not catch up. ``a | b`` fires when either fires, and a firing resets all (the event
count and the time).

Checkpoints: per key, the instance's public fields (``vars()`` without names starting with
``_``, which are framework internals or private fields), the trigger and timer bookkeeping
and its recency rank (so ``max_instances`` evicts the same instance after a restore). Public
fields must be JSON values (``None``, bool, int, float, str, list, dict with str keys); a
tuple or set is refused rather than silently coming back as a list. Output not yet taken
(emitted records, side outputs, dead letters) is not part of a checkpoint.

Bad input never stops a task: a record whose key is not a str, int, float or bool, that is not
a mapping, that arrives on a stream the PE does not read, or whose callback raises, is set
aside in :attr:`PERuntime.dead_letters` (drain them with :meth:`PERuntime.take_dead_letters`);
output emitted by the failing call is discarded. State the failing call changed before raising
is kept, as in S4, which logs and carries on.

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

Several input streams, a prototype and a named output (S4's fraud-detector shape):

    >>> class LimitPE(ProcessingElement):
    ...     def __init__(self, limit: int) -> None:
    ...         super().__init__()
    ...         self.limit = limit
    ...
    ...     def on_create(self) -> None:
    ...         self.spent = 0
    ...
    ...     def on_payments(self, event) -> None:
    ...         self.spent += event["amount"]
    ...         if self.spent > self.limit:
    ...             self.emit(card=self.key, spent=self.spent, stream="alerts")
    ...
    ...     def on_rules(self, event) -> None:  # key-less: every live instance gets it
    ...         self.limit = event["limit"]
    ...
    ...     def on_event(self, event) -> None:
    ...         pass
    >>> runtime = PERuntime(LimitPE(limit=100), key_field={"payments": "card", "rules": None})
    >>> runtime.process([{"card": "c1", "amount": 80}], now=0.0, stream="payments")
    []
    >>> runtime.process([{"limit": 50}], now=1.0, stream="rules")
    []
    >>> runtime.process([{"card": "c1", "amount": 10}, {"card": "c2", "amount": 10}], now=2.0, stream="payments")
    []
    >>> runtime.take_side_outputs()
    {'alerts': [{'card': 'c1', 'spent': 90}]}
"""

from __future__ import annotations

import copy
import inspect
import logging
import math
from abc import ABC
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from stream_ops.errors import StateError, TopologyDefinitionError, TopologyLoadError
from stream_ops.helpers.field_paths import value_or_none

logger = logging.getLogger(__name__)

Record = dict[str, Any]
Key = str | int | float | bool
KeyField = str | Mapping[str, str | None] | None
"""One key field for every input stream, one per stream (None: key-less), or None (singleton)."""

CHECKPOINT_VERSION = 2
_READABLE_VERSIONS = (1, 2)

_LIFECYCLE_NAMES = frozenset({"event", "create", "trigger", "time", "remove", "restore"})
"""Stream names whose ``on_<name>`` is a lifecycle callback, never a stream handler."""


def _is_positive_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0


# --- triggers --------------------------------------------------------------------------


@dataclass(frozen=True)
class Trigger:
    """When ``on_trigger`` fires: after a number of events and/or an amount of time.

    Build with :meth:`count`, :meth:`every` and :meth:`time`, combine with ``|``.

    Attributes:
        every_events: Fire after this many events since the last firing (``None``: never).
        every_seconds: Fire once this much processing time passed since the last firing,
            checked on events and on ticks.
        seconds_on_event: Fire on an event arriving at least this long after the last firing
            (S4's time trigger); ticks never fire it.
    """

    every_events: int | None = None
    every_seconds: float | None = None
    seconds_on_event: float | None = None

    def __post_init__(self) -> None:
        if self.every_events is None and self.every_seconds is None and self.seconds_on_event is None:
            raise TopologyDefinitionError("a trigger needs Trigger.count(n), Trigger.every(seconds) or Trigger.time(seconds)")
        if self.every_events is not None and (
            isinstance(self.every_events, bool) or not isinstance(self.every_events, int) or self.every_events <= 0
        ):
            raise TopologyDefinitionError(f"Trigger.count(n) needs a positive integer, got {self.every_events!r}")
        if self.every_seconds is not None and not _is_positive_number(self.every_seconds):
            raise TopologyDefinitionError(f"Trigger.every(seconds) needs a positive number, got {self.every_seconds!r}")
        if self.seconds_on_event is not None and not _is_positive_number(self.seconds_on_event):
            raise TopologyDefinitionError(
                f"Trigger.time(seconds, on_event=True) needs a positive number, got {self.seconds_on_event!r}"
            )

    @classmethod
    def count(cls, n: int) -> Trigger:
        """Fire after every ``n`` events of a key."""
        return cls(every_events=n)

    @classmethod
    def every(cls, seconds: float) -> Trigger:
        """Fire when ``seconds`` of processing time passed since the last firing (events and ticks)."""
        return cls(every_seconds=seconds)

    @classmethod
    def time(cls, seconds: float, *, on_event: bool = True) -> Trigger:
        """A time trigger: S4's (``on_event=True``) or the tick-driven :meth:`every`.

        With ``on_event=True`` it fires only when an event arrives at least ``seconds`` after
        the last firing (or the instance's creation), as S4's ``setTrigger(type, n, interval,
        unit)``; :meth:`PERuntime.tick` never fires it. ``on_event=False`` is ``every(seconds)``.
        """
        if not isinstance(on_event, bool):
            raise TopologyDefinitionError(f"Trigger.time(on_event=...) must be True or False, got {on_event!r}")
        return cls(seconds_on_event=seconds) if on_event else cls(every_seconds=seconds)

    def __or__(self, other: Trigger) -> Trigger:
        if not isinstance(other, Trigger):
            return NotImplemented
        return Trigger(
            every_events=_min(self.every_events, other.every_events),
            every_seconds=_min(self.every_seconds, other.every_seconds),
            seconds_on_event=_min(self.seconds_on_event, other.seconds_on_event),
        )

    def fires(self, events_since: int, seconds_since: float, *, tick: bool = False) -> bool:
        """Whether the trigger fires, given the events and seconds since it last fired.

        ``tick=False`` asks on an event (every condition counts), ``tick=True`` on a tick
        (only :attr:`every_seconds` counts).
        """
        if self.every_seconds is not None and seconds_since >= self.every_seconds:
            return True
        if tick:
            return False
        if self.every_events is not None and events_since >= self.every_events:
            return True
        return self.seconds_on_event is not None and seconds_since >= self.seconds_on_event

    def to_spec(self) -> dict[str, Any]:
        """JSON description for the plan (``seconds_on_event`` only when set)."""
        spec: dict[str, Any] = {"every_events": self.every_events, "every_seconds": self.every_seconds}
        if self.seconds_on_event is not None:
            spec["seconds_on_event"] = self.seconds_on_event
        return spec

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> Trigger:
        """Inverse of :meth:`to_spec` (``seconds_on_event`` absent: not set).

        Raises:
            TopologyLoadError: ``spec`` lacks ``every_events`` or ``every_seconds`` (not written
                by :meth:`to_spec`).
        """
        missing = [name for name in ("every_events", "every_seconds") if name not in spec]
        if missing:
            raise TopologyLoadError(
                f"trigger spec {dict(spec)!r} lacks {', '.join(missing)}; it was not written by Trigger.to_spec"
            )
        return cls(
            every_events=spec["every_events"],
            every_seconds=spec["every_seconds"],
            seconds_on_event=spec.get("seconds_on_event"),
        )


def _min(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else min(a, b)


# --- the processing element ------------------------------------------------------------


class ProcessingElement(ABC):
    """Base class of keyed processing elements; one instance per key (S4's PE instance).

    Subclasses implement :meth:`on_event` and usually :meth:`on_create` and :meth:`on_trigger`;
    the others default to doing nothing. Instances are made by :class:`PERuntime` with no
    constructor arguments, or copied from a prototype instance. Attributes whose names start
    with ``_`` are not checkpointed.
    """

    _pe_key: Any
    _pe_emitted: list[Record]
    _pe_side_emitted: list[tuple[str, Record]]

    def __init__(self) -> None:
        self._pe_key = None
        self._pe_emitted = []
        self._pe_side_emitted = []

    @property
    def key(self) -> Any:
        """The key of this instance (S4's ``getId()``); None for a singleton."""
        return self._pe_key

    def on_create(self) -> None:
        """Called once when the instance for a key is created; initialise fields here."""

    def on_event(self, event: Record) -> None:
        """Called for every record of this key, in arrival order.

        May also be declared ``on_event(self, event, stream)`` to receive the input stream's
        name; a method ``on_<stream>(self, event)`` takes precedence for that stream. A PE
        whose every input stream has its ``on_<stream>`` need not define it.
        """
        raise TopologyDefinitionError(f"{type(self).__name__} defines neither on_event nor a handler for this stream")

    @classmethod
    def handles(cls, stream: str | None) -> bool:
        """Whether events of input ``stream`` reach a method of this class (``on_<stream>`` or
        an overridden ``on_event``)."""
        if cls.on_event is not ProcessingElement.on_event:
            return True
        return stream is not None and stream not in _LIFECYCLE_NAMES and callable(getattr(cls, f"on_{stream}", None))

    def on_trigger(self, event: Record | None) -> None:
        """Called when the trigger fires; ``event`` is ``None`` when fired by ``tick``."""

    def on_time(self) -> None:
        """Called every ``timer_interval`` seconds of processing time (S4's ``onTime``)."""

    def on_remove(self) -> None:
        """Called before the instance is dropped (idle longer than the TTL, or evicted)."""

    def on_restore(self) -> None:
        """Called after the instance was rebuilt from a checkpoint (``on_create`` is not)."""

    def emit(self, record: Mapping[str, Any] | None = None, /, *, stream: str | None = None, **fields: Any) -> None:
        """Collect an output record: a mapping, keyword fields, or both (keywords win).

        Args:
            record: The record's fields as a mapping.
            stream: A named output stream to send the record to instead of the default one.
                ``stream`` is therefore reserved as a keyword: a field literally named
                ``"stream"`` must be passed in the mapping (``self.emit({"stream": "x"})``).
            **fields: More fields.

        Raises:
            TopologyDefinitionError: ``stream`` is not a non-empty string.
        """
        out = {**(dict(record) if record is not None else {}), **fields}
        if stream is None:
            try:
                self._pe_emitted.append(out)
            except AttributeError:  # a subclass __init__ that did not call super().__init__()
                self._pe_emitted = [out]
            return
        if not isinstance(stream, str) or not stream:
            raise TopologyDefinitionError(f"emit(stream=...) needs a non-empty stream name, got {stream!r}")
        try:
            self._pe_side_emitted.append((stream, out))
        except AttributeError:
            self._pe_side_emitted = [(stream, out)]

    def _take_emitted(self) -> list[Record]:
        emitted = getattr(self, "_pe_emitted", [])
        self._pe_emitted = []
        return emitted

    def _take_side_emitted(self) -> list[tuple[str, Record]]:
        emitted = getattr(self, "_pe_side_emitted", [])
        self._pe_side_emitted = []
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


# --- prototypes ------------------------------------------------------------------------


def prototype_spec(pe: ProcessingElement) -> dict[str, Any]:
    """JSON description of a prototype instance for the plan: ``{"fields": {...}}``.

    Only public fields travel (as in checkpoints); :func:`prototype_from_spec` rebuilds it.

    Raises:
        TopologyDefinitionError: ``pe`` is not a ProcessingElement instance, or a public field
            is not a JSON value (the message names the field).
    """
    if not isinstance(pe, ProcessingElement):
        raise TopologyDefinitionError(f"a PE prototype must be a ProcessingElement instance, got {pe!r}")
    fields = public_fields(pe)
    for name, value in fields.items():
        _check_prototype_field(type(pe), name, value)
    return {"fields": _copy_json(fields)}


def prototype_from_spec(pe_class: type[ProcessingElement], spec: Mapping[str, Any]) -> ProcessingElement:
    """Rebuild a prototype from :func:`prototype_spec` output, without calling ``pe_class.__init__``.

    The instance is made with ``object.__new__``, initialised by ``ProcessingElement.__init__``
    only, then given the spec's fields; private fields a subclass ``__init__`` would set are
    absent, so build them in ``on_create`` / ``on_restore``.

    Raises:
        TopologyDefinitionError: not a ProcessingElement subclass, or a malformed spec.
    """
    _check_pe_class(pe_class)
    fields = spec.get("fields") if isinstance(spec, Mapping) else None
    if not isinstance(fields, Mapping):
        raise TopologyDefinitionError(f"a PE prototype spec must be {{'fields': {{...}}}}, got {spec!r}")
    try:
        pe = object.__new__(pe_class)
    except TypeError as e:  # e.g. abstract methods left unimplemented
        raise TopologyDefinitionError(f"cannot build a {pe_class.__name__} prototype: {e}") from None
    ProcessingElement.__init__(pe)
    for name, value in fields.items():
        if not isinstance(name, str) or not name or name.startswith("_"):
            raise TopologyDefinitionError(
                f"{pe_class.__name__} prototype spec has the field name {name!r}; only public names travel"
            )
        _check_prototype_field(pe_class, name, value)
        try:
            setattr(pe, name, _copy_json(value))
        except AttributeError as e:  # a read-only property
            raise TopologyDefinitionError(f"{pe_class.__name__} prototype field {name!r} cannot be set: {e}") from None
    return pe


def _check_prototype_field(pe_class: type, name: str, value: Any) -> None:
    try:
        _check_json(value, f"{pe_class.__name__} prototype field {name!r}")
    except StateError as e:
        raise TopologyDefinitionError(f"{e} (a prototype's public fields travel in the plan as JSON)") from None


def _check_pe_class(pe_class: Any) -> None:
    if not (isinstance(pe_class, type) and issubclass(pe_class, ProcessingElement)):
        raise TopologyDefinitionError(f"PERuntime needs a ProcessingElement subclass or instance, got {pe_class!r}")


# --- the runtime -----------------------------------------------------------------------


@dataclass
class _Slot:
    """One live instance and its trigger/timer/TTL bookkeeping."""

    pe: ProcessingElement
    events_since_trigger: int
    last_trigger: float
    last_event: float
    last_time: float


def _canonical_key_field(key_field: Any) -> Any:
    """Comparable form of a key field: a mapping becomes a dict sorted by stream name."""
    if isinstance(key_field, Mapping):
        return {str(k): key_field[k] for k in sorted(key_field, key=str)}
    return key_field


def _check_key_field(key_field: Any, singleton: bool) -> None:
    if isinstance(key_field, Mapping):
        if not key_field:
            raise TopologyDefinitionError("PERuntime key_field mapping is empty; map each input stream name to its key field")
        for stream, field in key_field.items():
            if not isinstance(stream, str) or not stream:
                raise TopologyDefinitionError(f"PERuntime key_field maps stream names, got the stream name {stream!r}")
            if field is not None and (not isinstance(field, str) or not field):
                raise TopologyDefinitionError(
                    f"PERuntime key_field of stream {stream!r} must be a field name or None (key-less), got {field!r}"
                )
            if singleton and field is not None:
                raise TopologyDefinitionError(
                    f"a singleton PE has one instance for all records; stream {stream!r} must map to None, not {field!r}"
                )
        if not singleton and all(field is None for field in key_field.values()):
            raise TopologyDefinitionError(
                "PERuntime key_field: every stream is key-less, so no instance would ever be created; "
                "give one stream a key field, or pass singleton=True"
            )
        return
    if key_field is None:
        if not singleton:
            raise TopologyDefinitionError("PERuntime key_field is None; name the key field, or pass singleton=True")
        return
    if not isinstance(key_field, str) or not key_field:
        raise TopologyDefinitionError(f"PERuntime key_field must be a field name, got {key_field!r}")
    if singleton:
        raise TopologyDefinitionError(f"a singleton PE has one instance for all records; pass key_field=None, not {key_field!r}")


def _on_event_takes_stream(pe_class: type[ProcessingElement]) -> bool:
    """Whether ``pe_class.on_event`` accepts two positional arguments after ``self``."""
    try:
        params = list(inspect.signature(pe_class.on_event).parameters.values())[1:]
    except (TypeError, ValueError):
        return False
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return True
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(p.kind in positional for p in params) >= 2


def _usable_key(key: Any) -> bool:
    if isinstance(key, float):
        return math.isfinite(key)
    return isinstance(key, (str, int))


class PERuntime:
    """Runs one PE class over keyed records: lazy instances, triggers, timers, TTL, checkpoints.

    Instances live in creation order; :meth:`tick` and broadcasts visit them in that order,
    so output is deterministic for a given input and sequence of ``now`` values.

    Args:
        pe_class: The :class:`ProcessingElement` subclass (constructible without arguments),
            or a configured instance of one, used as a prototype: each key's instance is a
            ``copy.deepcopy`` of it (see :func:`prototype_spec` to ship one in a plan).
        key_field: Record field whose value selects the instance (its value must be a str,
            int, float or bool), or a mapping from input stream name to its key field (None:
            that stream is key-less and broadcast); None only with ``singleton``.
        trigger: When ``on_trigger`` fires, or ``None`` for never.
        ttl_seconds: Remove an instance (calling ``on_remove``) once no record reached it for
            this long; checked by :meth:`tick` and when its next record arrives (the old
            instance is removed, then a new one created). ``None`` keeps instances forever.
        timer_interval: Call every instance's ``on_time()`` from :meth:`tick` once this many
            seconds passed since its last ``on_time`` (or its creation). ``None``: never.
        max_instances: At most this many live instances: creating one more first removes the
            least recently used (by keyed record or creation), calling its ``on_remove``.
        singleton: One instance (key None) receives every record; no key field is read.

    Raises:
        TopologyDefinitionError: a bad class, prototype, key field, TTL, timer or cache size.

    Example (one micro-batch; see the module docstring for a runnable one)::

        runtime = PERuntime(CounterPE, key_field="user", trigger=Trigger.count(100), ttl_seconds=3600)
        out = runtime.process(records, now=batch_time)
        out += runtime.tick(now=batch_time)
        side = runtime.take_side_outputs()
    """

    def __init__(
        self,
        pe_class: type[ProcessingElement] | ProcessingElement,
        key_field: KeyField,
        trigger: Trigger | None = None,
        ttl_seconds: float | None = None,
        *,
        timer_interval: float | None = None,
        max_instances: int | None = None,
        singleton: bool = False,
    ) -> None:
        prototype: ProcessingElement | None = None
        if isinstance(pe_class, ProcessingElement):
            prototype = _copy_prototype(pe_class)
            pe_class = type(pe_class)
        _check_pe_class(pe_class)
        if not isinstance(singleton, bool):
            raise TopologyDefinitionError(f"singleton must be True or False, got {singleton!r}")
        _check_key_field(key_field, singleton)
        if trigger is not None and not isinstance(trigger, Trigger):
            raise TopologyDefinitionError(
                f"trigger must be a Trigger (Trigger.count(n), Trigger.every(s), Trigger.time(s)), got {trigger!r}"
            )
        if ttl_seconds is not None and not _is_positive_number(ttl_seconds):
            raise TopologyDefinitionError(f"ttl_seconds must be a positive number or None, got {ttl_seconds!r}")
        if timer_interval is not None and not _is_positive_number(timer_interval):
            raise TopologyDefinitionError(f"timer_interval must be a positive number of seconds or None, got {timer_interval!r}")
        if max_instances is not None and (
            isinstance(max_instances, bool) or not isinstance(max_instances, int) or max_instances <= 0
        ):
            raise TopologyDefinitionError(f"max_instances must be a positive integer or None, got {max_instances!r}")
        self.pe_class: type[ProcessingElement] = pe_class
        self.prototype = prototype
        """The prototype instances are copied from (a private copy), or None."""
        self.key_field: KeyField = dict(key_field) if isinstance(key_field, Mapping) else key_field
        self.trigger = trigger
        self.ttl_seconds = ttl_seconds
        self.timer_interval = timer_interval
        self.max_instances = max_instances
        self.singleton = singleton
        self._slots: dict[Any, _Slot] = {}
        self._recency: OrderedDict[Any, None] = OrderedDict()  # least recently used first
        self._side_outputs: dict[str, list[Record]] = {}
        self._handlers: dict[str | None, tuple[str, bool]] = {}
        self._on_event_takes_stream = _on_event_takes_stream(pe_class)
        self.dead_letters: list[dict[str, Any]] = []
        """Records set aside: ``{"key", "record", "error"}`` (``record`` is None for tick-time failures)."""

    # --- introspection -------------------------------------------------------------------

    @property
    def keys(self) -> tuple[Any, ...]:
        """Keys with a live instance, in creation order."""
        return tuple(self._slots)

    @property
    def streams(self) -> tuple[str, ...] | None:
        """The input streams of a ``key_field`` mapping, or None (any stream name is accepted)."""
        return tuple(self.key_field) if isinstance(self.key_field, Mapping) else None

    def instance(self, key: Any) -> ProcessingElement | None:
        """The live instance of ``key`` (None for a singleton's), if any."""
        slot = self._slots.get(key)
        return None if slot is None else slot.pe

    def __len__(self) -> int:
        return len(self._slots)

    def take_dead_letters(self) -> list[dict[str, Any]]:
        """Return and clear the records set aside since the last call."""
        letters, self.dead_letters = self.dead_letters, []
        return letters

    def take_side_outputs(self) -> dict[str, list[Record]]:
        """Return and clear the records emitted to named streams: stream -> records, in emission order."""
        side, self._side_outputs = self._side_outputs, {}
        return side

    # --- processing ------------------------------------------------------------------------

    def process(self, records: Iterable[Mapping[str, Any]], now: float, stream: str | None = None) -> list[Record]:
        """Feed records of input stream ``stream`` seen at processing time ``now``.

        Returns the records emitted to the default output, in order; named outputs go to
        :meth:`take_side_outputs`. Records of a stream missing from a ``key_field`` mapping
        (``stream=None`` included) are dead letters.
        """
        out: list[Record] = []
        for record in records:
            self._process_one(record, now, stream, out)
        return out

    def _process_one(self, record: Any, now: float, stream: str | None, out: list[Record]) -> None:
        if not isinstance(record, Mapping):
            self._dead(None, record, f"record is a {type(record).__name__}, not a mapping of fields")
            return
        known, field = self._key_field_of(stream)
        if not known:
            self._dead(
                None,
                record,
                f"record arrived on stream {stream!r}, which this PE does not read (it reads {list(self.streams or ())})",
            )
            return
        if self.singleton:
            self._deliver(None, record, now, stream, out)
            return
        key = None if field is None else value_or_none(record, field)
        if key is None:
            self._broadcast(record, now, stream, out)
        elif not _usable_key(key):
            self._dead(
                key, record, f"record has no usable key field {field!r} (got {key!r}; a key is a str, int, finite float or bool)"
            )
        else:
            self._deliver(key, record, now, stream, out)

    def _key_field_of(self, stream: str | None) -> tuple[bool, str | None]:
        """Whether the PE reads ``stream``, and that stream's key field (None: key-less)."""
        if isinstance(self.key_field, Mapping):
            if stream is None or stream not in self.key_field:
                return False, None
            return True, self.key_field[stream]
        return True, self.key_field

    def _deliver(self, key: Any, record: Mapping[str, Any], now: float, stream: str | None, out: list[Record]) -> None:
        """A keyed record: to its instance, created (or replaced, if expired) as needed."""
        slot = self._slots.get(key)
        if slot is not None and self._expired(slot, now):
            self._remove(key, slot, out, "idle")
            slot = None
        if slot is None:
            slot = self._create(key, record, now, out)
            if slot is None:
                return
        slot.last_event = now
        self._recency.move_to_end(key)
        self._handle(key, slot, record, now, stream, out)

    def _broadcast(self, record: Mapping[str, Any], now: float, stream: str | None, out: list[Record]) -> None:
        """A key-less record: to every live instance in creation order (expired ones are removed)."""
        if not self._slots:
            logger.debug("dropped a key-less record of stream %r: no live %s instance", stream, self.pe_class.__name__)
            return
        for key, slot in list(self._slots.items()):
            if self._expired(slot, now):
                self._remove(key, slot, out, "idle")
            else:
                self._handle(key, slot, record, now, stream, out)

    def _handle(
        self, key: Any, slot: _Slot, record: Mapping[str, Any], now: float, stream: str | None, out: list[Record]
    ) -> None:
        """Dispatch one event to one instance, then fire its trigger if due."""
        method, with_stream = self._handler(stream)
        args = (record, stream) if with_stream else (record,)
        if not self._call(slot, key, record, out, method, *args):
            return
        slot.events_since_trigger += 1
        if self.trigger is not None and self.trigger.fires(slot.events_since_trigger, now - slot.last_trigger):
            slot.events_since_trigger, slot.last_trigger = 0, now
            self._call(slot, key, record, out, "on_trigger", record)

    def _handler(self, stream: str | None) -> tuple[str, bool]:
        """The method receiving events of ``stream`` and whether it gets the stream name (cached)."""
        handler = self._handlers.get(stream)
        if handler is None:
            name = f"on_{stream}"
            if stream is not None and stream not in _LIFECYCLE_NAMES and callable(getattr(self.pe_class, name, None)):
                handler = (name, False)
            else:
                handler = ("on_event", self._on_event_takes_stream)
            self._handlers[stream] = handler
        return handler

    def tick(self, now: float) -> list[Record]:
        """Advance processing time: fire due tick-driven triggers and timers, remove idle instances.

        Each instance, in creation order, first gets ``on_trigger(None)`` if its
        ``Trigger.every`` time is due, then ``on_time()`` if ``timer_interval`` is due, then
        ``on_remove()`` if it has been idle for ``ttl_seconds``. Returns the default-stream
        records emitted.
        """
        out: list[Record] = []
        for key, slot in list(self._slots.items()):
            if self.trigger is not None and self.trigger.fires(slot.events_since_trigger, now - slot.last_trigger, tick=True):
                slot.events_since_trigger, slot.last_trigger = 0, now
                self._call(slot, key, None, out, "on_trigger", None)
            if self.timer_interval is not None and now - slot.last_time >= self.timer_interval:
                slot.last_time = now
                self._call(slot, key, None, out, "on_time")
            if self._expired(slot, now):
                self._remove(key, slot, out, "idle")
        return out

    def _expired(self, slot: _Slot, now: float) -> bool:
        return self.ttl_seconds is not None and now - slot.last_event >= self.ttl_seconds

    def _new_instance(self, key: Any) -> ProcessingElement:
        pe = copy.deepcopy(self.prototype) if self.prototype is not None else self.pe_class()
        pe._pe_key = key
        pe._pe_emitted = []
        pe._pe_side_emitted = []
        return pe

    def _create(self, key: Any, record: Mapping[str, Any], now: float, out: list[Record]) -> _Slot | None:
        self._make_room(out)
        try:
            pe = self._new_instance(key)
        except Exception as e:  # noqa: BLE001 - user code may raise anything; it must not stop the task
            self._dead(key, record, f"{self.pe_class.__name__}(): {type(e).__name__}: {e}")
            return None
        slot = _Slot(pe, events_since_trigger=0, last_trigger=now, last_event=now, last_time=now)
        if not self._call(slot, key, record, out, "on_create"):
            return None
        self._slots[key] = slot
        self._recency[key] = None
        logger.debug("created %s instance for key %r", self.pe_class.__name__, key)
        return slot

    def _make_room(self, out: list[Record]) -> None:
        """Evict least recently used instances until one more fits under ``max_instances``."""
        while self.max_instances is not None and len(self._slots) >= self.max_instances:
            key = next(iter(self._recency))
            self._remove(key, self._slots[key], out, "least recently used")

    def _remove(self, key: Any, slot: _Slot, out: list[Record], reason: str) -> None:
        self._call(slot, key, None, out, "on_remove")
        del self._slots[key]
        del self._recency[key]
        logger.debug("removed %s %s instance for key %r", reason, self.pe_class.__name__, key)

    def _call(self, slot: _Slot, key: Any, record: Mapping[str, Any] | None, out: list[Record], method: str, *args: Any) -> bool:
        """Run one callback; its emits go to ``out`` and the side outputs, or nowhere if it raises."""
        try:
            getattr(slot.pe, method)(*args)
        except Exception as e:  # noqa: BLE001 - user code may raise anything; it must not stop the task
            slot.pe._take_emitted()
            slot.pe._take_side_emitted()
            self._dead(key, record, f"{self.pe_class.__name__}.{method}: {type(e).__name__}: {e}")
            return False
        out.extend(slot.pe._take_emitted())
        for stream, emitted in slot.pe._take_side_emitted():
            self._side_outputs.setdefault(stream, []).append(emitted)
        return True

    def _dead(self, key: Any, record: Any, error: str) -> None:
        self.dead_letters.append({"key": key, "record": record, "error": error})

    # --- checkpoints -------------------------------------------------------------------------

    def checkpoint(self) -> dict[str, Any]:
        """JSON-able snapshot of every instance's public fields and bookkeeping.

        Format (version 2)::

            {"version": 2, "pe_class": "module:Class", "key_field": <str | {stream: field|None} | None>,
             "singleton": bool,
             "instances": [{"key", "fields", "events_since_trigger", "last_trigger", "last_event",
                            "last_time", "last_use"}, ...]}   # in creation order

        ``last_use`` is the instance's recency rank (0: least recently used).

        Raises:
            StateError: a public field is not a JSON value (the message names the key and field).
        """
        rank = {key: i for i, key in enumerate(self._recency)}
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
                    "last_time": slot.last_time,
                    "last_use": rank[key],
                }
            )
        return {
            "version": CHECKPOINT_VERSION,
            "pe_class": _class_ref(self.pe_class),
            "key_field": _canonical_key_field(self.key_field),
            "singleton": self.singleton,
            "instances": instances,
        }

    @classmethod
    def restore(
        cls,
        checkpoint: Mapping[str, Any],
        pe_class: type[ProcessingElement] | ProcessingElement,
        key_field: KeyField,
        trigger: Trigger | None = None,
        ttl_seconds: float | None = None,
        *,
        timer_interval: float | None = None,
        max_instances: int | None = None,
        singleton: bool = False,
    ) -> PERuntime:
        """A runtime holding the instances of ``checkpoint``, rebuilt without calling ``on_create``.

        Arguments are those of :class:`PERuntime` (pass the prototype instance as ``pe_class``
        if the runtime had one). Each instance is made as a new one would be (class or
        prototype copy), gets its checkpointed public fields back, then ``on_restore()``.
        Trigger counts and times, timer times and recency carry over, so everything continues
        exactly where the checkpoint left it. Version-1 checkpoints are read too: the timer
        restarts from the last trigger time and recency follows the last event times. More
        instances than ``max_instances`` are kept until the next creation evicts the surplus.

        Raises:
            StateError: the checkpoint is malformed or was taken for another PE class, key
                field or singleton setting.
        """
        runtime = cls(
            pe_class,
            key_field,
            trigger,
            ttl_seconds,
            timer_interval=timer_interval,
            max_instances=max_instances,
            singleton=singleton,
        )
        runtime._check_checkpoint(checkpoint)
        try:
            entries = [_parse_instance(i, entry) for i, entry in enumerate(checkpoint["instances"])]
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise StateError(f"malformed PE checkpoint ({type(e).__name__}: {e})") from e
        for key, fields, slot_times, _ in entries:
            pe = runtime._new_instance(key)
            for name, value in fields.items():
                setattr(pe, name, _copy_json(value))
            pe.on_restore()
            runtime._slots[key] = _Slot(pe, *slot_times)
        for key, _, _, _ in sorted(entries, key=lambda entry: entry[3]):
            runtime._recency[key] = None
        logger.info("restored %d %s instances", len(entries), runtime.pe_class.__name__)
        return runtime

    def _check_checkpoint(self, checkpoint: Mapping[str, Any]) -> None:
        version = checkpoint.get("version")
        if version not in _READABLE_VERSIONS:
            raise StateError(f"PE checkpoint version {version!r} is not one of {list(_READABLE_VERSIONS)}")
        saved_key_field = _canonical_key_field(checkpoint.get("key_field"))
        saved_singleton = bool(checkpoint.get("singleton", False))
        if (
            checkpoint.get("pe_class") != _class_ref(self.pe_class)
            or saved_key_field != _canonical_key_field(self.key_field)
            or saved_singleton != self.singleton
        ):
            raise StateError(
                f"PE checkpoint was taken for {checkpoint.get('pe_class')} keyed by {saved_key_field!r}"
                f"{' (singleton)' if saved_singleton else ''}, not {_class_ref(self.pe_class)} keyed by "
                f"{_canonical_key_field(self.key_field)!r}{' (singleton)' if self.singleton else ''}; "
                "restore it with the same class, key field and singleton setting"
            )


def _parse_instance(
    index: int, entry: Mapping[str, Any]
) -> tuple[Any, dict[str, Any], tuple[int, float, float, float], tuple[float, int]]:
    """One checkpointed instance: key, fields, slot numbers and its recency sort key."""
    events_since = int(entry["events_since_trigger"])
    last_trigger = float(entry["last_trigger"])
    last_event = float(entry["last_event"])
    last_time = float(entry.get("last_time", last_trigger))
    recency = (float(entry["last_use"]) if "last_use" in entry else last_event, index)
    hash(entry["key"])  # a key must be usable as one (TypeError otherwise)
    return entry["key"], dict(entry["fields"]), (events_since, last_trigger, last_event, last_time), recency


def _copy_prototype(prototype: ProcessingElement) -> ProcessingElement:
    """A private copy of a prototype, so later changes to the caller's object do not leak in."""
    try:
        copied = copy.deepcopy(prototype)
    except Exception as e:  # noqa: BLE001 - deepcopy of user objects may raise anything
        raise TopologyDefinitionError(
            f"PE prototype {type(prototype).__name__} cannot be copied ({type(e).__name__}: {e}); "
            "build uncopyable resources in on_create() / on_restore() instead"
        ) from None
    copied._pe_key = None
    copied._pe_emitted = []
    copied._pe_side_emitted = []
    return copied
