"""The state topic (RocketMQ Streams' changelog): replaying it rebuilds a task's state.

Each queue of the state topic belongs to one source queue. For every batch a task writes one
file, named by (task, txid, owner epoch), holding the wrapped values the batch wrote — so a
replayed batch overwrites its own file instead of adding to the log. Replay keeps, per key, the
entry with the largest offset among entries of committed txids, where for each txid only the
highest owner epoch counts (a lower epoch is the work of an owner that lost the task).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stream_ops.errors import ReplayError, StateError
from stream_ops.state.keys import Key, as_key
from stream_ops.state.rocksdb_backing import RocksDBBackingMap
from stream_ops.state.values import from_json_obj, to_json_obj
from stream_ops.topics.file_topic import BatchFileId, FileTopic, batch_file_name, parse_batch_file_name

logger = logging.getLogger(__name__)

_FIELDS = ("key", "value", "offset", "txid", "epoch")


@dataclass(frozen=True)
class ChangelogEntry:
    """One state-topic entry.

    Attributes:
        key: the key tuple.
        value: the key's wrapped value as its JSON object (see
            :func:`~stream_ops.state.values.to_json_obj`), or None for a tombstone.
        offset: position in the queue; a larger offset is a later write.
        txid: the batch that wrote the entry.
        epoch: the owner epoch of the worker that ran the batch.
    """

    key: Key
    value: dict[str, Any] | None
    offset: int
    txid: int
    epoch: int


def _parse_entry(entry: Any, where: str) -> ChangelogEntry:
    """A ChangelogEntry from a mapping or an object with the entry's fields."""
    fields: dict[str, Any] = {}
    for name in _FIELDS:
        if isinstance(entry, Mapping) and name in entry:
            fields[name] = entry[name]
        elif not isinstance(entry, Mapping) and hasattr(entry, name):
            fields[name] = getattr(entry, name)
        else:
            raise ReplayError(f"state-topic entry {where} has no {name!r} field: {entry!r}")
    for name in ("offset", "txid", "epoch"):
        number = fields[name]
        if not isinstance(number, int) or isinstance(number, bool) or number < 0:
            raise ReplayError(f"state-topic entry {where}: {name} must be a non-negative integer, got {number!r}")
    try:
        fields["key"] = as_key(fields["key"])
    except StateError as e:
        raise ReplayError(f"state-topic entry {where}: {e}") from e
    return ChangelogEntry(**fields)


def replay_changelog(entries: Iterable[Any], committed_txid: int) -> dict[Key, Any]:
    """The state a changelog describes at ``committed_txid`` (pure; no I/O).

    For each key the winner is the entry with the largest offset among entries whose txid is
    at most ``committed_txid`` and whose epoch is the highest seen for that txid; a winning
    tombstone (value None) means the key is absent.

    Example:
        >>> replay_changelog([
        ...     {"key": ["a"], "value": 1, "offset": 0, "txid": 1, "epoch": 1},
        ...     {"key": ["a"], "value": 2, "offset": 1, "txid": 2, "epoch": 1},
        ... ], committed_txid=1)
        {('a',): 1}

    Args:
        entries: mappings or objects with key, value, offset, txid and epoch.
        committed_txid: the last txid committed in ZooKeeper; later entries are ignored.

    Returns:
        key tuple -> value, values as given (JSON objects for a state topic).

    Raises:
        ReplayError: an entry lacks a field or has a malformed one, or two counted entries of
            one key share an offset.
    """
    counted = [
        entry for entry in (_parse_entry(raw, f"#{i}") for i, raw in enumerate(entries)) if entry.txid <= committed_txid
    ]
    top_epoch: dict[int, int] = {}
    for entry in counted:
        top_epoch[entry.txid] = max(entry.epoch, top_epoch.get(entry.txid, entry.epoch))
    winners: dict[Key, ChangelogEntry] = {}
    for entry in counted:
        if entry.epoch != top_epoch[entry.txid]:
            continue
        best = winners.get(entry.key)
        if best is not None and best.offset == entry.offset:
            raise ReplayError(f"two state-topic entries of key {entry.key!r} share offset {entry.offset}")
        if best is None or entry.offset > best.offset:
            winners[entry.key] = entry
    return {key: entry.value for key, entry in winners.items() if entry.value is not None}


