"""The state topic (RocketMQ Streams' changelog): replaying it rebuilds a task's state.

Each queue of the state topic belongs to one source queue. For every batch a task writes one
file, named by (task, txid, owner epoch), holding the wrapped values the batch wrote — so a
replayed batch overwrites its own file instead of adding to the log. Every batch writes its
file, an empty one when nothing changed, with its end information (txid, epoch, number of
entries), so a file cut short (an OS crash on storage that ignored fsync) is detected instead
of read as fewer changes. Replay keeps, per key, the entry with the largest offset among
entries of committed txids, where for each txid only the highest owner epoch that wrote a file
counts: the committing epoch always wrote one, and any lower epoch is the work of an owner that
lost the task.

Each batch file is what :meth:`StateTopicQueue.append` writes, an Arrow IPC file of the stored
bytes (:mod:`stream_ops.state.state_batch_arrow`); a batch file in any other format is refused
(:class:`~stream_ops.errors.ReplayError`), never skipped.

:func:`stream_ops.state.restore.rebuild_store` restores a store from the latest compacted
snapshot of the queue plus the batches above it, or from the whole queue, with the columns
:func:`replay_arrow_changes` keeps per key.
"""

from __future__ import annotations

import gc
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stream_ops.errors import ReplayError, StateError, TopicError
from stream_ops.hashing import normalise_key_value
from stream_ops.state.keys import Key, as_key
from stream_ops.state.state_batch_arrow import (
    ARROW_SUFFIX,
    LOAD_CHUNK_ROWS,
    SCHEMA,
    encode_arrow_batch,
    key_pivots,
    last_per_key,
    last_per_key_of,
    range_ids,
    range_rows,
    read_arrow_batch,
)
from stream_ops.state.value_columns import ChangeColumns, encode_stored_column
from stream_ops.state.values import decode_stored, from_json_obj, to_json_obj
from stream_ops.topics.file_topic import BatchFileId, FileTopic, batch_file_name, parse_batch_file_name

logger = logging.getLogger(__name__)

_FIELDS = ("key", "value", "offset", "txid", "epoch")

# The stored bytes of replayed entries are made with one shared encoder each: json.dumps builds
# a new encoder per call, and JSONEncoder.encode still builds its C encoder per call, which
# together tripled the cost of a restore's hottest loop (see _one_shot).
_KEY_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True, ensure_ascii=False)
"""``stream_ops.hashing.encode_key``'s settings; the unit tests check the two agree."""
_VALUE_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
"""``stream_ops.state.values.encode_stored``'s settings; the unit tests check the two agree."""
_CANONICAL_FIELDS: dict[str, tuple[str, ...]] = {
    "tx": ("k", "txid", "val"),
    "op": ("k", "txid", "curr", "prev"),
    "raw": ("k", "val"),
}
"""The fields, in order, of the object ``values.to_json_obj`` makes for each kind."""
_PROBE = [
    ("ä", "line\u2028sep", "\x00", 1, -2.5, 1e300, float("nan"), True, None, 10**30),
    {"b": [1, {"z": 0, "a": ""}], "a": (2, 3)},
]
"""What :func:`_one_shot` checks its encoder against ``JSONEncoder.encode`` with."""


def _one_shot(encoder: json.JSONEncoder) -> Callable[[Any], str]:
    """``encoder.encode``, with the C encoder it builds on every call built once.

    ``JSONEncoder.encode`` (and so ``json.dumps``) makes the same ``c_make_encoder`` call
    each time; doing it once gives the same text (circular-reference checks aside, which
    decoded JSON and key tuples never need). Where the C encoder is missing or does not
    reproduce ``encoder.encode`` on a probe, ``encoder.encode`` itself is returned.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None or encoder.indent is not None:
        return encoder.encode
    quote = json.encoder.encode_basestring_ascii if encoder.ensure_ascii else json.encoder.encode_basestring
    try:
        chunks = make(
            None,  # no circular-reference markers
            encoder.default,
            quote,
            None,
            encoder.key_separator,
            encoder.item_separator,
            encoder.sort_keys,
            encoder.skipkeys,
            encoder.allow_nan,
        )
        join = "".join

        def encode(obj: Any) -> str:
            return join(chunks(obj, 0))

        if encode(_PROBE) != encoder.encode(_PROBE):
            return encoder.encode
    except Exception:  # noqa: BLE001 - another Python's private encoder API: use the public one
        return encoder.encode
    return encode


_encode_key_json = _one_shot(_KEY_ENCODER)


_PLAIN_KEY_TYPES = frozenset({str, int, bool, type(None)})


def _encode_key_text(key: Key) -> str:
    # encode_key's normalisation (1.0 is the key 1), paid only by keys holding floats or containers
    if not _PLAIN_KEY_TYPES.issuperset(map(type, key)):
        return _encode_key_json([normalise_key_value(v) for v in key])
    return _encode_key_json(key)


_encode_value_text = _one_shot(_VALUE_ENCODER)


def key_text(key: Key) -> str:
    """``stream_ops.hashing.encode_key(key)``, with one shared encoder; as UTF-8, the key's bytes in a store."""
    return _encode_key_text(key)


