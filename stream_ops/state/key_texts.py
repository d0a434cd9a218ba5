"""Key texts from the shuffle: decoded in one parse, and checked to be a store's key text.

A keyed stage receives each key as the text the upstream stage encoded it with
(:func:`stream_ops.hashing.encode_key`). When that text is exactly what the state stores for the
key, the commit writes it as it is instead of encoding the key again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

_KEY_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True, ensure_ascii=False)
"""``stream_ops.hashing.encode_key``'s settings (the unit tests check the two agree)."""


def decode_key_texts(texts: Sequence[str]) -> tuple[list[Any], bool]:
    """The JSON value of each key text, and whether every text is canonical.

    Canonical means ``text == encode_key(as_key(value))`` for every text. It is checked for the
    whole batch with one re-encode, which is exact except for ``encode_key``'s normalisation of
    integral floats (``1.0`` is the key ``1``): a batch holding any float literal is reported
    as not canonical, and its keys are encoded again by the commit.

    Raises:
        json.JSONDecodeError: a text is not JSON.
    """
    if not texts:
        return [], True
    floats = False

    def parse_float(literal: str) -> float:
        nonlocal floats
        floats = True
        return float(literal)

    joined = "[" + ",".join(texts) + "]"
    decoded = json.loads(joined, parse_float=parse_float)
    return decoded, not floats and len(decoded) == len(texts) and _KEY_ENCODER.encode(decoded) == joined