class StateTopicQueue:
    """One queue of a state topic: append a batch's state changes, read or replay them.

    Example:
        >>> queue = StateTopicQueue(FileTopic("/data/wordcount-state", queues=4), queue=2)
        >>> path = queue.append(task_id=2, txid=7, epoch=3, items=[(("apple",), TransactionalValue(7, 5))])
        >>> queue.replay(committed_txid=7)
        {('apple',): TransactionalValue(txid=7, val=5)}
    """

    def __init__(self, topic: FileTopic, queue: int) -> None:
        self._topic = topic
        self._queue = queue
        self._dir = topic.queue_path(queue)  # validates the queue number

    @property
    def path(self) -> Path:
        """The queue's directory."""
        return self._dir

    def append(self, task_id: int, txid: int, epoch: int, items: Iterable[tuple[Key, Any | None]]) -> Path:
        """Write the state changes of batch ``txid`` as one file (a replay overwrites it).

        Args:
            task_id: the task that ran the batch.
            txid: the batch.
            epoch: the owner epoch of the worker that ran it.
            items: (key, wrapped value) pairs, None for a deletion — e.g.
                :meth:`RocksDBBackingMap.pending_items`.

        Raises:
            TopicError: the file could not be written.
        """
        records = [
            {
                "key": list(as_key(key)),
                "value": None if value is None else to_json_obj(value),
                "txid": txid,
                "epoch": epoch,
            }
            for key, value in items
        ]
        return self._topic.write_file(self._queue, batch_file_name(task_id, txid, epoch), records, overwrite=True)

    def entries(self) -> Iterator[ChangelogEntry]:
        """Every entry, offsets counting up across files then lines.

        Files are read in (txid, epoch, task) order — the name order when one task writes the
        queue — and files that are not batch files are skipped.

        Raises:
            ReplayError: a line is not a state-topic record, or its txid/epoch differ from its
                file name.
        """
        offset = 0
        for file_id, path in self._batch_files():
            with open(path, encoding="utf-8") as lines:
                for line_no, line in enumerate(lines, 1):
                    if not line.strip():
                        continue
                    where = f"{path}:{line_no}"
                    entry = _parse_entry({**_load_record(line, where), "offset": offset}, where)
                    if (entry.txid, entry.epoch) != (file_id.txid, file_id.epoch):
                        raise ReplayError(
                            f"state-topic entry {where} has txid {entry.txid} epoch {entry.epoch}, but its file "
                            f"is named for txid {file_id.txid} epoch {file_id.epoch}; the file is corrupt"
                        )
                    yield entry
                    offset += 1

    def replay(self, committed_txid: int) -> dict[Key, Any]:
        """The queue's state at ``committed_txid``: key -> TransactionalValue / OpaqueValue / plain value."""
        state = replay_changelog(self.entries(), committed_txid)
        try:
            return {key: from_json_obj(obj) for key, obj in state.items()}
        except StateError as e:
            raise ReplayError(f"state topic {self._dir}: {e}") from e

    def _batch_files(self) -> list[tuple[BatchFileId, Path]]:
        found = []
        for path in self._topic.files(self._queue):
            file_id = parse_batch_file_name(path.name)
            if file_id is None:
                logger.debug("state topic %s: skipping %s (not a batch file)", self._dir, path.name)
            else:
                found.append((file_id, path))
        return sorted(found, key=lambda item: (item[0].txid, item[0].epoch, item[0].task_id, item[1].name))


def _load_record(line: str, where: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise ReplayError(f"state-topic entry {where} is not JSON: {e}") from e
    if not isinstance(record, dict):
        raise ReplayError(f"state-topic entry {where} is not a JSON object: {line.strip()[:80]!r}")
    return record


def rebuild_store(
    store: RocksDBBackingMap,
    queue: StateTopicQueue,
    committed_txid: int,
    committed_epoch: int,
    *,
    clock: Callable[[], float] = time.monotonic,
    log_interval: float = 1.0,
) -> int:
    """Restore a task's state into an EMPTY store by replaying its state-topic queue.

    Example:
        >>> with RocksDBBackingMap(path) as store:
        ...     rebuild_store(store, StateTopicQueue(topic, 3), committed_txid=41, committed_epoch=5)
        1200

    Args:
        store: an empty store (see :meth:`RocksDBBackingMap.restore`).
        queue: the state-topic queue of the task's source queue.
        committed_txid: the task's committed txid in ZooKeeper.
        committed_epoch: the owner epoch recorded in the store's marker.
        clock: seconds, for rate-limiting progress logs.
        log_interval: at most one progress log per this many seconds.

    Returns:
        The number of keys restored.
    """
    state = queue.replay(committed_txid)
    logger.info(
        "rebuilding state store %s from %s: %d keys at txid %d", store.path, queue.path, len(state), committed_txid
    )
    progress = _logging_progress(state.items(), len(state), str(store.path), clock, log_interval)
    count = store.restore(progress, committed_txid, committed_epoch)
    logger.info(
        "rebuilt state store %s: %d keys at txid %d epoch %d", store.path, count, committed_txid, committed_epoch
    )
    return count


def _logging_progress(
    items: Iterable[tuple[Key, Any]], total: int, what: str, clock: Callable[[], float], interval: float
) -> Iterator[tuple[Key, Any]]:
    """Pass ``items`` through, logging progress at most once per ``interval`` seconds."""
    last = clock()
    for done, item in enumerate(items, 1):
        yield item
        now = clock()
        if now - last >= interval:
            logger.info("rebuilding %s: %d/%d keys", what, done, total)
            last = now
