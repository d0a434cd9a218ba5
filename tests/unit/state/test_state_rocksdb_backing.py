"""RocksDBBackingMap against a real RocksDB in tmp_path."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from stream_ops.errors import StateError, TxidOrderError
from stream_ops.state import OpaqueValue, RocksDBBackingMap, TransactionalValue

A, B, C = ("a",), ("b", 2), ("c", None)


@pytest.fixture
def store(tmp_path: Path):
    with RocksDBBackingMap(tmp_path / "db") as s:
        yield s


def test_pending_writes_are_visible_to_reads_but_not_stored_until_flush(store: RocksDBBackingMap) -> None:
    store.multi_put([A, B], [TransactionalValue(1, 5), OpaqueValue(1, 2)])
    assert store.multi_get([A, B, C]) == [TransactionalValue(1, 5), OpaqueValue(1, 2), None]
    assert store.multi_get([A], include_pending=False) == [None]
    assert list(store.items()) == []
    assert store.pending_items() == [(A, TransactionalValue(1, 5)), (B, OpaqueValue(1, 2))]

    store.flush(1, epoch=3)

    assert store.pending_items() == []
    assert store.multi_get([A, B], include_pending=False) == [TransactionalValue(1, 5), OpaqueValue(1, 2)]
    assert sorted(store.items()) == [(A, TransactionalValue(1, 5)), (B, OpaqueValue(1, 2))]
    assert store.applied_marker() == (1, 3)
    assert store.count_keys() == 2


def test_a_store_never_flushed_has_no_marker(store: RocksDBBackingMap) -> None:
    assert store.applied_marker() is None


def test_flush_writes_data_and_marker_together_or_not_at_all(store: RocksDBBackingMap) -> None:
    store.multi_put([A], [1])
    store.flush(1, epoch=1)
    store.multi_put([A, B], [2, {"not", "json"}])
    with pytest.raises(StateError, match="not JSON-serialisable"):
        store.flush(2, epoch=1)
    assert store.multi_get([A], include_pending=False) == [1]
    assert store.applied_marker() == (1, 1)
    assert len(store.pending_items()) == 2  # kept: the caller decides to discard or fix


def test_flush_refuses_a_txid_older_than_the_applied_one(store: RocksDBBackingMap) -> None:
    store.flush(5, epoch=1)
    store.flush(5, epoch=2)  # the same batch again (replay) is fine
    with pytest.raises(TxidOrderError, match=r"cannot flush txid 4 .* applied txid 5"):
        store.flush(4, epoch=2)
    assert store.applied_marker() == (5, 2)


def test_deletes_are_buffered_tombstones(store: RocksDBBackingMap) -> None:
    store.multi_put([A, B], [1, 2])
    store.flush(1, epoch=1)
    store.delete([A])
    store.multi_put([B], [None])  # None deletes too
    assert store.multi_get([A, B]) == [None, None]
    assert store.pending_items() == [(A, None), (B, None)]
    assert store.multi_get([A, B], include_pending=False) == [1, 2]
    store.flush(2, epoch=1)
    assert list(store.items()) == []


def test_discard_pending_drops_the_batch(store: RocksDBBackingMap) -> None:
    store.multi_put([A], [1])
    store.discard_pending()
    store.flush(1, epoch=1)
    assert store.multi_get([A]) == [None]


def test_a_key_resembling_the_marker_cannot_overwrite_it(store: RocksDBBackingMap) -> None:
    store.multi_put([("\x00meta",)], ["x"])
    store.flush(1, epoch=1)
    assert store.applied_marker() == (1, 1)
    assert list(store.items()) == [(("\x00meta",), "x")]


def test_reopening_keeps_data_and_marker(tmp_path: Path) -> None:
    with RocksDBBackingMap(tmp_path / "db") as store:
        store.multi_put([A, B], [TransactionalValue(7, [1, 2]), "raw"])
        store.flush(7, epoch=2)
        store.multi_put([C], [1])  # never flushed: lost on close
    with RocksDBBackingMap(tmp_path / "db") as store:
        assert store.applied_marker() == (7, 2)
        assert store.multi_get([A, B, C]) == [TransactionalValue(7, [1, 2]), "raw", None]


_HOLDER = """
import sys
from rocksdict import Rdict, Options
db = Rdict(sys.argv[1], Options(raw_mode=True))
print("ready", flush=True)
sys.stdin.read()
db.close()
"""


def test_opening_a_store_another_process_holds_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "db"
    RocksDBBackingMap(path).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        with pytest.raises(StateError, match=f"another worker holds the state store at {path}"):
            RocksDBBackingMap(path)
    finally:
        holder.communicate(timeout=30)
    RocksDBBackingMap(path).close()  # free again once the holder is gone


def test_restore_bulk_loads_an_empty_store_across_write_batches(store: RocksDBBackingMap) -> None:
    items = [((f"k{i}",), TransactionalValue(9, i)) for i in range(10_050)]
    assert store.restore(iter([*items, (("gone",), None)]), txid=9, epoch=4) == 10_050
    assert store.applied_marker() == (9, 4)
    assert store.multi_get([("k0",), ("k10049",), ("gone",)]) == [
        TransactionalValue(9, 0),
        TransactionalValue(9, 10049),
        None,
    ]
    assert sum(1 for _ in store.items()) == 10_050


def test_restore_refuses_a_store_that_holds_data(store: RocksDBBackingMap) -> None:
    store.multi_put([A], [1])
    store.flush(1, epoch=1)
    with pytest.raises(StateError, match="restore needs an empty state store"):
        store.restore([(B, 2)], txid=1, epoch=1)


def test_destroy_removes_the_directory(tmp_path: Path) -> None:
    path = tmp_path / "db"
    with RocksDBBackingMap(path) as store:
        store.flush(1, epoch=1)
    RocksDBBackingMap.destroy(path)
    assert not path.exists()
    RocksDBBackingMap.destroy(path)  # missing: nothing to do
    with RocksDBBackingMap(path) as store:
        assert store.applied_marker() is None


def test_a_closed_store_refuses_work(tmp_path: Path) -> None:
    store = RocksDBBackingMap(tmp_path / "db")
    store.close()
    store.close()
    with pytest.raises(StateError, match="is closed"):
        store.multi_get([A])


def test_a_query_thread_reads_while_the_batch_thread_writes(store: RocksDBBackingMap) -> None:
    done = threading.Event()
    errors: list[BaseException] = []
    seen: list[int] = []

    def query() -> None:
        try:
            while not done.is_set():
                [value] = store.multi_get([A], include_pending=False)
                seen.append(0 if value is None else value.val)
        except BaseException as e:  # noqa: BLE001 - report any failure to the test thread
            errors.append(e)

    reader = threading.Thread(target=query)
    reader.start()
    try:
        for txid in range(1, 201):
            store.multi_put([A, B], [TransactionalValue(txid, txid), TransactionalValue(txid, -txid)])
            store.flush(txid, epoch=1)
    finally:
        done.set()
        reader.join(timeout=30)
    assert not errors
    assert seen == sorted(seen)  # flushed batches appear in order, never half
    assert store.multi_get([A]) == [TransactionalValue(200, 200)]