def stored_value_text(obj: Any, where: object) -> str:
    """The JSON text of ``encode_stored(from_json_obj(obj))`` for a state-topic value object.

    An object as :meth:`StateTopicQueue.append` writes it — the canonical fields of its kind,
    in order, and a valid txid — already is what ``to_json_obj`` would rebuild, so it is
    encoded as it is, without the round trip through TransactionalValue / OpaqueValue. Any
    other object takes the round trip, which canonicalises it or rejects it.

    Raises:
        ReplayError: ``obj`` is not a stored state value (``where`` names the source).
    """
    if obj.__class__ is dict:
        kind = obj.get("k")
        if kind.__class__ is str and tuple(obj) == _CANONICAL_FIELDS.get(kind):
            txid = obj.get("txid", 0)
            if txid.__class__ is int and txid >= 0:
                return _encode_value_text(obj)
    try:
        return _encode_value_text(to_json_obj(from_json_obj(obj)))
    except StateError as e:
        raise ReplayError(f"state topic {where}: {e}") from e


def encode_items(items: Iterable[tuple[Key, Any | None]], *, where: object = "") -> list[tuple[str, str | None]]:
    """(key text, stored value text or None for a deletion) of each item: the bytes a store
    keeps (``encode_key`` / ``encode_stored``), as text.

    Raises:
        TopicError: a value is not JSON-serialisable.
    """
    encode_value = _encode_value_text
    try:
        return [
            (_encode_key_text(as_key(key)), None if value is None else encode_value(to_json_obj(value))) for key, value in items
        ]
    except (TypeError, ValueError, StateError) as e:
        raise TopicError(f"state topic {where}: a value is not JSON-serialisable: {e}") from e


def encode_changes(
    keys: Sequence[Key], values: Sequence[Any | None], *, key_texts: Sequence[str] | None = None, where: object = ""
) -> ChangeColumns:
    """:func:`encode_items` of ``zip(keys, values)`` as columns: the commit path's encoder.

    Values are encoded column-wise where :func:`~stream_ops.state.value_columns.encode_stored_column`
    covers the batch, else one at a time; both give :func:`encode_items`' text.

    Args:
        keys: the changed keys.
        values: their wrapped values, None for a deletion.
        key_texts: ``encode_key(as_key(key))`` of each key, in order, when the caller holds
            them already (the shuffle's key texts); else each key is encoded here.
        where: the state topic, for errors.

    Raises:
        TopicError: a value is not JSON-serialisable, or the lengths differ.
    """
    if len(keys) != len(values) or (key_texts is not None and len(key_texts) != len(keys)):
        lengths = f"{len(keys)} keys, {len(values)} values" + ("" if key_texts is None else f", {len(key_texts)} key texts")
        raise TopicError(f"state topic {where}: cannot encode {lengths}")
    texts = key_texts if key_texts is not None else [_encode_key_text(as_key(key)) for key in keys]
    column = encode_stored_column(values)
    if column is None:
        encode_value = _encode_value_text
        try:
            column = pa.array([None if v is None else encode_value(to_json_obj(v)) for v in values], pa.string())
        except (TypeError, ValueError, StateError) as e:
            raise TopicError(f"state topic {where}: a value is not JSON-serialisable: {e}") from e
    return ChangeColumns(pa.array(texts, pa.string()), column)


@dataclass(frozen=True)
class StateTopicEntry:
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


def _parse_entry(entry: Any, where: str) -> StateTopicEntry:
    """A StateTopicEntry from a mapping or an object with the entry's fields."""
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
    return StateTopicEntry(**fields)


