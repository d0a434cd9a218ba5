"""A keyed stage's update of its map state with a batch's combined partials (step 2 on the
driver, Trident's txid rules), and what the update tells step 4 about the changes it made.

A partial that cannot be combined (null, or of a type the aggregator rejects) goes to the
batch's dead letters with the reason instead of failing the batch on every replay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stream_ops.operators.aggregators import Count, Max, Min, Sum, aggregator_from_spec
from stream_ops.runtime.computed_batch import ComputedBatch
from stream_ops.runtime.task_state import TaskState
from stream_ops.state.column_update import add_int_partials
from stream_ops.state.key_texts import decode_key_texts
from stream_ops.state.map_states import OpaqueMapState, TransactionalMapState
from stream_ops.state.rocksdb_backing import RocksDBBackingMap
from stream_ops.state.value_columns import ChangeColumns
from stream_ops.topology.plan import StageSpec


class MapStateUpdate:
    """Applies a keyed stage's batches to its map state.

    Between a batch's update and its state-topic append (step 4) it holds what spares that
    append encoding the changes again: the shuffled key texts of the keys it updated, or the
    changes a column-wise update wrote past the store's buffer.
    """

    def __init__(self, stage: StageSpec) -> None:
        self.stage = stage
        self.aggregator = aggregator_from_spec(stage.state.aggregator) if stage.state else None
        # (txid, keys, their shuffled key texts) of the map-state update, for the commit's encoding
        self._key_texts: tuple[int, list[tuple[Any, ...]], list[str]] | None = None
        # (txid, changes) of a column-wise map-state update, which bypasses the store's buffer
        self._column_changes: tuple[int, ChangeColumns] | None = None

    def apply(self, batch: ComputedBatch, txid: int, state: TaskState | None) -> None:
        """Apply a keyed stage's combined partials to its map state (Trident's txid rules);
        with a ``new_values()`` stream, its input is each updated key with its new value."""
        assert state is not None and state.map_state is not None and self.stage.state is not None
        keys: list[tuple[Any, ...]] = []
        texts: list[str] = []
        updates: list[Callable[[Any], Any]] = []
        partials = batch.partials
        # One parse of all the keys (each is a JSON array) instead of one json.loads per key.
        decoded, canonical = decode_key_texts([encoded for encoded, _ in partials])
        map_state = state.map_state
        self._key_texts = self._column_changes = None
        if canonical and self._update_columnwise(batch, txid, decoded, state):
            return
        combinable = _combinable_types(self.aggregator)
        for (text, value), fields in zip(partials, decoded, strict=True):
            key = tuple(fields)
            if type(value) not in combinable and (problem := _uncombinable(self.aggregator, value)) is not None:
                batch.dead.append({"record": {"key": fields, "partial": value}, "error": problem})
                continue
            keys.append(key)
            texts.append(text)
            updates.append(_combiner(self.aggregator, key, value, batch.dead))
        map_state.begin_commit(txid)
        new_values = map_state.multi_update(keys, updates)
        # the store's key texts already, so the commit writes them as they are
        self._key_texts = (txid, keys, texts) if canonical else None
        self._set_new_values(batch, keys, new_values)

    def take_column_changes(self) -> tuple[int, ChangeColumns] | None:
        """(txid, changes) of the last update if it ran column-wise, then forgotten."""
        held, self._column_changes = self._column_changes, None
        return held

    def shuffled_key_texts(self, txid: int, keys: list[tuple[Any, ...]]) -> list[str] | None:
        """The shuffled texts of the batch's changed ``keys`` when the map-state update wrote
        exactly the keys it was given, in order (a skipped replay or a nested key does not);
        else None and the keys are encoded again. Forgotten once asked for."""
        held, self._key_texts = self._key_texts, None
        if held is None or held[0] != txid or held[1] != keys:
            return None
        return held[2]

    def _update_columnwise(self, batch: ComputedBatch, txid: int, decoded: list[Any], state: TaskState) -> bool:
        """The map-state update of a Count or Sum over int partials on opaque or transactional
        state, column-wise (:mod:`~stream_ops.state.column_update`); False when the batch is
        not one it covers (the per-key update then runs)."""
        assert state.map_state is not None
        map_state = state.map_state
        kind = {OpaqueMapState: "op", TransactionalMapState: "tx"}.get(type(map_state))
        store = state.store
        if kind is None or type(self.aggregator) not in (Count, Sum) or not isinstance(store, RocksDBBackingMap):
            return False
        partials = batch.partials
        update = add_int_partials(store, kind, txid, [text for text, _ in partials], [value for _, value in partials])
        if update is None:
            return False
        map_state.begin_commit(txid)  # nothing goes through it; the commit closes the batch as usual
        self._column_changes = (txid, update.changes)
        self._set_new_values(batch, [tuple(fields) for fields in decoded] if self.stage.outputs else [], update.new_values)
        return True

    def _set_new_values(self, batch: ComputedBatch, keys: list[tuple[Any, ...]], new_values: list[Any]) -> None:
        """The batch's updated-key count and, with a ``new_values()`` stream, its input records."""
        batch.updated_keys = len(new_values)
        if self.stage.outputs:
            spec = self.stage.state
            assert spec is not None
            batch.records = [
                {**dict(zip(spec.key_fields, key, strict=True)), spec.value_field: value}
                for key, value in zip(keys, new_values, strict=True)
            ]
            batch.driver_operations = True


def _combinable_types(aggregator: Any) -> tuple[type, ...]:
    """Partial types a built-in aggregator always combines into a state (no per-key check)."""
    if type(aggregator) in (Count, Sum):
        return (int, float)  # 0 + partial
    if type(aggregator) in (Min, Max):
        return (int, float, str)  # the partial itself for a new key
    return ()


def _uncombinable(aggregator: Any, partial: Any) -> str | None:
    """Why a shuffled partial cannot be combined into a state, or None if it can."""
    if partial is None:
        return "the partial aggregate is null (a null field reached the aggregator)"
    try:
        aggregator.apply(None, partial)
    except Exception as e:  # noqa: BLE001 - reported as a dead letter
        return f"the partial aggregate cannot be combined: {type(e).__name__}: {e}"
    return None


def _combiner(aggregator: Any, key: tuple[Any, ...], partial: Any, dead: list[dict[str, Any]]) -> Callable[[Any], Any]:
    """The map-state update of one key; a combine that fails leaves the value as it was and
    sends the partial to ``dead``."""

    def combine(current: Any) -> Any:
        try:
            return aggregator.apply(current, partial)
        except Exception as e:  # noqa: BLE001 - reported as a dead letter
            dead.append({"record": {"key": list(key), "partial": partial}, "error": f"combine: {type(e).__name__}: {e}"})
            return current

    return combine
