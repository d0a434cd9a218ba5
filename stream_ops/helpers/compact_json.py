"""Records as compact JSON text, a batch at a time: the text ``json.dumps(record,
separators=(",", ":"), ensure_ascii=False)`` gives (with ``default`` where given), for a
fraction of its cost per record.

``json.dumps`` with any argument builds a new ``JSONEncoder`` per call, and that encoder a new
C encoder per call; for a batch of small records (a word and its count) that setup is most of
the cost. Here one encoder serves a whole batch (one per call, so threads never share one).
The encoder is the one ``JSONEncoder.encode`` itself uses, so the text is the same byte for byte
(``tests/unit/helpers/test_compact_json.py`` holds that over awkward records).
"""

from __future__ import annotations

import json
import json.encoder
from collections.abc import Callable, Iterable
from typing import Any

_SEPARATORS = (",", ":")


def compact_json_lines(records: Iterable[Any], *, default: Callable[[Any], Any] | None = None) -> list[str]:
    """Each record as ``json.dumps(record, separators=(",", ":"), ensure_ascii=False, default=default)``.

    Raises:
        TypeError: a record holds a value JSON cannot encode (and ``default`` does not convert).
        ValueError: a record refers to itself.

    Example:
        >>> compact_json_lines([{"word": "été", "n": 2}, [1.5, None]])
        ['{"word":"été","n":2}', '[1.5,null]']
    """
    encoder = json.JSONEncoder(separators=_SEPARATORS, ensure_ascii=False, default=default)
    make = getattr(json.encoder, "c_make_encoder", None)  # not in the stubs
    if make is None:  # no C speedups: the pure-Python encoder, one call per record
        return [encoder.encode(record) for record in records]
    encode = make(
        {},  # markers: a circular record raises ValueError, as json.dumps does
        encoder.default,
        json.encoder.encode_basestring,
        None,  # indent
        encoder.key_separator,
        encoder.item_separator,
        encoder.sort_keys,
        encoder.skipkeys,
        encoder.allow_nan,
    )
    return ["".join(encode(record, 0)) for record in records]
