"""Trident's map states: transactional, opaque and non-transactional, over a BackingMap.

A map state is used one batch at a time::

    state.begin_commit(txid)
    state.multi_update(keys, fns)     # any number of gets, puts and updates
    state.commit(txid)

The txid rules (what makes a replayed batch count once):

=================  =======================  ==========================  =====================
stored txid        transactional            opaque                      non-transactional
=================  =======================  ==========================  =====================
absent             ``fn(None)``             ``fn(None)``                ``fn(None)``
< batch            ``fn(val)``              ``fn(curr)``                ``fn(value)``
== batch           skipped (already done)   ``fn(prev)`` (recomputed)   ``fn(value)`` (again)
> batch            :class:`TxidOrderError`  :class:`TxidOrderError`     ``fn(value)``
=================  =======================  ==========================  =====================

Within one batch reads go through a cache holding the batch's own writes, so two updates of a
key in one batch compose. For the "== batch" rows this matters: a key this batch has already
written is updated on top of the batch's value, while a key that was stored by an earlier run
of the same batch stays skipped (transactional) or restarts from ``prev`` (opaque) for every
update of the replay. Running a batch twice therefore ends where running it once did —
provided the backing map stores a batch's writes all or nothing (see :class:`BackingMap`).
"""

from __future__ import annotations

import copy
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from stream_ops.errors import StateError, TxidOrderError
from stream_ops.state.backing import BackingMap, check_same_length
from stream_ops.state.keys import Key, as_key
from stream_ops.state.values import OpaqueValue, TransactionalValue

logger = logging.getLogger(__name__)

UpdateFn = Callable[[Any], Any]
"""Maps a key's current value (None if absent) to its new value. Must be deterministic."""

_SKIP = object()


def _detached(value: Any) -> Any:
    """A copy of a mutable value, so a function that mutates its input cannot change stored state."""
    return copy.deepcopy(value) if isinstance(value, (dict, list)) else value


@contextmanager
def _about(key: Key) -> Iterator[None]:
    """Name the key in a TxidOrderError raised inside the block."""
    try:
        yield
    except TxidOrderError as e:
        raise TxidOrderError(f"key {key!r}: {e}") from e


class _BatchMapState(ABC):
    """What the three map states share: the batch lifecycle, the read cache and the write path.

    Subclasses say how a stored value is unwrapped (:meth:`_unwrap`), wrapped (:meth:`_wrap`)
    and when an update is skipped (:meth:`_skips`).
    """

    _kind: type | None = None
    """The wrapper class every stored value must be an instance of (None: any value)."""

    def __init__(self, backing: BackingMap) -> None:
        self._backing = backing
        self._txid: int | None = None
        self._cache: dict[Key, Any] = {}  # wrapped values read or written in this batch
        self._written: dict[Key, None] = {}  # keys this batch wrote, in first-write order

    def begin_commit(self, txid: int) -> None:
        """Open batch ``txid``; reads, puts and updates are allowed until :meth:`commit`.

        Opening a batch while another is open abandons the open one (its writes already in
        the backing map stay there, so this behaves like a replay).
        """
        if not isinstance(txid, int) or isinstance(txid, bool) or txid < 0:
            raise StateError(f"{type(self).__name__}.begin_commit: txid must be a non-negative integer, got {txid!r}")
        if self._txid is not None:
            logger.warning("%s: batch %d was not committed; starting batch %d", type(self).__name__, self._txid, txid)
        self._reset(txid)
        logger.debug("%s: begin batch %d", type(self).__name__, txid)

    def commit(self, txid: int) -> None:
        """Close batch ``txid`` (the one opened by :meth:`begin_commit`)."""
        open_txid = self._require_batch("commit")
        if txid != open_txid:
            raise StateError(f"{type(self).__name__}.commit({txid}) but the open batch is {open_txid}")
        logger.debug("%s: commit batch %d (%d keys written)", type(self).__name__, txid, len(self._written))
        self._reset(None)

    def written_keys(self) -> list[Key]:
        """Keys written by the open batch, in the order they were first written."""
        return list(self._written)

    def multi_get(self, keys: Sequence[Key]) -> list[Any]:
        """The current value of each key (None where absent), seeing this batch's writes."""
        txid = self._require_batch("multi_get")
        norm = [as_key(key) for key in keys]
        result = []
        for key, stored in zip(norm, self._read(norm), strict=True):
            with _about(key):
                result.append(self._value(stored, key in self._written, txid))
        return result

    def multi_put(self, keys: Sequence[Key], values: Sequence[Any]) -> None:
        """Set each key to a value, under the same txid rules as :meth:`multi_update`."""
        check_same_length(keys, values, f"{type(self).__name__}.multi_put")
        self._apply(keys, [_constant(value) for value in values], "multi_put")

    def multi_update(self, keys: Sequence[Key], fns: Sequence[UpdateFn]) -> list[Any]:
        """Apply one function per key to its current value; returns the new values.

        Keys may repeat: later functions see the results of earlier ones. If any key fails
        the txid check nothing is written.

        Example:
            >>> state = TransactionalMapState(MemoryBackingMap())
            >>> state.begin_commit(1)
            >>> state.multi_update([("a",), ("a",)], [lambda v: (v or 0) + 1, lambda v: v + 2])
            [1, 3]
            >>> state.commit(1)
        """
        check_same_length(keys, fns, f"{type(self).__name__}.multi_update")
        return self._apply(keys, fns, "multi_update")

    # --- the rules, per state type ----------------------------------------------------------

    @abstractmethod
    def _unwrap(self, stored: Any, written: bool, txid: int) -> Any:
        """The value batch ``txid`` sees for a stored (non-None) wrapped value."""

    @abstractmethod
    def _wrap(self, stored: Any | None, txid: int, new: Any) -> Any:
        """The wrapped value to store after batch ``txid`` computed ``new``."""

    def _skips(self, stored: Any, written: bool, txid: int) -> bool:
        """Whether batch ``txid`` must leave the stored (non-None) value as it is."""
        return False

    # --- shared machinery -------------------------------------------------------------------

    def _value(self, stored: Any | None, written: bool, txid: int) -> Any:
        return None if stored is None else self._unwrap(stored, written, txid)

    def _apply(self, keys: Sequence[Key], fns: Sequence[UpdateFn], what: str) -> list[Any]:
        txid = self._require_batch(what)
        norm = [as_key(key) for key in keys]
        self._read(norm)
        staged: dict[Key, Any] = {}  # what this call writes; a repeated key sees its staged value
        results = []
        for key, fn in zip(norm, fns, strict=True):
            stored = staged[key] if key in staged else self._cache[key]
            written = key in staged or key in self._written
            with _about(key):
                if stored is not None and self._skips(stored, written, txid):
                    results.append(self._value(stored, written, txid))
                    continue
                new = fn(_detached(self._value(stored, written, txid)))
                staged[key] = self._wrap(stored, txid, new)
            results.append(new)
        if staged:
            self._backing.multi_put(list(staged), list(staged.values()))
            self._cache.update(staged)
            self._written.update(dict.fromkeys(staged))
        return results

    def _read(self, keys: list[Key]) -> list[Any | None]:
        """Stored values of ``keys``, fetching the ones this batch has not seen in one call."""
        missing = list(dict.fromkeys(key for key in keys if key not in self._cache))
        if missing:
            for key, stored in zip(missing, self._backing.multi_get(missing), strict=True):
                self._check_kind(key, stored)
                self._cache[key] = stored
        return [self._cache[key] for key in keys]

    def _check_kind(self, key: Key, stored: Any) -> None:
        if stored is not None and self._kind is not None and not isinstance(stored, self._kind):
            raise StateError(
                f"{type(self).__name__}: key {key!r} holds a {type(stored).__name__}, not a "
                f"{self._kind.__name__}; the store was written by another kind of state. Use the "
                "state kind the store was built with, or rebuild the store."
            )

    def _require_batch(self, what: str) -> int:
        if self._txid is None:
            raise StateError(
                f"{type(self).__name__}.{what} called outside a batch; call begin_commit(txid) first "
                "and commit(txid) after the batch's reads and writes"
            )
        return self._txid

    def _reset(self, txid: int | None) -> None:
        self._txid = txid
        self._cache.clear()
        self._written.clear()


