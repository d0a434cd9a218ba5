"""Map states: Trident's txid rules, the batch read cache and replay equivalence."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from stream_ops.errors import StateError, TxidOrderError
from stream_ops.state import (
    MapState,
    MemoryBackingMap,
    OpaqueMapState,
    OpaqueValue,
    RocksDBBackingMap,
    TransactionalMapState,
    TransactionalValue,
)

A, B = ("a",), ("b",)
STATE_KINDS = [TransactionalMapState, OpaqueMapState, MapState]


def add(n: int) -> Callable[[Any], Any]:
    return lambda v: (v or 0) + n


def seeded(**values: Any) -> MemoryBackingMap:
    backing = MemoryBackingMap()
    backing.multi_put([(k,) for k in values], list(values.values()))
    return backing


def run_batch(state: Any, txid: int, updates: Sequence[Sequence[tuple[tuple, int]]]) -> list[list[Any]]:
    """One batch of several multi_update calls, each a list of (key, increment)."""
    state.begin_commit(txid)
    results = [state.multi_update([k for k, _ in call], [add(n) for _, n in call]) for call in updates]
    state.commit(txid)
    return results


# --- transactional --------------------------------------------------------------------------


def test_transactional_applies_to_absent_and_older_values() -> None:
    backing = seeded(a=TransactionalValue(4, 10))
    state = TransactionalMapState(backing)
    state.begin_commit(5)
    assert state.multi_update([A, B], [add(1), add(7)]) == [11, 7]
    state.commit(5)
    assert backing.multi_get([A, B]) == [TransactionalValue(5, 11), TransactionalValue(5, 7)]


def test_transactional_skips_a_batch_equal_to_the_stored_txid() -> None:
    backing = seeded(a=TransactionalValue(5, 10))
    state = TransactionalMapState(backing)
    state.begin_commit(5)
    assert state.multi_update([A], [add(1)]) == [10]
    assert state.multi_get([A]) == [10]
    state.commit(5)
    assert backing.multi_get([A]) == [TransactionalValue(5, 10)]


def test_transactional_refuses_an_older_batch_and_writes_nothing() -> None:
    backing = seeded(a=TransactionalValue(4, 1), b=TransactionalValue(6, 2))
    state = TransactionalMapState(backing)
    state.begin_commit(5)
    with pytest.raises(TxidOrderError, match=r"\('b',\).*batch txid 5 .* stored txid 6"):
        state.multi_update([A, B], [add(1), add(1)])
    assert backing.multi_get([A, B]) == [TransactionalValue(4, 1), TransactionalValue(6, 2)]
    assert state.written_keys() == []


def test_transactional_put_follows_the_txid_rules() -> None:
    backing = seeded(a=TransactionalValue(5, 10), b=TransactionalValue(9, 0))
    state = TransactionalMapState(backing)
    state.begin_commit(5)
    state.multi_put([A], [99])  # already applied by batch 5: skipped
    assert backing.multi_get([A]) == [TransactionalValue(5, 10)]
    with pytest.raises(TxidOrderError):
        state.multi_put([B], [1])


# --- opaque ---------------------------------------------------------------------------------


def test_opaque_applies_to_absent_and_older_values() -> None:
    backing = seeded(a=OpaqueValue(4, 10, 3))
    state = OpaqueMapState(backing)
    state.begin_commit(5)
    assert state.multi_update([A, B], [add(1), add(7)]) == [11, 7]
    state.commit(5)
    assert backing.multi_get([A, B]) == [OpaqueValue(5, 11, 10), OpaqueValue(5, 7, None)]


def test_opaque_recomputes_an_equal_batch_from_prev() -> None:
    backing = seeded(a=OpaqueValue(5, 11, 10))
    state = OpaqueMapState(backing)
    state.begin_commit(5)
    assert state.multi_get([A]) == [10]  # the value before batch 5
    assert state.multi_update([A], [add(4)]) == [14]
    assert state.multi_get([A]) == [14]
    state.commit(5)
    assert backing.multi_get([A]) == [OpaqueValue(5, 14, 10)]


def test_opaque_refuses_an_older_batch_and_writes_nothing() -> None:
    backing = seeded(a=OpaqueValue(4, 1), b=OpaqueValue(6, 2, 1))
    state = OpaqueMapState(backing)
    state.begin_commit(5)
    with pytest.raises(TxidOrderError, match=r"\('b',\).*batch txid 5 .* stored txid 6"):
        state.multi_update([A, B], [add(1), add(1)])
    assert backing.multi_get([A, B]) == [OpaqueValue(4, 1), OpaqueValue(6, 2, 1)]


def test_opaque_put_on_a_replay_keeps_prev() -> None:
    backing = seeded(a=OpaqueValue(5, 11, 10))
    state = OpaqueMapState(backing)
    state.begin_commit(5)
    state.multi_put([A], [3])
    assert backing.multi_get([A]) == [OpaqueValue(5, 3, 10)]


def test_opaque_update_that_mutates_its_input_cannot_change_prev() -> None:
    backing = seeded(a=OpaqueValue(4, {"n": 1}, None))
    state = OpaqueMapState(backing)

    def bump(v: dict) -> dict:
        v["n"] += 1
        return v

    state.begin_commit(5)
    state.multi_update([A], [bump])
    assert backing.multi_get([A]) == [OpaqueValue(5, {"n": 2}, {"n": 1})]


# --- non-transactional ----------------------------------------------------------------------


@pytest.mark.parametrize("stored_txid_batch", [4, 5, 6])
def test_non_transactional_always_applies(stored_txid_batch: int) -> None:
    backing = seeded(a=10)
    state = MapState(backing)
    state.begin_commit(stored_txid_batch)
    assert state.multi_update([A], [add(1)]) == [11]
    assert backing.multi_get([A]) == [11]


def test_non_transactional_update_returning_none_deletes_the_key() -> None:
    backing = seeded(a=10)
    state = MapState(backing)
    state.begin_commit(1)
    assert state.multi_update([A], [lambda v: None]) == [None]
    assert backing.multi_get([A]) == [None]
    assert len(backing) == 0


# --- batch read cache -----------------------------------------------------------------------


class CountingBackingMap(MemoryBackingMap):
    """Records how often each key is read from the backing map."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple] = []

    def multi_get(self, keys: Sequence[tuple]) -> list[Any]:
        self.reads.extend(keys)
        return super().multi_get(keys)