def replay_state_topic(entries: Iterable[Any], committed_txid: int, *, epochs: Mapping[int, int] | None = None) -> dict[Key, Any]:
    """The state a state topic describes at ``committed_txid`` (pure; no I/O).

    For each key the winner is the entry with the largest offset among entries whose txid is
    at most ``committed_txid`` and whose epoch is the one that counts for that txid; a winning
    tombstone (value None) means the key is absent.

    Example:
        >>> replay_state_topic([
        ...     {"key": ["a"], "value": 1, "offset": 0, "txid": 1, "epoch": 1},
        ...     {"key": ["a"], "value": 2, "offset": 1, "txid": 2, "epoch": 1},
        ... ], committed_txid=1)
        {('a',): 1}

    Args:
        entries: mappings or objects with key, value, offset, txid and epoch.
        committed_txid: the last txid committed in ZooKeeper; later entries are ignored.
        epochs: txid -> the epoch that counts for it: the highest epoch that wrote a batch file
            for the txid, even an empty one (see :meth:`StateTopicQueue.replay`). Without it,
            the highest epoch among the entries of the txid counts.

    Returns:
        key tuple -> value, values as given (JSON objects for a state topic).

    Raises:
        ReplayError: an entry lacks a field or has a malformed one, or two counted entries of
            one key share an offset.
    """
    counted = [entry for entry in (_parse_entry(raw, f"#{i}") for i, raw in enumerate(entries)) if entry.txid <= committed_txid]
    top_epoch: dict[int, int] = dict(epochs) if epochs is not None else {}
    if epochs is None:
        for entry in counted:
            top_epoch[entry.txid] = max(entry.epoch, top_epoch.get(entry.txid, entry.epoch))
    winners: dict[Key, StateTopicEntry] = {}
    for entry in counted:
        if entry.epoch != top_epoch.get(entry.txid):
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

    @property
    def topic(self) -> FileTopic:
        """The state topic this is a queue of."""
        return self._topic

    @property
    def queue(self) -> int:
        """The queue number."""
        return self._queue

    def append(self, task_id: int, txid: int, epoch: int, items: Iterable[tuple[Key, Any | None]]) -> Path:
        """Write the state changes of batch ``txid`` as one durable file (a replay overwrites it).

        Every batch of a stateful task appends, with no items when nothing changed: the file
        marks the epoch that committed the txid (see :func:`replay_changes`). It is an Arrow
        IPC file recording its txid, epoch and number of entries (see
        :mod:`~stream_ops.state.state_batch_arrow`).

        Args:
            task_id: the task that ran the batch.
            txid: the batch.
            epoch: the owner epoch of the worker that ran it.
            items: (key, wrapped value) pairs, None for a deletion — e.g.
                :meth:`RocksDBBackingMap.pending_items`.

        Raises:
            TopicError: the file could not be written.
        """
        return self.append_encoded(task_id, txid, epoch, encode_items(items, where=self._dir))

    def append_encoded(self, task_id: int, txid: int, epoch: int, encoded: Iterable[tuple[str, str | None]]) -> Path:
        """:meth:`append` for items already encoded by :func:`encode_items` (the commit path
        encodes each value once, for the state topic and RocksDB)."""
        if isinstance(encoded, ChangeColumns):
            return self.append_columns(task_id, txid, epoch, encoded.keys, encoded.values)
        pairs = encoded if isinstance(encoded, Sequence) else list(encoded)
        # two comprehensions: zip(*pairs) passes every pair as an argument, ten times slower
        return self.append_columns(task_id, txid, epoch, [key for key, _ in pairs], [value for _, value in pairs])

    def append_columns(
        self, task_id: int, txid: int, epoch: int, keys: Sequence[str] | pa.Array, values: Sequence[str | None] | pa.Array
    ) -> Path:
        """:meth:`append_encoded` with the key texts and stored value texts (None deletes) as two
        lists or Arrow string columns: the batch's Arrow IPC file, durable when this returns.

        Raises:
            TopicError: the file could not be written, or a key or value is not text.
        """
        if len(keys) != len(values):
            raise TopicError(f"state topic {self._dir}: {len(keys)} keys but {len(values)} values")
        try:
            data = encode_arrow_batch(txid, epoch, keys, values)
        except (pa.ArrowException, TypeError) as e:
            raise TopicError(f"state topic {self._dir}: a key or value of txid {txid} is not text: {e}") from e
        return self._topic.write_bytes(self._queue, batch_file_name(task_id, txid, epoch, ARROW_SUFFIX), data, overwrite=True)

    def entries(self) -> Iterator[StateTopicEntry]:
        """Every entry, offsets counting up across files then rows.

        Files are read in (txid, epoch, task) order — the name order when one task writes the
        queue — and files that are not batch files are skipped.

        Raises:
            ReplayError: a file is not a complete state-topic batch of the (txid, epoch) its
                name gives, or is in another format.
        """
        offset = 0
        for file_id, path in self.batch_files():
            for entry in _arrow_entries(path, file_id, offset):
                yield entry
                offset += 1

    def replay(self, committed_txid: int) -> dict[Key, Any]:
        """The queue's state at ``committed_txid``: key -> TransactionalValue / OpaqueValue / plain value."""
        epochs: dict[int, int] = {}
        for file_id, _ in self.batch_files():
            epochs[file_id.txid] = max(file_id.epoch, epochs.get(file_id.txid, file_id.epoch))
        state = replay_state_topic(self.entries(), committed_txid, epochs=epochs)
        try:
            return {key: from_json_obj(obj) for key, obj in state.items()}
        except StateError as e:
            raise ReplayError(f"state topic {self._dir}: {e}") from e

    def top_epoch(self, txid: int) -> int | None:
        """The highest owner epoch that wrote a file for ``txid`` (the one the replay rule
        counts), or None when no file of it is left (never written, or compacted away)."""
        epochs = [file_id.epoch for file_id, _ in self.batch_files() if file_id.txid == txid]
        return max(epochs) if epochs else None

    def batch_files(self) -> list[tuple[BatchFileId, Path]]:
        """The queue's batch files with their (task, txid, epoch), in replay order (txid, epoch, task).

        Raises:
            ReplayError: a batch file is in another format than Arrow IPC (e.g. ``.jsonl`` or
                ``.parquet``): it is not a state-topic file, and skipping it could drop committed updates.
        """
        found: list[tuple[BatchFileId, Path]] = []
        for path in self._topic.files(self._queue):
            file_id = parse_batch_file_name(path.name)
            if file_id is None:
                logger.debug("state topic %s: skipping %s (not a batch file)", self._dir, path.name)
                continue
            if path.suffix != ARROW_SUFFIX:
                raise ReplayError(
                    f"state topic {self._dir}: {path.name} is not a state-topic batch file (state-topic batches are "
                    f"Arrow IPC files, {ARROW_SUFFIX}); move it out of the queue directory"
                )
            found.append((file_id, path))
        return sorted(found, key=lambda item: (item[0].txid, item[0].epoch, item[0].task_id))


