"""What one state-query request may ask, and the topology and (task, keys) pairs it asks.

The size constants bound every request; the client splits its lookups to fit them, the server
refuses a request beyond them. ``keys`` nesting is judged before the JSON is parsed.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs

MAX_REQUEST_BYTES = 64 * 1024
MAX_KEYS = 10_000
#: Deepest nesting of ``keys`` accepted: a list of keys, each a list of values that may be lists.
MAX_JSON_DEPTH = 16


def json_depth_exceeds(text: str, limit: int) -> bool:
    """Whether JSON ``text`` nests arrays or objects deeper than ``limit`` (without parsing it).

    Brackets inside strings do not count. Malformed text is not judged here (the parser is).

    Example:
        >>> json_depth_exceeds('[["a"], ["[[["]]', 2), json_depth_exceeds("[[[1]]]", 2)
        (False, True)
    """
    if text.count("[") + text.count("{") <= limit:
        return False
    depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return True
        elif char in "]}":
            depth -= 1
    return False


def parse_query(query: str) -> tuple[str, list[tuple[int, list[tuple[Any, ...]]]]]:
    """``(topology, [(task, keys), ...])`` of a query string, the pairs in request order.

    Raises:
        ValueError: The query is malformed or over the limits; the message names what is wrong.
    """
    params = parse_qs(query)
    try:
        topology_id = params["topology"][0]
        tasks, texts = params["task"], params["keys"]
        if len(tasks) != len(texts):
            raise ValueError(f"{len(tasks)} task parameters for {len(texts)} keys parameters: give them in pairs")
        asks: list[tuple[int, list[tuple[Any, ...]]]] = []
        total = 0
        for task, text in zip(tasks, texts, strict=True):
            if json_depth_exceeds(text, MAX_JSON_DEPTH):
                raise ValueError(f"keys nest deeper than {MAX_JSON_DEPTH} levels")
            keys = json.loads(text)
            total += len(keys) if isinstance(keys, list) else 0
            if not isinstance(keys, list) or total > MAX_KEYS or not all(isinstance(k, list) for k in keys):
                raise ValueError(f"keys must be JSON lists of at most {MAX_KEYS} key lists in all")
            asks.append((int(task), [tuple(k) for k in keys]))
    except (KeyError, IndexError, ValueError, RecursionError) as e:
        raise ValueError(f"bad query: {e}; expected topology, task and keys parameters") from e
    return topology_id, asks