@pytest.mark.parametrize("kind", STATE_KINDS)
def test_updates_in_one_batch_compose_across_and_within_calls(kind: type) -> None:
    state = kind(MemoryBackingMap())
    assert run_batch(state, 1, [[(A, 1)], [(A, 2), (A, 4)]]) == [[1], [3, 7]]
    state.begin_commit(2)
    assert state.multi_get([A]) == [7]


@pytest.mark.parametrize("kind", STATE_KINDS)
def test_reads_see_the_batch_writes_and_hit_the_backing_once_per_key(kind: type) -> None:
    backing = CountingBackingMap()
    state = kind(backing)
    state.begin_commit(1)
    assert state.multi_get([A, A, B]) == [None, None, None]
    state.multi_put([A], [5])
    state.multi_update([A, B], [add(1), add(2)])
    assert state.multi_get([A, B]) == [6, 2]
    assert sorted(backing.reads) == [A, B]
    assert state.written_keys() == [A, B]
    state.commit(1)
    state.begin_commit(2)  # a new batch reads the backing map again
    state.multi_get([A])
    assert sorted(backing.reads) == [A, A, B]


# --- replay equivalence ---------------------------------------------------------------------

BATCH_2 = [[(A, 1), (B, 5)], [(A, 2)]]


@pytest.mark.parametrize("kind", [TransactionalMapState, OpaqueMapState])
def test_replaying_a_batch_ends_where_running_it_once_did(kind: type) -> None:
    backing = MemoryBackingMap()
    state = kind(backing)
    run_batch(state, 1, [[(A, 10)]])
    first = run_batch(state, 2, BATCH_2)
    after_once = dict(backing.items())

    replayed = run_batch(state, 2, BATCH_2)

    assert dict(backing.items()) == after_once
    state.begin_commit(3)
    assert state.multi_get([A, B]) == [13, 5]
    assert replayed[-1] == first[-1] == [13]


