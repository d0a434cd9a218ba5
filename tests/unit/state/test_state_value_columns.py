"""The commit's column encoders give the per-key encoders' bytes: values, keys and shuffled key texts."""

from __future__ import annotations

import random
from typing import Any

import pytest

from stream_ops.errors import TopicError
from stream_ops.hashing import encode_key
from stream_ops.state.key_texts import decode_key_texts
from stream_ops.state.keys import as_key
from stream_ops.state.state_topic import encode_changes, encode_items
from stream_ops.state.value_columns import ChangeColumns, encode_stored_column
from stream_ops.state.values import OpaqueValue, TransactionalValue, encode_stored

ODD_VALUES: list[Any] = [
    0,
    -1,
    2**63 - 1,
    -(2**63),
    2**63,
    10**30,
    1.0,
    -0.0,
    1e300,
    1e-7,
    float("nan"),
    float("inf"),
    True,
    None,
    "",
    'quote " backslash \\ tab \t nl \n nul \x00 ä \u2028 😀',
    [1, [2, None], {"z": 1, "a": "b"}],
    {"b": 1, "a": [1.5, "x"]},
]


def _same_as_per_key(values: list[Any]) -> list[str | None]:
    keys = [(f"k{i}",) for i in range(len(values))]
    encoded = encode_changes(keys, values)
    assert isinstance(encoded, ChangeColumns)
    assert list(encoded) == encode_items(zip(keys, values, strict=True))
    assert [v.decode() if v is not None else None for v in encoded.value_bytes()] == [
        None if v is None else encode_stored(v).decode() for v in values
    ]
    return encoded.values.to_pylist()


@pytest.mark.parametrize("kind", ["tx", "op"])
def test_int_batches_are_encoded_column_wise_with_the_per_key_bytes(kind: str) -> None:
    rng = random.Random(kind)
    numbers = [rng.choice([0, 1, -1, 2**63 - 1, -(2**63), rng.randint(-(10**12), 10**12)]) for _ in range(500)]
    if kind == "tx":
        values: list[Any] = [TransactionalValue(rng.choice([3, 3, 2**40]), n) for n in numbers]
    else:
        values = [OpaqueValue(7, n, rng.choice([None, n - 1 if n > -(2**63) else n])) for n in numbers]
    assert encode_stored_column(values) is not None
    _same_as_per_key(values)
    one_txid = [OpaqueValue(9, n, None) for n in numbers]  # the constant-txid shortcut
    assert encode_stored_column(one_txid) is not None
    _same_as_per_key(one_txid)


@pytest.mark.parametrize("odd", ODD_VALUES, ids=repr)
def test_batches_the_columns_do_not_cover_fall_back_to_the_per_key_bytes(odd: Any) -> None:
    batches: list[list[Any]] = [
        [OpaqueValue(4, 1, 0), OpaqueValue(4, odd, 1)],
        [TransactionalValue(4, odd), TransactionalValue(5, 2)],
        [odd, 3],  # plain values, and None deletes
        [OpaqueValue(4, 1, None), TransactionalValue(4, 1)],  # kinds mixed
    ]
    int64 = odd is None or (type(odd) is int and -(2**63) <= odd < 2**63)  # null fields are covered
    for values, covered in zip(batches, [int64, int64, False, False], strict=True):
        assert (encode_stored_column(values) is not None) == covered
        _same_as_per_key(values)


def test_given_key_texts_are_used_and_values_that_are_not_json_fail_as_before() -> None:
    encoded = encode_changes([("a",)], [OpaqueValue(1, 2, None)], key_texts=['["a"]'])
    assert list(encoded) == [('["a"]', '{"k":"op","txid":1,"curr":2,"prev":null}')]
    assert encoded[0] == encoded[:1][0] and len(encoded) == 1
    with pytest.raises(TopicError, match="not JSON-serialisable"):
        encode_changes([("a",)], [OpaqueValue(1, object(), None)])
    with pytest.raises(TopicError, match="1 keys, 1 values, 2 key texts"):
        encode_changes([("a",)], [1], key_texts=["x", "y"])


KEYS: list[tuple[Any, ...]] = [
    ("plain",),
    ('ä \u2028 \x00 " \\ 😀', 1),
    (1.0, 2.5, -0.0),  # normalised before the shuffle: 1.0 is the key 1
    (2.0**53, float("nan"), float("-inf")),
    (10**30, True, None),
    ([1, [2.0]], {"b": 1, "a": [3]}),
]


def test_shuffled_key_texts_are_canonical_exactly_when_encode_key_gives_them() -> None:
    texts = [encode_key(key) for key in KEYS]
    decoded, canonical = decode_key_texts(texts)
    assert [encode_key(as_key(fields)) for fields in decoded] == texts
    assert canonical is False  # float literals: not checked in bulk
    ints = [key for key in KEYS if "." not in encode_key(key) and "NaN" not in encode_key(key)]
    assert decode_key_texts([encode_key(key) for key in ints])[1] is True
    for spelled in ('["a", 1]', '["\\u00e4"]', "[1.0]", '["a"],["b"]', '[{"b":1,"a":2}]'):
        assert decode_key_texts([spelled])[1] is False, spelled
    assert decode_key_texts([]) == ([], True)