def _arrow_entries(path: Path, file_id: BatchFileId, first_offset: int) -> Iterator[StateTopicEntry]:
    """The entries of one Arrow batch file, offsets from ``first_offset``."""
    for offset, (key, value) in enumerate(_arrow_pairs(path, file_id), first_offset):
        yield StateTopicEntry(key, value, offset, file_id.txid, file_id.epoch)


def _arrow_pairs(path: Path, file_id: BatchFileId) -> list[tuple[Key, dict[str, Any] | None]]:
    """(key, value object or None) of each row of one Arrow batch file, each column decoded with one ``json.loads``."""
    table = read_arrow_batch(path, file_id)
    texts = table["value"].to_pylist()
    try:
        keys = json.loads("[" + ",".join(table["key"].to_pylist()) + "]")
        values = json.loads("[" + ",".join("null" if text is None else text for text in texts) + "]")
    except json.JSONDecodeError as e:
        raise ReplayError(f"state-topic file {path}: a key or value is not JSON text ({e}); the file is corrupt") from e
    try:
        return [(as_key(key), value) for key, value in zip(keys, values, strict=True)]
    except (StateError, ValueError) as e:
        raise ReplayError(f"state-topic file {path}: {e}; the file is corrupt") from e


@dataclass(frozen=True)
class ReplayedChanges:
    """The net changes of a range of txids of one queue (see :func:`replay_changes`).

    Attributes:
        changes: key -> the key's winning value as its JSON object, or None for a winning
            tombstone (the key must be deleted from whatever state the range applies to).
        top_epochs: txid -> the owner epoch whose entries counted for it.
        files: batch files read.
        entries: entries read (of the counted epochs).
    """

    changes: dict[Key, dict[str, Any] | None]
    top_epochs: dict[int, int]
    files: int
    entries: int

    def live_items(self) -> Iterator[tuple[Key, dict[str, Any]]]:
        """(key, value JSON object) of every changed key that is not deleted."""
        return ((key, value) for key, value in self.changes.items() if value is not None)

    def encoded_live_items(self, where: object) -> Iterator[tuple[bytes, bytes]]:
        """(key bytes, value bytes) of every changed key that is not deleted: what a store holds.

        Each key and value is encoded once (:func:`key_text`, :func:`stored_value_text`);
        :func:`replay_arrow_changes` gives the same pairs for less.

        Raises:
            ReplayError: a value is not a stored state value (``where`` names the queue).
        """
        for key, obj in self.changes.items():
            if obj is not None:
                yield _encode_key_text(key).encode("utf-8"), stored_value_text(obj, where).encode("utf-8")