def test_non_transactional_replay_over_counts() -> None:
    state = MapState(MemoryBackingMap())
    run_batch(state, 1, [[(A, 10)]])
    run_batch(state, 2, BATCH_2)
    run_batch(state, 2, BATCH_2)  # at-least-once: the replay counts again
    state.begin_commit(3)
    assert state.multi_get([A, B]) == [16, 10]


def test_opaque_replay_with_different_input_replaces_the_first_run() -> None:
    backing = MemoryBackingMap()
    state = OpaqueMapState(backing)
    run_batch(state, 1, [[(A, 10)]])
    run_batch(state, 2, [[(A, 1)], [(A, 2)]])
    run_batch(state, 2, [[(A, 4)]])  # an opaque spout replays batch 2 with other tuples
    assert backing.multi_get([A]) == [OpaqueValue(2, 14, 10)]


AFTER_BATCH_2 = {
    TransactionalMapState: {A: TransactionalValue(2, 13), B: TransactionalValue(2, 5)},
    OpaqueMapState: {A: OpaqueValue(2, 13, 10), B: OpaqueValue(2, 5)},
}


@pytest.mark.parametrize("kind", [TransactionalMapState, OpaqueMapState])
def test_replay_over_rocksdb_after_a_crash_before_and_after_flush(kind: type, tmp_path: Path) -> None:
    with RocksDBBackingMap(tmp_path / "db") as store:
        state = kind(store)
        run_batch(state, 1, [[(A, 10)]])
        store.flush(1, epoch=1)

        run_batch(state, 2, BATCH_2)  # crash before the flush: the batch's writes are lost
        store.discard_pending()
        run_batch(state, 2, BATCH_2)
        store.flush(2, epoch=1)
        assert dict(store.items()) == AFTER_BATCH_2[kind]

        run_batch(state, 2, BATCH_2)  # crash after the flush, before the ZooKeeper commit
        store.flush(2, epoch=2)
        assert dict(store.items()) == AFTER_BATCH_2[kind]


# --- lifecycle and misuse -------------------------------------------------------------------


@pytest.mark.parametrize("kind", STATE_KINDS)
@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.multi_get([A]),
        lambda s: s.multi_put([A], [1]),
        lambda s: s.multi_update([A], [add(1)]),
        lambda s: s.commit(1),
    ],
)
def test_operations_outside_a_batch_are_refused(kind: type, call: Callable[[Any], Any]) -> None:
    state = kind(MemoryBackingMap())
    with pytest.raises(StateError, match="outside a batch"):
        call(state)
    state.begin_commit(1)
    state.commit(1)
    with pytest.raises(StateError, match="outside a batch"):
        call(state)


def test_commit_must_name_the_open_batch() -> None:
    state = MapState(MemoryBackingMap())
    state.begin_commit(3)
    with pytest.raises(StateError, match=r"commit\(4\) but the open batch is 3"):
        state.commit(4)


def test_mismatched_lengths_are_refused() -> None:
    state = MapState(MemoryBackingMap())
    state.begin_commit(1)
    with pytest.raises(StateError, match="2 keys but 1 values"):
        state.multi_update([A, B], [add(1)])


def test_a_store_of_another_state_kind_is_refused() -> None:
    state = TransactionalMapState(seeded(a=OpaqueValue(1, 1)))
    state.begin_commit(2)
    with pytest.raises(StateError, match="holds a OpaqueValue, not a TransactionalValue"):
        state.multi_get([A])


def test_list_keys_are_the_same_keys_as_tuples() -> None:
    state = MapState(MemoryBackingMap())
    state.begin_commit(1)
    state.multi_put([["a", 1]], [5])
    assert state.multi_get([("a", 1)]) == [5]
