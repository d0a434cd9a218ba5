"""Wrapped state values (Trident's TransactionalValue / OpaqueValue) and their JSON codec.

A backing map stores values *wrapped* with the txid of the batch that wrote them, so that a
replayed batch can be recognised:

* :class:`TransactionalValue` — ``(txid, val)``: a batch whose txid equals the stored one has
  already been applied and is skipped.
* :class:`OpaqueValue` — ``(txid, curr, prev)``: a batch whose txid equals the stored one is
  recomputed from ``prev`` (the value before that batch), so it may produce a different result.
* anything else is a plain (non-transactional) value.

The codec writes one JSON object per value, tagged by kind::

    {"k": "tx", "txid": 7, "val": 3}
    {"k": "op", "txid": 7, "curr": 3, "prev": 1}
    {"k": "raw", "val": 3}

JSON has no tuples: a tuple inside a value comes back as a list.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stream_ops.errors import StateError, TxidOrderError


def _check_txid(txid: Any, what: str) -> None:
    if not isinstance(txid, int) or isinstance(txid, bool) or txid < 0:
        raise StateError(f"{what} txid must be a non-negative integer, got {txid!r}")


@dataclass(frozen=True)
class TransactionalValue:
    """A value with the txid of the batch that last changed it (transactional state).

    Example:
        >>> TransactionalValue(txid=4, val=10)
        TransactionalValue(txid=4, val=10)
    """

    txid: int
    val: Any

    def __post_init__(self) -> None:
        _check_txid(self.txid, "TransactionalValue")


@dataclass(frozen=True)
class OpaqueValue:
    """The current and previous value with the txid of the batch that produced ``curr``.

    Example:
        >>> v = OpaqueValue(txid=4, curr=10, prev=7)
        >>> v.get(5), v.get(4)
        (10, 7)
        >>> v.update(5, 12)
        OpaqueValue(txid=5, curr=12, prev=10)
    """

    txid: int
    curr: Any
    prev: Any = None

    def __post_init__(self) -> None:
        _check_txid(self.txid, "OpaqueValue")

    def get(self, batch_txid: int | None) -> Any:
        """The value a batch must start from.

        Args:
            batch_txid: the txid of the batch reading the value, or None for "latest".

        Returns:
            ``curr`` for None or a newer batch; ``prev`` for a replay of the batch that
            produced ``curr``.

        Raises:
            TxidOrderError: if ``batch_txid`` is older than the stored txid.
        """
        if batch_txid is None or batch_txid > self.txid:
            return self.curr
        if batch_txid == self.txid:
            return self.prev
        raise _older_batch(batch_txid, self.txid)

    def update(self, batch_txid: int, value: Any) -> OpaqueValue:
        """The value after batch ``batch_txid`` produced ``value``.

        A replay of the stored batch replaces ``curr`` and keeps ``prev``; a newer batch moves
        ``curr`` to ``prev``.

        Raises:
            TxidOrderError: if ``batch_txid`` is older than the stored txid.
        """
        if batch_txid == self.txid:
            return OpaqueValue(self.txid, value, self.prev)
        if batch_txid > self.txid:
            return OpaqueValue(batch_txid, value, self.curr)
        raise _older_batch(batch_txid, self.txid)


def _older_batch(batch_txid: int, stored_txid: int) -> TxidOrderError:
    return TxidOrderError(
        f"batch txid {batch_txid} is older than the stored txid {stored_txid}; an older batch is never "
        "applied. The stream's checkpoint is behind its state: restore the state from the state topic "
        "at the committed txid, or reset checkpoint and state together."
    )


def to_json_obj(value: Any) -> dict[str, Any]:
    """The tagged JSON object of a wrapped (or plain) value; see the module docstring."""
    if isinstance(value, TransactionalValue):
        return {"k": "tx", "txid": value.txid, "val": value.val}
    if isinstance(value, OpaqueValue):
        return {"k": "op", "txid": value.txid, "curr": value.curr, "prev": value.prev}
    return {"k": "raw", "val": value}


_FIELDS = {"tx": ("txid", "val"), "op": ("txid", "curr", "prev"), "raw": ("val",)}


def from_json_obj(obj: Mapping[str, Any]) -> Any:
    """The value of a tagged JSON object written by :func:`to_json_obj`.

    Raises:
        StateError: if the object is not a tagged value or lacks a field of its kind.
    """
    if not isinstance(obj, Mapping) or obj.get("k") not in _FIELDS:
        raise StateError(f"not a stored state value (expected a JSON object with k in tx/op/raw): {obj!r}")
    kind = obj["k"]
    missing = [name for name in _FIELDS[kind] if name not in obj]
    if missing:
        raise StateError(f"stored state value of kind {kind!r} lacks {', '.join(missing)}: {obj!r}")
    if kind == "tx":
        return TransactionalValue(obj["txid"], obj["val"])
    if kind == "op":
        return OpaqueValue(obj["txid"], obj["curr"], obj["prev"])
    return obj["val"]


def encode_stored(value: Any) -> bytes:
    """UTF-8 JSON bytes of a wrapped (or plain) value.

    Raises:
        StateError: if the value is not JSON-serialisable.
    """
    try:
        return json.dumps(to_json_obj(value), separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise StateError(f"state value is not JSON-serialisable: {value!r}: {e}") from e


def decode_stored(data: bytes) -> Any:
    """The value encoded by :func:`encode_stored`.

    Raises:
        StateError: if ``data`` is not a stored value.
    """
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StateError(f"stored state value is not JSON: {data[:80]!r}: {e}") from e
    return from_json_obj(obj)