def replay_changes(
    queue: StateTopicQueue,
    *,
    after_txid: int,
    committed_txid: int,
    committed_epoch: int | None = None,
    on_file: Callable[[int, int, int], None] | None = None,
) -> ReplayedChanges:
    """The net changes that batches ``after_txid < txid <= committed_txid`` made, from the files.

    Applies the replay rule of :func:`replay_state_topic` (DESIGN invariant 5) with the file
    layout in mind, which makes it much cheaper than replaying :meth:`StateTopicQueue.entries`
    (see ``bench/restore.py``): files are read in (txid, epoch, task) order, so a later
    file always holds larger offsets; for each txid only the files of the highest epoch that
    has entries are read at all (lower epochs are skipped unread); each column of a file is
    decoded with one ``json.loads``. Applying the result to the state at ``after_txid`` gives the state at
    ``committed_txid``, because every counted entry of the range has a larger offset than any
    entry of a txid at or below ``after_txid``.

    Example:
        >>> replay_changes(queue, after_txid=-1, committed_txid=7).changes
        {('apple',): {'k': 'tx', 'txid': 7, 'val': 5}, ('pear',): None}

    Args:
        queue: the state-topic queue.
        after_txid: the txid the changes apply on top of (-1 for an empty state).
        committed_txid: the last txid to count.
        committed_epoch: the epoch ZooKeeper recorded for ``committed_txid``. When given, the
            range must be complete: every txid in it has a file (every batch writes one) and
            the file counted for ``committed_txid`` is of this epoch; a gap means committed
            batches were lost and raises instead of rebuilding a state that silently lacks them.
        on_file: called after each file read with (files read, batch files in the txid range,
            entries read so far).

    Returns:
        The changes, with tombstones, the counted epoch per txid and what was read.

    Raises:
        ReplayError: a counted file is not a complete state-topic batch of its (txid, epoch),
            exactly as :meth:`StateTopicQueue.entries` would report it, or a batch file is in
            another format; or (with ``committed_epoch``) a committed batch's file is missing.
    """
    changes, top_epochs, read, entries = _replay(queue, after_txid, committed_txid, committed_epoch, on_file, _arrow_pairs)
    return ReplayedChanges(changes=changes, top_epochs=top_epochs, files=read, entries=entries)


@dataclass(frozen=True)
class EncodedChanges:
    """:class:`ReplayedChanges` with each value as the bytes a store keeps: what the Kafka state
    topic's replay gives (the file state topic's is :class:`ArrowChanges`).

    Attributes:
        changes: key -> the winning value's stored bytes (``encode_stored``), or its JSON
            object where that was not canonical (encoded, or rejected, only if it is read), or
            None for a winning tombstone.
        top_epochs: txid -> the owner epoch whose entries counted for it.
        files: batch files read.
        entries: entries read (of the counted epochs).
    """

    changes: dict[Key, Any]
    top_epochs: dict[int, int]
    files: int
    entries: int

    def encoded_live_items(self, where: object) -> Iterator[tuple[bytes, bytes]]:
        """(key bytes, value bytes) of every changed key that is not deleted: what a store holds.

        Raises:
            ReplayError: a value is not a stored state value (``where`` names the queue).
        """
        encode_key_text = _encode_key_text
        for key, value in self.changes.items():
            if value is None:
                continue
            if value.__class__ is bytes:
                yield encode_key_text(key).encode("utf-8"), value
            else:
                yield encode_key_text(key).encode("utf-8"), stored_value_text(value, where).encode("utf-8")

    def encoded_items(self, where: object) -> Iterator[tuple[bytes, bytes | None]]:
        """(key bytes, value bytes, or None for a deleted key) of every changed key: what
        applying the changes to a store writes and deletes.

        Raises:
            ReplayError: a value is not a stored state value (``where`` names the queue).
        """
        encode_key_text = _encode_key_text
        for key, value in self.changes.items():
            key_bytes = encode_key_text(key).encode("utf-8")
            if value is None or value.__class__ is bytes:
                yield key_bytes, value
            else:
                yield key_bytes, stored_value_text(value, where).encode("utf-8")

    def live_items(self, where: object) -> Iterator[tuple[Key, Any]]:
        """(key, wrapped value) of every changed key that is not deleted.

        Raises:
            ReplayError: a value is not a stored state value (``where`` names the queue).
        """
        for key, value in self.changes.items():
            if value is None:
                continue
            try:
                yield key, decode_stored(value) if value.__class__ is bytes else from_json_obj(value)
            except StateError as e:
                raise ReplayError(f"state topic {where}: {e}") from e


