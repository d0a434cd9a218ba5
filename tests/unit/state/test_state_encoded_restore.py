"""Restoring from already-encoded bytes: RocksDBBackingMap.restore_encoded and the encoded replay.

The reference everywhere is the generic path: ``StateTopicQueue.replay`` (entries() +
replay_state_topic, DESIGN invariant 5) loaded with ``RocksDBBackingMap.restore``, which encodes
every key with ``encode_key`` and every value with ``encode_stored``. The encoded paths must
leave byte-for-byte the same store.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from state_store_bytes import raw_items

from stream_ops.errors import ReplayError, StateError
from stream_ops.hashing import encode_key
from stream_ops.state import (
    OpaqueValue,
    RocksDBBackingMap,
    StateTopicQueue,
    TransactionalValue,
    compact_queue,
    encode_stored,
    from_json_obj,
    rebuild_store,
    replay_changes,
    state_topic,
    write_snapshot,
)
from stream_ops.state.snapshot import open_restore_source, snapshot_sst
from stream_ops.state.state_topic import key_text, replay_arrow_changes, stored_value_text
from stream_ops.topics.file_topic import FileTopic

KEYS: list[tuple[Any, ...]] = [
    ("apple",),
    ("äpfel", 2),
    ("line\u2028sep",),
    ("ctrl\x00\x1f",),
    ('quote"and\\slash',),
    ("a,",),
    ('x,"value":',),
    ("{brace}",),
    (1.5, True, None),
    (-0.0, 10**30),
    (("nested", 1), "t"),
]
PLAIN: list[Any] = [
    5,
    {"value": 1, "z": [1, "ü"], "a": None},
    [1.25, 'x,"value":', -0.0],
    "plain",
    {"k": "tx", "txid": 1, "val": 2},  # a plain value that looks like a wrapped one
    3.0,
    float("inf"),
    "\u00e9\\u00e9",
]
VALUES: list[Any] = [
    TransactionalValue(3, 5),
    TransactionalValue(4, PLAIN[1]),
    OpaqueValue(7, 12, None),
    OpaqueValue(7, PLAIN[2], {"n": 1}),
    *PLAIN,
    None,  # None as a plain value is a deletion
]


def generic_restore(path: Path, queue: StateTopicQueue, txid: int, epoch: int) -> int:
    """The reference: entries() -> replay_state_topic -> from_json_obj -> restore (encode_key + encode_stored)."""
    with RocksDBBackingMap(path) as store:
        return store.restore(queue.replay(txid).items(), txid, epoch)


def random_history(queue: StateTopicQueue, rng: random.Random, txids: int, *, keys: int = 40) -> None:
    """Batches 1..txids over KEYS and generated keys: wrapped and plain values, tombstones, zombie epochs."""
    pool = KEYS + [(f"k{i}",) for i in range(keys)]
    epoch = 1
    for txid in range(1, txids + 1):
        if rng.random() < 0.2:  # the task moved: the old owner's file for this txid stays behind
            queue.append(3, txid, epoch, [(rng.choice(pool), f"zombie-{txid}") for _ in range(3)])
            epoch += 1
        items: list[tuple[Any, Any]] = []
        for _ in range(rng.randrange(0, 10)):
            key = rng.choice(pool)
            roll = rng.random()
            if roll < 0.15:
                items.append((key, None))
            elif roll < 0.4:
                items.append((key, OpaqueValue(txid, rng.randrange(100), rng.choice([None, rng.randrange(9)]))))
            elif roll < 0.7:
                items.append((key, TransactionalValue(txid, [txid, rng.choice(PLAIN)])))
            else:
                items.append((key, rng.choice(VALUES)))
        queue.append(3, txid, epoch, items)


@pytest.fixture
def queue(tmp_path: Path) -> StateTopicQueue:
    return StateTopicQueue(FileTopic(tmp_path / "state", queues=2), queue=1)


# --- RocksDBBackingMap.restore_encoded -----------------------------------------------------


def test_restore_encoded_leaves_exactly_the_store_restore_does(tmp_path: Path) -> None:
    rng = random.Random(1)
    items = [((f"k{i}", i % 7), rng.choice(VALUES[:-1])) for i in range(10_050)]
    items += [(key, rng.choice(VALUES[:-1])) for key in KEYS] + [(("gone",), None)]
    with RocksDBBackingMap(tmp_path / "plain") as store:
        plain_count = store.restore(iter(items), txid=9, epoch=4)
    pairs = [(encode_key(key).encode("utf-8"), None if value is None else encode_stored(value)) for key, value in items]
    rng.shuffle(pairs)
    with RocksDBBackingMap(tmp_path / "encoded") as store:
        count = store.restore_encoded(iter(pairs), txid=9, epoch=4)
        assert store.applied_marker() == (9, 4)
        assert store.multi_get([("k0", 0), ("gone",)]) == [items[0][1], None]
        decoded = list(store.items())

    assert count == plain_count == len(items) - 1
    assert raw_items(tmp_path / "encoded") == raw_items(tmp_path / "plain")
    with RocksDBBackingMap(tmp_path / "plain") as store:
        assert decoded == list(store.items())


def test_restore_encoded_of_nothing_sets_only_the_marker(tmp_path: Path) -> None:
    with RocksDBBackingMap(tmp_path / "db") as store:
        assert store.restore_encoded([], txid=0, epoch=1) == 0
        assert store.applied_marker() == (0, 1)
        assert list(store.items()) == []


def test_restore_encoded_refuses_a_store_that_holds_data_or_pending_writes(tmp_path: Path) -> None:
    with RocksDBBackingMap(tmp_path / "db") as store:
        store.multi_put([("a",)], [1])
        with pytest.raises(StateError, match="restore needs an empty state store"):
            store.restore_encoded([(b'["b"]', encode_stored(2))], txid=1, epoch=1)
        store.flush(1, epoch=1)
        with pytest.raises(StateError, match="restore needs an empty state store"):
            store.restore_encoded([(b'["b"]', encode_stored(2))], txid=1, epoch=1)
        assert store.multi_get([("b",)]) == [None]


@pytest.mark.parametrize(
    "pair",
    [
        (b"\x00meta", b'{"txid":99,"epoch":99}'),  # would overwrite the marker
        ('["a"]', b'{"k":"raw","val":1}'),  # text, not bytes
        (b"apple", b'{"k":"raw","val":1}'),  # not an encoded key
        (b'["a"]', '{"k":"raw","val":1}'),
        (None, b'{"k":"raw","val":1}'),
        (b'["a"]', 1),
    ],
)
def test_restore_encoded_rejects_a_pair_that_is_not_encoded_bytes_and_sets_no_marker(
    tmp_path: Path, pair: tuple[Any, Any]
) -> None:
    with RocksDBBackingMap(tmp_path / "db") as store:
        with pytest.raises(StateError, match="restore_encoded .* expected .*destroy it"):
            store.restore_encoded([(b'["ok"]', encode_stored(1)), pair], txid=5, epoch=1)
        assert store.applied_marker() is None


# --- encoding helpers ----------------------------------------------------------------------


def test_key_text_and_stored_value_text_give_encode_key_and_encode_stored() -> None:
    for key in [*KEYS, ({"value": 1, "b": [1, {"z": 0, "a": 1}]},)]:  # sort_keys applies inside keys
        assert key_text(key) == encode_key(key)
        assert key_text(list(key)) == encode_key(key)
    for value in VALUES:
        obj = json.loads(encode_stored(value))  # as a state-topic line holds it
        assert stored_value_text(obj, "q").encode("utf-8") == encode_stored(value)


@pytest.mark.parametrize(
    "obj",
    [
        {"txid": 3, "k": "tx", "val": 1},  # fields out of order
        {"k": "op", "txid": 3, "curr": 1, "prev": 0, "extra": True},
        {"k": "raw", "val": {"b": 1, "a": 2}, "note": "x"},
    ],
)
def test_stored_value_text_canonicalises_other_objects(obj: dict[str, Any]) -> None:
    assert stored_value_text(obj, "q").encode("utf-8") == encode_stored(from_json_obj(obj))


@pytest.mark.parametrize("obj", [{"k": "tx", "txid": -1, "val": 1}, {"k": "tx", "txid": True, "val": 1}, {"k": "zz"}, 5])
def test_stored_value_text_rejects_what_is_not_a_stored_value(obj: Any) -> None:
    with pytest.raises(ReplayError, match="state topic q:"):
        stored_value_text(obj, "q")


def test_the_shared_encoders_fall_back_to_the_public_encoder(monkeypatch: pytest.MonkeyPatch) -> None:
    encoder = json.JSONEncoder(separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    assert state_topic._one_shot(encoder)(KEYS) == encoder.encode(KEYS)
    monkeypatch.setattr(json.encoder, "c_make_encoder", None)
    assert state_topic._one_shot(encoder) == encoder.encode


# --- replay_arrow_changes ------------------------------------------------------------------


def stored_texts(changes: dict[Any, Any]) -> dict[str, str | None]:
    """key text -> stored value text (None: deleted) of replay_changes' objects."""
    return {key_text(key): None if obj is None else encode_stored(from_json_obj(obj)).decode() for key, obj in changes.items()}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_replay_arrow_changes_equals_replay_changes_with_the_stored_bytes(queue: StateTopicQueue, seed: int) -> None:
    random_history(queue, random.Random(seed), txids=30)
    for after, committed in [(-1, 30), (-1, 12), (7, 25), (29, 30), (30, 30)]:
        plain = replay_changes(queue, after_txid=after, committed_txid=committed)
        arrow = replay_arrow_changes(queue, after_txid=after, committed_txid=committed)

        expected = stored_texts(plain.changes)
        rows = arrow.table.to_pylist()
        assert [row["key"] for row in rows] == sorted(expected)  # one row per key, in key order
        assert {row["key"]: row["value"] for row in rows} == expected
        assert (arrow.top_epochs, arrow.files, arrow.entries) == (plain.top_epochs, plain.files, plain.entries)
        live = [pair for keys, values in arrow.encoded_live_chunks(rows=3) for pair in zip(keys, values, strict=True)]
        assert live == sorted(plain.encoded_live_items("q"))
        expected_live = sorted(((key, from_json_obj(obj)) for key, obj in plain.live_items()), key=lambda kv: key_text(kv[0]))
        assert list(arrow.live_items("q")) == expected_live


