"""A keyed batch of int partials added to an opaque or transactional store, column-wise.

The keyed stage of a Count or a Sum over ints applies up to 100k combined partials per batch.
Per key in Python (:class:`~stream_ops.state.map_states.OpaqueMapState` with one update
function and one wrapped value object per key) that costs seconds; here the stored values are
read in one multi-get, decoded by Arrow's JSON reader and combined with numpy under the same
txid rules (Trident's):

=============  ==============================  =========================================
stored txid    transactional                   opaque
=============  ==============================  =========================================
absent         ``(txid, p)``                   ``(txid, curr=p, prev=None)``
< batch        ``(txid, val + p)``             ``(txid, curr + p, prev=curr)``
== batch       skipped (not written)           ``(txid, prev + p, prev)`` (recomputed)
=============  ==============================  =========================================

(a null base counts as 0, as ``CombinerAggregator.apply`` does). Any batch this does not cover
exactly — a partial that is not a 64-bit int, a repeated key, a stored value that is not of the
state's kind with int fields, a stored txid above the batch's, a sum beyond 64 bits, writes
already buffered in the store — returns None, and the caller takes the per-key path, which
also raises the errors those cases call for.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import is_not
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from stream_ops.state.rocksdb_backing import RocksDBBackingMap
from stream_ops.state.value_columns import ChangeColumns

logger = logging.getLogger(__name__)

_FIELDS = {"op": ("txid", "curr", "prev"), "tx": ("txid", "val")}


@dataclass(frozen=True)
class ColumnUpdate:
    """The outcome of :func:`add_int_partials`.

    Attributes:
        changes: the keys written and their stored values, in input order (what the state
            topic and RocksDB receive).
        new_values: each input key's value after the batch (a skipped key's stored value).
    """

    changes: ChangeColumns
    new_values: list[Any]


def add_int_partials(
    store: RocksDBBackingMap, kind: str, txid: int, key_texts: Sequence[str], partials: Sequence[Any]
) -> ColumnUpdate | None:
    """Add int ``partials`` to the stored values of ``key_texts`` under batch ``txid``'s rules.

    Nothing is written: the caller appends ``changes`` to the state topic and then writes them
    to the store (``store.flush(txid, epoch, encoded=changes)``).

    Args:
        store: the task's store, with no writes buffered.
        kind: ``"op"`` (opaque state) or ``"tx"`` (transactional state).
        txid: the batch.
        key_texts: each key's ``encode_key`` text, distinct.
        partials: one combined partial per key.

    Returns:
        The update, or None when the batch is not one this covers (module docstring).
    """
    n = len(key_texts)
    if kind not in _FIELDS or n == 0 or n != len(partials) or store.has_pending():
        return None
    if set(map(type, partials)) != {int} or len(set(key_texts)) != n:
        return None
    try:
        added = np.array(partials, dtype=np.int64)
    except OverflowError:
        return None
    key_bytes = [text.encode("utf-8") for text in key_texts]
    raw = store.get_encoded(key_bytes)
    present = np.fromiter(map(is_not, raw, repeat(None)), dtype=bool, count=n)
    stored = _decode(kind, [data for data in raw if data is not None])
    if stored is None:
        return None
    stored_txid = _spread(stored["txid"], present, n)
    if stored_txid[1].sum() != present.sum() or (stored_txid[0] > txid).any() or (stored_txid[0] < 0).any():
        return None  # a stored value without a valid txid, or a newer batch's: the per-key path says why
    same = present & (stored_txid[0] == txid)
    keys = pa.array(key_texts, pa.string())
    if kind == "op":
        curr, prev = _spread(stored["curr"], present, n), _spread(stored["prev"], present, n)
        base = np.where(same, prev[0], curr[0])
        base_valid = np.where(same, prev[1], curr[1])
        new = _add(base, base_valid, added)
        if new is None:
            return None
        values = _join(f'{{"k":"op","txid":{txid},"curr":', new, ',"prev":', pa.array(base, mask=~base_valid), "}")
        return ColumnUpdate(ChangeColumns(keys, values), new.tolist())
    val = _spread(stored["val"], present, n)
    new = _add(val[0], val[1], added)
    if new is None:
        return None
    written = ~same
    values = _join(f'{{"k":"tx","txid":{txid},"val":', new[written], "}")
    new_values: list[Any] = pa.array(np.where(same, val[0], new), mask=same & ~val[1]).to_pylist()
    return ColumnUpdate(ChangeColumns(keys.filter(pa.array(written)), values), new_values)


def _decode(kind: str, data: list[bytes]) -> dict[str, pa.Array] | None:
    """The int fields of stored values of ``kind`` (JSON objects), or None if any is not one."""
    fields = _FIELDS[kind]
    if not data:
        return {name: pa.array([], pa.int64()) for name in fields}
    schema = pa.schema([("k", pa.string())] + [(name, pa.int64()) for name in fields])
    options = pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="error")
    try:
        table = pa_json.read_json(pa.BufferReader(b"\n".join(data)), parse_options=options)
    except (pa.ArrowException, ValueError):
        return None
    if table.num_rows != len(data) or table["k"].null_count or not pc.all(pc.equal(table["k"], kind)).as_py():
        return None
    return {name: table[name].combine_chunks() for name in fields}


def _spread(column: pa.Array, present: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A column of the present keys' values over all ``n`` keys: (values, valid), 0 / False elsewhere."""
    values = np.zeros(n, dtype=np.int64)
    valid = np.zeros(n, dtype=bool)
    values[present] = column.fill_null(0).to_numpy(zero_copy_only=False)
    valid[present] = column.is_valid().to_numpy(zero_copy_only=False)
    return values, valid


def _add(base: np.ndarray, valid: np.ndarray, added: np.ndarray) -> np.ndarray | None:
    """``base + added`` with a null base as 0, or None if a sum leaves 64 bits."""
    base = np.where(valid, base, 0)
    with np.errstate(over="ignore"):
        total = base + added
    if (((base ^ total) & (added ^ total)) < 0).any():
        return None
    return total


def _join(*parts: Any) -> pa.Array:
    """Text pieces and int columns (numpy or Arrow, nulls as ``null``) joined element-wise."""
    columns = []
    for part in parts:
        if isinstance(part, str):
            columns.append(part)
            continue
        text = pc.cast(pa.array(part, pa.int64()), pa.string())
        columns.append(text.fill_null("null") if text.null_count else text)
    return pc.binary_join_element_wise(*columns, "")