@dataclass(frozen=True)
class ArrowChanges:
    """The net changes of a range of txids of one queue as Arrow columns (see :func:`replay_arrow_changes`).

    The rows come in key ranges (``ranges``): disjoint, ascending, each sorted, so together
    they are :attr:`table`. A large replay computes its ranges in background threads, and
    :meth:`encoded_live_chunks` hands each one on as soon as it is ready: a restore loads
    range i into RocksDB (Python, holding the GIL) while Arrow computes range i+1 (without it).

    Attributes:
        ranges: per key range, ascending, the (future) table of its rows, as :attr:`table`.
        top_epochs: txid -> the owner epoch whose entries counted for it.
        files: batch files read.
        entries: entries read (of the counted epochs).
    """

    ranges: tuple[Future[pa.Table], ...]
    top_epochs: dict[int, int]
    files: int
    entries: int

    @cached_property
    def table(self) -> pa.Table:
        """``key`` and ``value`` string columns (:data:`~stream_ops.state.state_batch_arrow.SCHEMA`),
        one row per changed key in ascending key (byte) order; the texts are the bytes a store
        keeps, a null value a winning tombstone (the key must be deleted). Waits for every range."""
        tables = list(self.range_tables())
        return pa.concat_tables(tables) if tables else SCHEMA.empty_table()

    def range_tables(self) -> Iterator[pa.Table]:
        """The table of each key range, in key order, each as soon as it is computed.

        A caller that stops early (a load that failed) cancels the ranges not started yet, so
        no work is left queued; the changes cannot be read again after that.

        Raises:
            pyarrow.ArrowException, MemoryError: computing a range failed.
        """
        try:
            for future in self.ranges:
                yield future.result()
        finally:
            for future in self.ranges:
                future.cancel()

    @property
    def live_at_most(self) -> int:
        """How many keys are not deleted, at most: exact once computed inline (a single range),
        else the entries read, so that a restore can log it before the ranges are done."""
        if len(self.ranges) > 1:
            return self.entries
        return self.table.num_rows - self.table["value"].null_count

    @property
    def keys(self) -> pa.Array:
        """Every changed key's text, deleted ones included, in key order."""
        return self.table["key"].combine_chunks()

    def live_table(self) -> pa.Table:
        """The rows of the keys that are not deleted, in key order."""
        return _live(self.table)

    def encoded_live_chunks(self, rows: int = LOAD_CHUNK_ROWS) -> Iterator[tuple[list[bytes], list[bytes]]]:
        """(key bytes, value bytes) of the keys that are not deleted, in key order, at most ``rows``
        at a time; a range's chunks come as soon as that range is computed."""
        for table in self.range_tables():
            for start in range(0, table.num_rows, rows):
                chunk = _live(table.slice(start, rows))  # small copies, whose memory is reused
                if chunk.num_rows:
                    yield chunk["key"].cast(pa.binary()).to_pylist(), chunk["value"].cast(pa.binary()).to_pylist()

    def encoded_items(self) -> Iterator[tuple[bytes, bytes | None]]:
        """(key bytes, value bytes or None for a deleted key) of every changed key, in key order:
        what applying the changes to a store writes and deletes."""
        keys = self.table["key"].cast(pa.binary()).to_pylist()
        return zip(keys, self.table["value"].cast(pa.binary()).to_pylist(), strict=True)

    def live_items(self, where: object) -> Iterator[tuple[Key, Any]]:
        """(key, wrapped value) of every changed key that is not deleted, in key order.

        Raises:
            ReplayError: a value is not a stored state value (``where`` names the queue).
        """
        live = self.live_table()
        for key, value in zip(live["key"].to_pylist(), live["value"].cast(pa.binary()).to_pylist(), strict=True):
            try:
                yield as_key(json.loads(key)), decode_stored(value)
            except StateError as e:
                raise ReplayError(f"state topic {where}: {e}") from e


def _live(table: pa.Table) -> pa.Table:
    """The rows of ``table`` whose value is not null (the keys not deleted)."""
    values = table["value"]
    return table if values.null_count == 0 else table.filter(pc.is_valid(values))