# --- rebuild_store -------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [4, 5, 6])
def test_rebuild_from_snapshot_and_tail_equals_a_full_replay_byte_for_byte(
    queue: StateTopicQueue, tmp_path: Path, seed: int
) -> None:
    random_history(queue, random.Random(seed), txids=30)
    committed = 27
    expected_count = generic_restore(tmp_path / "generic", queue, committed, 6)
    with RocksDBBackingMap(tmp_path / "full") as store:
        assert rebuild_store(store, queue, committed, committed_epoch=6) == expected_count
    snaps = tmp_path / "snapshots"
    compact_queue(queue, snaps, committed_txid=11)
    compact_queue(queue, snaps, committed_txid=20)
    with RocksDBBackingMap(tmp_path / "snap") as store:
        assert rebuild_store(store, queue, committed, committed_epoch=6, snapshot_dir=snaps) == expected_count
        assert store.applied_marker() == (committed, 6)

    generic = raw_items(tmp_path / "generic")
    assert raw_items(tmp_path / "full") == generic
    assert raw_items(tmp_path / "snap") == generic


def test_encoded_and_decoded_restore_sources_give_the_same_pairs(queue: StateTopicQueue, tmp_path: Path) -> None:
    random_history(queue, random.Random(7), txids=20)
    snaps = tmp_path / "snapshots"
    write_snapshot(queue, snaps, committed_txid=12)
    sources = [open_restore_source(queue, 18, snapshot_dir=snaps, encoded=flag) for flag in (False, True)]
    try:
        decoded, encoded = sources
        expected = sorted(decoded.items(), key=lambda item: encode_key(item[0]))
        assert sorted(encoded.items(), key=lambda item: encode_key(item[0])) == expected
        for source in sources:
            pairs = list(source.encoded_items())
            assert sorted(pairs) == sorted((encode_key(key).encode(), encode_stored(value)) for key, value in expected)
    finally:
        for source in sources:
            source.close()


