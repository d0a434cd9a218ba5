"""The column-wise update of int partials ends where the per-key map states do, replays included."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from stream_ops.errors import StateError
from stream_ops.hashing import encode_key
from stream_ops.operators.aggregators import Count
from stream_ops.state.column_update import add_int_partials
from stream_ops.state.map_states import OpaqueMapState, TransactionalMapState
from stream_ops.state.rocksdb_backing import RocksDBBackingMap
from stream_ops.state.state_topic import encode_changes, encode_items
from stream_ops.state.values import OpaqueValue, TransactionalValue

STATES = {"op": OpaqueMapState, "tx": TransactionalMapState}


def _batches() -> list[tuple[int, dict[str, int]]]:
    """Batches over 40 keys, each txid replayed once or twice with other keys and partials."""
    rng = random.Random(5)
    words = [f"w{i}" for i in range(40)]
    batches = []
    for txid in (0, 1, 1, 2, 4, 4, 4, 9):
        keys = rng.sample(words, rng.randint(1, 30))
        batches.append((txid, {key: rng.choice([0, 1, -3, rng.randint(-(10**9), 10**9)]) for key in keys}))
    return batches


@pytest.mark.parametrize("kind", ["op", "tx"])
def test_replayed_batches_give_the_per_key_paths_values_and_bytes(kind: str, tmp_path: Path) -> None:
    count = Count()
    with RocksDBBackingMap(tmp_path / "per-key") as per_key, RocksDBBackingMap(tmp_path / "columns") as columns:
        state = STATES[kind](per_key)
        for txid, partials in _batches():
            keys = [(word,) for word in partials]
            state.begin_commit(txid)
            expected = state.multi_update(keys, [lambda v, p=p: count.apply(v, p) for p in partials.values()])
            encoded = encode_items(per_key.pending_items())
            per_key.flush(txid, 1, encoded=encoded)
            state.commit(txid)

            update = add_int_partials(columns, kind, txid, [encode_key(key) for key in keys], list(partials.values()))
            assert update is not None
            assert update.new_values == expected
            assert list(update.changes) == encoded
            columns.flush(txid, 1, encoded=update.changes)
            assert list(columns.items()) == list(per_key.items())
        assert columns.applied_marker() == per_key.applied_marker()


def test_batches_it_does_not_cover_are_left_to_the_per_key_path(tmp_path: Path) -> None:
    with RocksDBBackingMap(tmp_path / "db") as store:
        store.multi_put([("a",), ("b",)], [OpaqueValue(3, 2**63 - 1, 1), OpaqueValue(3, 1.5, 1)])
        assert add_int_partials(store, "op", 4, ['["c"]'], [1]) is None  # writes buffered
        store.flush(3, 1)
        assert add_int_partials(store, "op", 4, ['["a"]'], [1]) is None  # beyond 64 bits
        assert add_int_partials(store, "op", 4, ['["b"]'], [1]) is None  # a float stored
        assert add_int_partials(store, "op", 2, ['["c"]', '["a"]'], [1, 1]) is None  # a newer txid stored
        assert add_int_partials(store, "tx", 4, ['["c"]', '["a"]'], [1, 1]) is None  # another kind stored
        assert add_int_partials(store, "op", 4, ['["c"]'], [1.0]) is None  # a float partial
        assert add_int_partials(store, "op", 4, ['["c"]'], [True]) is None
        assert add_int_partials(store, "op", 4, ['["c"]', '["c"]'], [1, 1]) is None  # a repeated key
        update = add_int_partials(store, "op", 4, ['["c"]', '["a"]'], [2, -5])
        assert update is not None and update.new_values == [2, 2**63 - 6]
        assert list(update.changes) == encode_items(
            [(("c",), OpaqueValue(4, 2, None)), (("a",), OpaqueValue(4, 2**63 - 6, 2**63 - 1))]
        )
        assert add_int_partials(store, "tx", 4, ['["d"]'], [1]) is not None  # only absent keys
        assert list(add_int_partials(store, "tx", 4, ['["d"]'], [1]).changes) == encode_items(  # type: ignore[union-attr]  # not None, checked above
            [(("d",), TransactionalValue(4, 1))]
        )


def test_flushing_pending_columns_writes_puts_and_deletes_as_the_pairs_do(tmp_path: Path) -> None:
    with RocksDBBackingMap(tmp_path / "db") as store:
        store.multi_put([("a",), ("b",)], [OpaqueValue(1, 1, None), OpaqueValue(1, 2, None)])
        store.flush(1, 1)
        store.multi_put([("c",), ("a",)], [OpaqueValue(2, 3, None), OpaqueValue(2, 4, 1)])
        store.delete([("b",)])
        encoded = encode_changes(*store.pending_columns())
        assert list(encoded) == encode_items(store.pending_items())
        with pytest.raises(StateError, match="got 3 keys but 1 encoded changes"):
            store.flush(2, 1, encoded=encode_changes([("c",)], [OpaqueValue(2, 3, None)]))
        store.flush(2, 1, encoded=encoded)
        assert dict(store.items()) == {("a",): OpaqueValue(2, 4, 1), ("c",): OpaqueValue(2, 3, None)}