def replay_arrow_changes(
    queue: StateTopicQueue,
    *,
    after_txid: int,
    committed_txid: int,
    committed_epoch: int | None = None,
    on_file: Callable[[int, int, int], None] | None = None,
) -> ArrowChanges:
    """:func:`replay_changes` in Arrow columns of stored bytes — for a restore, a catch-up or a compaction.

    The same files are counted (the same code) and the same rule applied, vectorised: the
    counted files' columns are concatenated in offset order and :func:`~stream_ops.state.state_batch_arrow.last_per_key`
    keeps each key's last row. An Arrow file's columns are its stored bytes, read as they are
    (checked for shape, never decoded).

    Arrow compute releases the GIL, so the work is spread over threads: Arrow files are read
    in a thread pool, and a replay of more than ``2 * _RANGE_ROWS`` entries is cut into key
    ranges (:func:`~stream_ops.state.state_batch_arrow.key_ranges`) whose last rows are kept
    in the pool, returned as futures (:attr:`ArrowChanges.ranges`) for the caller to consume
    while the rest is computed. Each range applies the rule to all of its keys' rows in offset
    order, so the rows are exactly those of one unpartitioned pass.

    Example:
        >>> replay_arrow_changes(queue, after_txid=-1, committed_txid=7).table.to_pylist()
        [{'key': '["apple"]', 'value': '{"k":"tx","txid":7,"val":5}'}, {'key': '["pear"]', 'value': None}]

    Raises:
        ReplayError: see :func:`replay_changes`.
    """
    selected, total = _counted_files(queue, after_txid, committed_txid, committed_epoch)
    top_epochs = {txid: epoch for txid, epoch, _ in selected}
    files = [(file_id, path) for _, _, counted in selected for file_id, path in counted]
    pool = ThreadPoolExecutor(max_workers=_replay_threads(), thread_name_prefix="stream-ops-replay")
    try:
        tables = _read_tables(files, total, pool, on_file)
        rows = sum(table.num_rows for table in tables)
        entries = pa.concat_tables(tables) if tables else SCHEMA.empty_table()
        if rows < 2 * _RANGE_ROWS:  # small: one pass, here
            winners = last_per_key(entries["key"])
            ranges: tuple[Future[pa.Table], ...] = (_done(entries.take(winners)),)
        else:
            ranges = _range_futures(entries, pool)
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=False)  # the queued ranges still run; the threads end with them
    return ArrowChanges(ranges=ranges, top_epochs=top_epochs, files=len(files), entries=rows)


_RANGE_ROWS = 100_000
"""Entries per key range of a partitioned replay: small enough for a range's hash table and
sort to stay in the CPU caches (a third less CPU than one pass at 1.5M entries), large enough
that per-range overheads do not count."""
_MAX_RANGES = 64