@pytest.mark.parametrize(
    ("column", "bad", "message"),
    [
        ("value", None, "a value is not a stored state value"),
        ("value", "7", "a value is not a stored state value: '7'"),
        ("key", '"k1"', "a key is not a JSON list"),
        ("key", "\x00meta", "a key is not a JSON list"),
    ],
)
def test_a_snapshot_row_that_is_not_stored_bytes_fails_the_rebuild(
    queue: StateTopicQueue, tmp_path: Path, column: str, bad: str | None, message: str
) -> None:
    queue.append(3, 1, 1, [((f"k{i}",), i) for i in range(5)])
    info = write_snapshot(queue, tmp_path / "snapshots", committed_txid=1)
    table = pq.read_table(info.path)
    texts = table[column].to_pylist()
    texts[2] = bad
    schema = table.schema.field(column).with_nullable(True)
    table = table.set_column(table.schema.get_field_index(column), schema, pa.array(texts, pa.string()))
    pq.write_table(table, info.path)
    snapshot_sst(info.path).unlink()  # the Parquet path: a snapshot written before SSTs, or whose SST failed

    with RocksDBBackingMap(tmp_path / "db") as store, pytest.raises(ReplayError, match=message):
        rebuild_store(store, queue, committed_txid=1, committed_epoch=1, snapshot_dir=tmp_path / "snapshots")
