"""A batch's state changes as two Arrow string columns, and a column-wise ``encode_stored``.

The commit path writes every changed key twice, to the state topic and to RocksDB, as the
key's ``encode_key`` text and the value's :func:`~stream_ops.state.values.encode_stored` text.
At 100k keys encoding one value at a time in Python costs far more than both writes, so the
values of the common case — all :class:`TransactionalValue` or all :class:`OpaqueValue`
holding integers — are encoded column-wise in Arrow (:func:`encode_stored_column`); any other
batch is encoded per value by the caller. Both give the same bytes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stream_ops.state.values import OpaqueValue, TransactionalValue

_INT_OR_NULL = frozenset({int, type(None)})
# a kind's JSON text around its fields, in to_json_obj's field order
_TEMPLATES: dict[type, tuple[tuple[str, str], ...]] = {
    TransactionalValue: (("txid", '{"k":"tx","txid":'), ("val", ',"val":')),
    OpaqueValue: (("txid", '{"k":"op","txid":'), ("curr", ',"curr":'), ("prev", ',"prev":')),
}


@dataclass(frozen=True)
class ChangeColumns(Sequence[tuple[str, str | None]]):
    """A batch's (key text, stored value text or None for a deletion) pairs, held as columns.

    It is the sequence of pairs :func:`~stream_ops.state.state_topic.encode_items` returns,
    so any consumer of pairs takes it; the file state topic and RocksDB read the columns.
    """

    keys: pa.StringArray
    values: pa.StringArray

    def __len__(self) -> int:
        return len(self.keys)

    @overload
    def __getitem__(self, index: int) -> tuple[str, str | None]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[str, str | None]]: ...

    def __getitem__(self, index: int | slice) -> tuple[str, str | None] | list[tuple[str, str | None]]:
        if isinstance(index, slice):
            return list(zip(self.keys[index].to_pylist(), self.values[index].to_pylist(), strict=True))
        return self.keys[index].as_py(), self.values[index].as_py()

    def __iter__(self) -> Iterator[tuple[str, str | None]]:
        return zip(self.keys.to_pylist(), self.values.to_pylist(), strict=True)

    def key_bytes(self) -> np.ndarray:
        """The keys as the UTF-8 bytes a store keeps (an object array of bytes)."""
        return _as_bytes(self.keys)

    def value_bytes(self) -> np.ndarray:
        """The values as the UTF-8 bytes a store keeps (an object array of bytes, None deletes the key)."""
        return _as_bytes(self.values)


def _as_bytes(column: pa.StringArray) -> np.ndarray:
    if not len(column):
        return np.empty(0, dtype=object)
    data: np.ndarray = column.cast(pa.binary()).to_numpy(zero_copy_only=False)
    return data


def encode_stored_column(values: Sequence[Any]) -> pa.StringArray | None:
    """``[encode_stored(v).decode() for v in values]`` as one Arrow column, computed column-wise.

    Covers a batch whose values are all :class:`TransactionalValue` or all
    :class:`OpaqueValue` with int (or None) fields that fit in 64 bits; returns None for any
    other batch (floats, strings, containers, plain values, deletions, big ints, a mix of
    kinds), which the caller encodes per value.
    """
    if not values:
        return None
    kinds = set(map(type, values))
    if len(kinds) != 1:
        return None
    template = _TEMPLATES.get(kinds.pop())
    if template is None:
        return None
    parts: list[Any] = []
    text = ""  # constant text since the last column, joined once
    for name, prefix in template:
        text += prefix
        column = list(map(attrgetter(name), values))
        if name == "txid" and len(txids := set(column)) == 1 and type(txid := txids.pop()) is int:
            text += str(txid)  # the usual case: one batch wrote every value
            continue
        if not _INT_OR_NULL.issuperset(map(type, column)):
            return None
        try:
            numbers = pc.cast(pa.array(column, pa.int64()), pa.string())
        except (pa.ArrowException, OverflowError):  # an int beyond 64 bits
            return None
        parts.append(text)
        parts.append(pc.fill_null(numbers, "null") if numbers.null_count else numbers)
        text = ""
    parts.append(text + "}")
    return pc.binary_join_element_wise(*parts, "")