def _replay_threads() -> int:
    """Threads for a replay's Arrow work: the CPUs this process may use, at most 4."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus))


def _read_tables(
    files: list[tuple[BatchFileId, Path]],
    total: int,
    pool: ThreadPoolExecutor,
    on_file: Callable[[int, int, int], None] | None,
) -> list[pa.Table]:
    """The (key, value) table of each file, in order, read in ``pool``; a failing file raises
    its error after those of the files before it, as a sequential read would."""
    reads = [pool.submit(read_arrow_batch, path, file_id) for file_id, path in files]
    tables: list[pa.Table] = []
    rows = 0
    for number, read in enumerate(reads, 1):
        table = read.result()
        tables.append(table)
        rows += table.num_rows
        if on_file is not None:
            on_file(number, total, rows)
    return tables


def _range_futures(entries: pa.Table, pool: ThreadPoolExecutor) -> tuple[Future[pa.Table], ...]:
    """The replay rule over ``entries`` (in offset order), cut into key ranges computed in ``pool``."""
    keys = entries["key"].combine_chunks()
    values = entries["value"].combine_chunks()  # a take from one array, not from 100 chunks
    pivots = key_pivots(keys, min(_MAX_RANGES, len(keys) // _RANGE_ROWS))
    step = -(-len(keys) // _replay_threads())  # each thread finds the ranges of a slice of rows
    slices = [pool.submit(range_ids, keys.slice(start, step), pivots) for start in range(0, len(keys), step)]
    ids = np.concatenate([part.result() for part in slices])
    return tuple(pool.submit(_range_table, keys, values, ids, number) for number in range(len(pivots) + 1))


def _range_table(keys: pa.Array, values: pa.Array, ids: np.ndarray, number: int) -> pa.Table:
    """The winning rows of key range ``number`` (``ids``: each row's range), in key order."""
    winners = pa.array(last_per_key_of(keys, range_rows(ids, number)))
    return pa.Table.from_arrays([keys.take(winners), values.take(winners)], schema=SCHEMA)


def _done(table: pa.Table) -> Future[pa.Table]:
    """A future already holding ``table``."""
    future: Future[pa.Table] = Future()
    future.set_result(table)
    return future


def _counted_files(
    queue: StateTopicQueue, after_txid: int, committed_txid: int, committed_epoch: int | None
) -> tuple[list[tuple[int, int, list[tuple[BatchFileId, Path]]]], int]:
    """The files the replay rule counts for ``after_txid < txid <= committed_txid``: per txid
    in order, (txid, the highest epoch with a file, its files), and the number of batch files
    in the range (see :func:`replay_changes` for ``committed_epoch``)."""
    by_txid: dict[int, list[tuple[BatchFileId, Path]]] = {}
    for file_id, path in queue.batch_files():
        if after_txid < file_id.txid <= committed_txid:
            by_txid.setdefault(file_id.txid, []).append((file_id, path))
    if committed_epoch is not None:
        _check_complete(queue, by_txid, after_txid, committed_txid, committed_epoch)
    selected = []
    for txid in sorted(by_txid):
        epoch = max(file_id.epoch for file_id, _ in by_txid[txid])  # the committing epoch wrote a file
        selected.append((txid, epoch, [(file_id, path) for file_id, path in by_txid[txid] if file_id.epoch == epoch]))
    return selected, sum(len(files) for files in by_txid.values())


def _replay(
    queue: StateTopicQueue,
    after_txid: int,
    committed_txid: int,
    committed_epoch: int | None,
    on_file: Callable[[int, int, int], None] | None,
    load: Callable[[Path, BatchFileId], list[tuple[Key, Any]]],
) -> tuple[dict[Key, Any], dict[int, int], int, int]:
    """The replay rule over the files of ``after_txid < txid <= committed_txid`` (see :func:`replay_changes`).

    Returns:
        (key -> value as ``load`` gives it, counted epoch per txid, files read, entries read).
    """
    selected, total = _counted_files(queue, after_txid, committed_txid, committed_epoch)
    changes: dict[Key, Any] = {}
    top_epochs: dict[int, int] = {}
    read = entries = 0
    for txid, epoch, files in selected:
        pairs: list[tuple[Key, Any]] = []
        for file_id, path in files:
            pairs.extend(load(path, file_id))
            read += 1
            if on_file is not None:
                on_file(read, total, entries + len(pairs))
        changes.update(pairs)  # in offset order: the largest offset per key wins
        top_epochs[txid] = epoch
        entries += len(pairs)
    return changes, top_epochs, read, entries


def _check_complete(
    queue: StateTopicQueue,
    by_txid: Mapping[int, list[tuple[BatchFileId, Path]]],
    after_txid: int,
    committed_txid: int,
    committed_epoch: int,
) -> None:
    """Raise unless every txid of ``after_txid < txid <= committed_txid`` has a file and the
    committed txid's highest epoch is ``committed_epoch``."""
    missing = [txid for txid in range(after_txid + 1, committed_txid + 1) if txid not in by_txid]
    if missing:
        shown = ", ".join(map(str, missing[:5])) + (" ..." if len(missing) > 5 else "")
        raise ReplayError(
            f"state topic {queue.path}: committed batch(es) txid {shown} have no state-topic file, although ZooKeeper "
            f"records txid {committed_txid} as committed and every batch writes one. The files were lost (an OS crash "
            "on storage that did not honour fsync, or deleted by hand); rebuilding without them would silently drop "
            "their updates. Restore them from a backup"
        )
    if committed_txid > after_txid:
        top = max(file_id.epoch for file_id, _ in by_txid[committed_txid])
        if top != committed_epoch:
            raise ReplayError(
                f"state topic {queue.path}: txid {committed_txid} was committed by epoch {committed_epoch}, but the "
                f"highest epoch with a file for it is {top}; the committing owner's file is lost"
            )


@contextmanager
def paused_cyclic_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a replay builds millions of objects.

    A replay keeps every decoded key and value alive until the store is loaded; each full
    collection walks all of them, which doubled the CPU time of a 1M-key replay. The objects
    a replay makes hold no reference cycles, so pausing loses nothing; the collector is
    re-enabled (if it was enabled) on exit, from any thread.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