class TransactionalMapState(_BatchMapState):
    """Exactly-once state for transactional spouts: a batch already applied is skipped.

    Stores :class:`TransactionalValue`. Requires that a replayed batch has exactly the same
    input as the first run (a transactional spout).

    Puts follow the same rule as updates: a put of a key the stored txid says this batch
    already wrote is skipped (Trident writes it again; a replay puts the same value, so the
    result is the same), and a put under an older txid is refused.
    """

    _kind = TransactionalValue

    def _unwrap(self, stored: TransactionalValue, written: bool, txid: int) -> Any:
        return stored.val

    def _wrap(self, stored: TransactionalValue | None, txid: int, new: Any) -> TransactionalValue:
        return TransactionalValue(txid, new)

    def _skips(self, stored: TransactionalValue, written: bool, txid: int) -> bool:
        if stored.txid > txid:
            raise TxidOrderError(
                f"batch txid {txid} is older than the stored txid {stored.txid}; an older batch is never "
                "applied. Restore the state from the state topic at the committed txid."
            )
        return stored.txid == txid and not written


class OpaqueMapState(_BatchMapState):
    """Exactly-once state for opaque spouts: a replayed batch is recomputed from ``prev``.

    Stores :class:`OpaqueValue`. A replay may carry different input than the first run; the
    stored previous value makes the replay replace, not add to, the first run's effect.
    :meth:`multi_get` of a key this batch has not written yet returns the value before the
    batch (``prev`` on a replay), as Trident's OpaqueMap does.
    """

    _kind = OpaqueValue

    def _unwrap(self, stored: OpaqueValue, written: bool, txid: int) -> Any:
        return stored.curr if written else stored.get(txid)

    def _wrap(self, stored: OpaqueValue | None, txid: int, new: Any) -> OpaqueValue:
        return OpaqueValue(txid, new) if stored is None else stored.update(txid, new)


class MapState(_BatchMapState):
    """At-least-once (non-transactional) state: every update is applied, replays included.

    Stores plain values, like Trident's NonTransactionalMap: a replayed batch counts again.
    An update returning None deletes the key.
    """

    def _unwrap(self, stored: Any, written: bool, txid: int) -> Any:
        return stored

    def _wrap(self, stored: Any | None, txid: int, new: Any) -> Any:
        return new


def _constant(value: Any) -> UpdateFn:
    """The update function that sets ``value`` whatever the current value is."""

    def put(_current: Any) -> Any:
        return value

    return put
