"""Write records into a FileTopic (``stream-ops produce`` and the demo feed use this)."""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

from stream_ops.errors import TopicError
from stream_ops.hashing import partition_for
from stream_ops.topics.file_topic import FileTopic


def produce(
    topic: FileTopic,
    records: Iterable[Mapping[str, Any]],
    *,
    key: str | None = None,
    records_per_file: int = 10_000,
) -> dict[int, int]:
    """Append records to ``topic``; returns records written per queue.

    With ``key`` each record goes to ``partition_for([record[key]], queues)`` (equal keys share
    a queue); without, records are dealt round-robin. Each call writes whole files atomically,
    at most ``records_per_file`` records each.
    """
    if records_per_file < 1:
        raise TopicError("records_per_file must be positive")
    topic.create()
    counts: dict[int, int] = defaultdict(int)
    round_robin = itertools.cycle(range(topic.queues))
    stamp = time.time_ns()
    seq = itertools.count()
    pending: dict[int, list[Mapping[str, Any]]] = defaultdict(list)

    def flush(queue: int) -> None:
        name = f"p-{stamp:020d}-{next(seq):06d}-{uuid.uuid4().hex[:8]}.jsonl"
        topic.write_file(queue, name, pending.pop(queue))

    for index, record in enumerate(records):
        if not isinstance(record, Mapping):
            raise TopicError(f"record {index} is a {type(record).__name__}, not a JSON object")
        if key is None:
            queue = next(round_robin)
        else:
            if key not in record:
                raise TopicError(f"record {index} has no key field {key!r}: {dict(record)!r}")
            queue = partition_for([record[key]], topic.queues)
        pending[queue].append(record)
        counts[queue] += 1
        if len(pending[queue]) >= records_per_file:
            flush(queue)
    for queue in sorted(pending):
        flush(queue)
    return dict(counts)


def read_json_lines(stream: TextIO) -> Iterable[dict[str, Any]]:
    """Parse JSON objects, one per line, skipping blank lines; errors name the line."""
    for line_no, line in enumerate(stream, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            raise TopicError(f"line {line_no}: not JSON: {e}") from e
        if not isinstance(value, dict):
            raise TopicError(f"line {line_no}: expected a JSON object, got {type(value).__name__}")
        yield value
