"""Wrapped values: OpaqueValue's txid branches and the stored-value codec."""

from __future__ import annotations

import pytest

from stream_ops.errors import StateError, TxidOrderError
from stream_ops.state import OpaqueValue, TransactionalValue, decode_stored, encode_stored
from stream_ops.state.values import from_json_obj, to_json_obj


def test_opaque_get_returns_curr_for_none_or_newer_batch() -> None:
    value = OpaqueValue(txid=4, curr=10, prev=7)
    assert value.get(None) == 10
    assert value.get(5) == 10


def test_opaque_get_returns_prev_for_a_replay_of_the_stored_batch() -> None:
    assert OpaqueValue(txid=4, curr=10, prev=7).get(4) == 7


def test_opaque_get_refuses_an_older_batch_naming_both_txids() -> None:
    with pytest.raises(TxidOrderError, match=r"batch txid 3 .* stored txid 4"):
        OpaqueValue(txid=4, curr=10, prev=7).get(3)


def test_opaque_update_for_a_newer_batch_moves_curr_to_prev() -> None:
    assert OpaqueValue(4, 10, 7).update(5, 12) == OpaqueValue(5, 12, 10)


def test_opaque_update_for_the_same_batch_keeps_prev() -> None:
    assert OpaqueValue(4, 10, 7).update(4, 9) == OpaqueValue(4, 9, 7)


def test_opaque_update_refuses_an_older_batch() -> None:
    with pytest.raises(TxidOrderError, match=r"batch txid 2 .* stored txid 4"):
        OpaqueValue(4, 10, 7).update(2, 1)


@pytest.mark.parametrize("txid", [-1, "3", 1.5, True])
def test_wrappers_reject_a_bad_txid(txid: object) -> None:
    with pytest.raises(StateError, match="non-negative integer"):
        TransactionalValue(txid, 1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "value",
    [
        TransactionalValue(3, {"n": 1, "words": ["a", "b"]}),
        OpaqueValue(3, 2.5, None),
        OpaqueValue(9, "x", "y"),
        42,
        "text",
        {"k": "tx", "txid": 1, "val": 1},  # a plain value that looks like a tagged one
        [1, 2],
        None,
    ],
)
def test_codec_round_trips_every_kind(value: object) -> None:
    assert decode_stored(encode_stored(value)) == value
    assert from_json_obj(to_json_obj(value)) == value


def test_json_objects_are_tagged_by_kind() -> None:
    assert to_json_obj(TransactionalValue(1, 5)) == {"k": "tx", "txid": 1, "val": 5}
    assert to_json_obj(OpaqueValue(2, 5, 4)) == {"k": "op", "txid": 2, "curr": 5, "prev": 4}
    assert to_json_obj(5) == {"k": "raw", "val": 5}


@pytest.mark.parametrize("data", [b"not json", b'{"k":"zz","val":1}', b'{"k":"op","txid":1,"curr":2}', b"[1]"])
def test_decode_rejects_what_is_not_a_stored_value(data: bytes) -> None:
    with pytest.raises(StateError):
        decode_stored(data)


def test_encode_rejects_a_value_json_cannot_hold() -> None:
    with pytest.raises(StateError, match="not JSON-serialisable"):
        encode_stored(TransactionalValue(1, {1, 2}))
