"""A RocksDB-backed :class:`~stream_ops.state.backing.BackingMap` with per-batch atomic writes.

Writes are buffered in memory (``pending``) and written by :meth:`RocksDBBackingMap.flush` in
ONE RocksDB write batch together with a marker recording the applied txid and owner epoch, so
the store never holds half a batch, nor data without the txid that produced it.

Layout (raw bytes): a key tuple is stored under ``encode_key(key)`` (JSON, always starting with
``[``); its value under :func:`~stream_ops.state.values.encode_stored`. The marker lives under
a key starting with a NUL byte, which no JSON text can equal.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import uuid
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from rocksdict import IngestExternalFileOptions, Options, Rdict, SstFileWriter, WriteBatch, WriteOptions

from stream_ops.errors import SstLoadError, StateError, TxidOrderError
from stream_ops.hashing import encode_key
from stream_ops.state.backing import check_same_length
from stream_ops.state.keys import Key, as_key
from stream_ops.state.value_columns import ChangeColumns
from stream_ops.state.values import decode_stored, encode_stored

logger = logging.getLogger(__name__)

_META_KEY = b"\x00meta"
_RESERVED_PREFIX = b"\x00"
_RESTORE_BATCH = 10_000
_TOMBSTONE = object()


def _options() -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    return options


def _db_key(key: Key) -> bytes:
    return encode_key(key).encode("utf-8")


def _key_of(db_key: bytes) -> Key:
    return as_key(json.loads(db_key))


class RocksDBBackingMap:
    """Durable keyed state of one task in a local RocksDB directory.

    Safe to use from several threads (a query thread reading while the batch thread writes).
    Only one process may open a path at a time: RocksDB's lock file enforces it.

    Example:
        >>> store = RocksDBBackingMap("/var/lib/stream-ops/state/t00003")
        >>> store.multi_put([("apple",)], [TransactionalValue(7, 3)])
        >>> store.flush(txid=7, epoch=2)           # data and marker in one write
        >>> store.applied_marker()
        (7, 2)
        >>> store.close()

    Args:
        path: the database directory (created if missing).
        sync: fsync RocksDB's write-ahead log on every flush, so a machine crash cannot lose
            a flushed batch.
    """

    def __init__(self, path: str | os.PathLike[str], *, sync: bool = True) -> None:
        self._path = Path(path)
        self._lock = threading.RLock()
        self._pending: dict[Key, Any] = {}
        self._write_options = WriteOptions()
        self._write_options.sync = sync
        self._path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db: Rdict | None = Rdict(str(self._path), _options())
        except Exception as e:  # rocksdict raises plain Exception for every RocksDB error
            if "lock" in str(e).lower():
                raise StateError(
                    f"another worker holds the state store at {self._path} (its RocksDB lock is taken); "
                    "stop that worker, or wait until it has released the task, before opening the store here"
                ) from e
            raise StateError(f"could not open the state store at {self._path}: {e}") from e
        logger.info("opened state store %s (applied marker %s)", self._path, self.applied_marker())

    @property
    def path(self) -> Path:
        return self._path

    # --- BackingMap ---------------------------------------------------------------------------

    def multi_get(self, keys: Sequence[Key], *, include_pending: bool = True) -> list[Any | None]:
        """The wrapped value of each key, None where absent.

        Args:
            keys: key tuples.
            include_pending: also see writes not flushed yet (the batch's own writes). A reader
                that must see only flushed batches passes False.
        """
        norm = [as_key(key) for key in keys]
        with self._lock:
            pending = self._pending if include_pending else {}
            result: list[Any] = [pending.get(key) for key in norm]
            misses = [i for i, key in enumerate(norm) if key not in pending]
            if misses:
                raw = self._call("read", lambda db: db.get([_db_key(norm[i]) for i in misses]))
                for i, data in zip(misses, raw, strict=True):
                    result[i] = None if data is None else decode_stored(data)
        return [None if value is _TOMBSTONE else value for value in result]

    def get_encoded(self, keys: list[bytes]) -> list[bytes | None]:
        """The stored bytes of each encoded key (``encode_key`` as UTF-8), None where absent;
        flushed values only (for a column-wise update, which buffers nothing here)."""
        result: list[bytes | None] = self._call("read", lambda db: db.get(keys))
        return result

    def has_pending(self) -> bool:
        """Whether writes are buffered (not flushed yet)."""
        with self._lock:
            return bool(self._pending)

    def multi_put(self, keys: Sequence[Key], values: Sequence[Any]) -> None:
        """Buffer one wrapped value per key until :meth:`flush` (None deletes the key)."""
        check_same_length(keys, values, "RocksDBBackingMap.multi_put")
        with self._lock:
            for key, value in zip(keys, values, strict=True):
                self._pending[as_key(key)] = _TOMBSTONE if value is None else value

    # --- batches ----------------------------------------------------------------------------

    def delete(self, keys: Iterable[Key]) -> None:
        """Buffer deletions of ``keys`` until :meth:`flush`."""
        with self._lock:
            for key in keys:
                self._pending[as_key(key)] = _TOMBSTONE

    def pending_items(self) -> list[tuple[Key, Any | None]]:
        """The buffered writes as (key, wrapped value), None for a deletion — the state-topic entries of the batch."""
        with self._lock:
            return [(key, None if value is _TOMBSTONE else value) for key, value in self._pending.items()]

    def pending_columns(self) -> tuple[list[Key], list[Any | None]]:
        """:meth:`pending_items` as two lists, keys and wrapped values (None for a deletion)."""
        with self._lock:
            keys = list(self._pending)
            values = list(self._pending.values())
        if any(value is _TOMBSTONE for value in values):
            values = [None if value is _TOMBSTONE else value for value in values]
        return keys, values

    def discard_pending(self) -> None:
        """Drop the buffered writes (the batch is abandoned)."""
        with self._lock:
            dropped = len(self._pending)
            self._pending.clear()
        if dropped:
            logger.info("state store %s: discarded %d pending writes", self._path, dropped)

    def flush(self, txid: int, epoch: int, *, encoded: Sequence[tuple[str, str | None]] | None = None) -> None:
        """Write the pending values and the marker (txid, epoch) in one atomic write batch.

        Args:
            encoded: the pending items as the caller encoded them already (key text and stored
                value text, None for a deletion: ``state_topic.encode_items(pending_items())``,
                or its columns, ``state_topic.encode_changes(*pending_columns())``), so that each
                value is encoded once per batch. With no writes buffered, columns computed without
                the buffer (:mod:`~stream_ops.state.column_update`) are written as they are.

        Raises:
            TxidOrderError: if the store has already applied a later txid.
        """
        meta = _encode_marker(txid, epoch)
        with self._lock:
            marker = self.applied_marker()
            if marker is not None and txid < marker[0]:
                raise TxidOrderError(
                    f"cannot flush txid {txid} to the state store at {self._path}: it has applied txid "
                    f"{marker[0]}; rebuild the store from the state topic at the committed txid"
                )
            batch = WriteBatch(raw_mode=True)
            if isinstance(encoded, ChangeColumns):
                if self._pending and len(encoded) != len(self._pending):
                    raise StateError(
                        f"RocksDBBackingMap.flush(encoded=...): got {len(self._pending)} keys but {len(encoded)} "
                        "encoded changes; pass one per pending key"
                    )
                keys, values = encoded.key_bytes(), encoded.value_bytes()
                if encoded.values.null_count:
                    for key_bytes, value_bytes in zip(keys, values, strict=True):
                        if value_bytes is None:
                            batch.delete(key_bytes)
                        else:
                            batch.put(key_bytes, value_bytes)
                else:  # the hot loop of a commit, without bytecode per key
                    deque(map(batch.put, keys, values), maxlen=0)
            elif encoded is not None:
                check_same_length(encoded, list(self._pending), "RocksDBBackingMap.flush(encoded=...)")
                for key_text, value_text in encoded:
                    if value_text is None:
                        batch.delete(key_text.encode("utf-8"))
                    else:
                        batch.put(key_text.encode("utf-8"), value_text.encode("utf-8"))
            else:
                for key, value in self._pending.items():
                    if value is _TOMBSTONE:
                        batch.delete(_db_key(key))
                    else:
                        batch.put(_db_key(key), encode_stored(value))
            batch.put(_META_KEY, meta)
            self._write_batch("write", batch)
            written = len(self._pending)
            self._pending.clear()
        logger.debug("state store %s: flushed txid %d epoch %d (%d keys)", self._path, txid, epoch, written)

    def applied_marker(self) -> tuple[int, int] | None:
        """(txid, owner epoch) of the last flushed batch, or None for a store never flushed."""
        data = self._call("read the marker", lambda db: db.get(_META_KEY))
        if data is None:
            return None
        try:
            meta = json.loads(data)
            return int(meta["txid"]), int(meta["epoch"])
        except (ValueError, KeyError, TypeError) as e:
            raise StateError(f"state store {self._path} has a corrupt marker {data!r}; rebuild the store") from e

    def restore(self, items: Iterable[tuple[Key, Any]], txid: int, epoch: int) -> int:
        """Bulk-load (key, wrapped value) pairs into an EMPTY store and set the marker.

        Writes go in batches of about 10,000; the marker is written with the last one, so an
        interrupted restore leaves a store with data but no marker — destroy it and restore
        again. Items whose value is None are skipped.

        Returns:
            The number of keys written.

        Raises:
            StateError: if the store holds any key, a marker or pending writes.
        """
        meta = _encode_marker(txid, epoch)
        with self._lock:
            self._require_empty()
            count = 0
            batch = WriteBatch(raw_mode=True)
            for key, value in items:
                if value is None:
                    continue
                batch.put(_db_key(as_key(key)), encode_stored(value))
                count += 1
                if batch.len() >= _RESTORE_BATCH:
                    self._write_batch("restore", batch)
                    batch = WriteBatch(raw_mode=True)
            batch.put(_META_KEY, meta)
            self._write_batch("restore", batch)
        logger.info("state store %s: restored %d keys at txid %d epoch %d", self._path, count, txid, epoch)
        return count

    def restore_encoded(self, pairs: Iterable[tuple[bytes, bytes]], txid: int, epoch: int) -> int:
        """Bulk-load already encoded (key bytes, value bytes) pairs into an EMPTY store and set the marker.

        The fast twin of :meth:`restore` for callers that hold the stored bytes already — a
        snapshot's ``key``/``value`` columns, or values re-encoded once from a state-topic
        file: nothing is decoded or re-encoded here. Each key must be ``encode_key(key)`` as
        UTF-8 and each value :func:`~stream_ops.state.values.encode_stored` output; only the
        cheap part of that is checked (bytes, a key starting with ``[``, so no pair can land on
        the marker). Same safety as :meth:`restore`: an empty store is required, writes go in
        batches of about 10,000 and the marker is written with the last one, so an interrupted
        or failed restore leaves data without a marker — destroy the store and restore again.
        Pairs whose value is None are skipped.

        Example:
            >>> store.restore_encoded([(b'["apple"]', b'{"k":"tx","txid":7,"val":5}')], txid=7, epoch=2)
            1

        Returns:
            The number of keys written.

        Raises:
            StateError: the store holds any key, a marker or pending writes; or a pair is not
                (bytes, bytes) with a JSON-list key.
        """
        meta = _encode_marker(txid, epoch)
        with self._lock:
            self._require_empty()
            count = in_batch = 0
            batch = WriteBatch(raw_mode=True)
            put = batch.put
            for key, value in pairs:  # the hot loop of a restore: a cheap check, then the put
                if value is None:
                    continue
                try:
                    if key[:1] != b"[":  # not an encoded key (the marker's key starts with NUL)
                        raise ValueError("not an encoded key")
                    put(key, value)
                except (ValueError, KeyError, TypeError) as e:  # rocksdict: "raw mode only support bytes"
                    raise StateError(_bad_encoded_pair(self._path, key, value)) from e
                in_batch += 1
                if in_batch == _RESTORE_BATCH:
                    self._write_batch("restore", batch)
                    count += in_batch
                    in_batch = 0
                    batch = WriteBatch(raw_mode=True)
                    put = batch.put
            count += in_batch
            batch.put(_META_KEY, meta)
            self._write_batch("restore", batch)
        logger.info("state store %s: restored %d encoded keys at txid %d epoch %d", self._path, count, txid, epoch)
        return count

    def restore_sorted(self, runs: Iterable[Iterable[tuple[Sequence[bytes], Sequence[bytes]]]], txid: int, epoch: int) -> int:
        """Bulk-load sorted runs of encoded pairs into an EMPTY store through SST files, then set the marker.

        The fastest load (see ``docs/facts.md``): each run is written into one SST file
        (RocksDB's ``SstFileWriter``), which is then ingested (moved into the database), and the
        marker goes last in a synced write. A run is an iterable of chunks (key bytes, value
        bytes), two lists of one length; its keys must ascend strictly across all its chunks,
        and no key may be in two runs (e.g. a snapshot's rows without the tail's keys, then the
        tail's). Keys and values are the stored bytes, as for :meth:`restore_encoded`; only the
        first and last key of each chunk are checked to start with ``[`` (every key between
        them then does). Same safety as :meth:`restore`: an interrupted or failed load leaves
        data without a marker — destroy the store and restore again.

        Returns:
            The number of keys written.

        Raises:
            StateError: the store is not empty; a chunk's lists differ in length, hold a key
                that is not encoded or is out of order, or a value that is not bytes.
        """
        meta = _encode_marker(txid, epoch)
        staging = self._path.parent / f".{self._path.name}.ingest-{uuid.uuid4().hex}"
        with self._lock:
            self._require_empty()
            count = 0
            try:
                staging.mkdir(parents=True)
                for number, run in enumerate(runs):
                    sst = staging / f"run-{number:05d}.sst"
                    written = write_sorted_sst(sst, run, where=self._path)
                    if written:
                        ingest = IngestExternalFileOptions()
                        ingest.set_move_files(True)
                        self._call("ingest a restore file", lambda db, f=str(sst), o=ingest: db.ingest_external_file([f], o))
                    count += written
                batch = WriteBatch(raw_mode=True)
                batch.put(_META_KEY, meta)
                self._write_batch("restore", batch)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        logger.info("state store %s: restored %d sorted keys at txid %d epoch %d", self._path, count, txid, epoch)
        return count

    def restore_from_sst(self, sst: Path, changes: Iterable[tuple[bytes, bytes | None]], txid: int, epoch: int) -> None:
        """Load an EMPTY store from the SST file beside a snapshot, then apply the state-topic
        tail ``changes`` (encoded keys, encoded values or None to delete) and set the marker.

        The SST is copied next to the store and ingested (no Python call per key: the fastest
        restore there is); the tail and the marker go in one synced write batch. The store then
        holds exactly what :meth:`restore_sorted` of the snapshot rows without the tail's keys,
        then the tail's live values, leaves.

        Raises:
            SstLoadError: the SST could not be copied or ingested (missing, cut short, written
                by an incompatible RocksDB); nothing was written, the store is still empty.
            StateError: the store is not empty, or the tail could not be written after the
                ingest (destroy the store and restore again).
        """
        meta = _encode_marker(txid, epoch)
        staging = self._path.parent / f".{self._path.name}.ingest-{uuid.uuid4().hex}"
        with self._lock:
            self._require_empty()
            try:
                staging.mkdir(parents=True)
                local = staging / "snapshot.sst"
                shutil.copyfile(sst, local)
                ingest = IngestExternalFileOptions()
                ingest.set_move_files(True)
                self._call("ingest the snapshot's SST", lambda db: db.ingest_external_file([str(local)], ingest))
            except (OSError, StateError) as e:
                raise SstLoadError(f"state store {self._path}: could not load {sst}: {e}") from e
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            batch = WriteBatch(raw_mode=True)
            for key, value in changes:
                if value is None:
                    batch.delete(key)
                else:
                    batch.put(key, value)
            batch.put(_META_KEY, meta)
            self._write_batch("apply the state-topic tail after the snapshot's SST", batch)
        logger.info("state store %s: loaded %s and the tail at txid %d epoch %d", self._path, sst.name, txid, epoch)

    def apply_encoded(self, pairs: Iterable[tuple[bytes, bytes | None]], txid: int, epoch: int) -> int:
        """Apply encoded changes (a value of None deletes the key) on top of the store's state and
        move its marker to (txid, epoch), all in one atomic write batch.

        This is how a store that is behind catches up with a state-topic tail (a standby
        replica, or a task's own store after a move back): either every change and the new
        marker are written, or none is. Keys are ``encode_key`` bytes and values
        :func:`~stream_ops.state.values.encode_stored` bytes, as for :meth:`restore_encoded`.

        Returns:
            The number of changes written (puts and deletes).

        Raises:
            StateError: the store has pending writes, or a pair is not encoded.
            TxidOrderError: the store has applied ``txid`` or a later one already.
        """
        meta = _encode_marker(txid, epoch)
        with self._lock:
            if self._pending:
                raise StateError(f"state store {self._path} has pending writes; flush or discard them before applying a tail")
            marker = self.applied_marker()
            if marker is not None and txid <= marker[0]:
                raise TxidOrderError(
                    f"state store {self._path} is at txid {marker[0]}; a tail up to txid {txid} does not move it"
                )
            batch = WriteBatch(raw_mode=True)
            count = 0
            for key, value in pairs:
                try:
                    if key[:1] != b"[":
                        raise ValueError("not an encoded key")
                    if value is None:
                        batch.delete(key)
                    else:
                        batch.put(key, value)
                except (ValueError, KeyError, TypeError) as e:
                    raise StateError(_bad_encoded_pair(self._path, key, value)) from e
                count += 1
            batch.put(_META_KEY, meta)
            self._write_batch("apply a tail", batch)
        logger.debug("state store %s: applied %d changes up to txid %d epoch %d", self._path, count, txid, epoch)
        return count

    # --- inspection -------------------------------------------------------------------------

    def items(self) -> Iterator[tuple[Key, Any]]:
        """Every flushed (key, wrapped value), in key-byte order; pending writes are not included."""
        for db_key, data in self._call("iterate", lambda db: db.items()):
            if not db_key.startswith(_RESERVED_PREFIX):
                yield _key_of(db_key), decode_stored(data)

    def count_keys(self) -> int:
        """RocksDB's *estimate* of the number of flushed keys (cheap; may be off after deletes)."""
        estimate = self._call("count", lambda db: db.property_int_value("rocksdb.estimate-num-keys")) or 0
        has_marker = self.applied_marker() is not None
        return max(0, estimate - (1 if has_marker else 0))

    # --- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Close the database (idempotent); pending writes are dropped."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
                logger.info("closed state store %s", self._path)

    def __enter__(self) -> RocksDBBackingMap:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @classmethod
    def destroy(cls, path: str | os.PathLike[str]) -> None:
        """Delete the database at ``path`` and its directory (no-op if missing; it must be closed)."""
        try:
            Rdict.destroy(str(path), _options())
        except Exception as e:  # rocksdict raises plain Exception
            raise StateError(f"could not destroy the state store at {path}: {e}; close it first") from e
        shutil.rmtree(path, ignore_errors=True)
        logger.info("destroyed state store %s", path)

    # --- helpers ----------------------------------------------------------------------------

    def _require_empty(self) -> None:
        if self._pending or self.applied_marker() is not None or not self._is_empty():
            raise StateError(
                f"restore needs an empty state store, but {self._path} already holds data; "
                "destroy it first (RocksDBBackingMap.destroy)"
            )

    def _is_empty(self) -> bool:
        return next(iter(self._call("iterate", lambda db: db.keys())), None) is None

    def _write_batch(self, action: str, batch: WriteBatch) -> None:
        """Write ``batch`` atomically with the store's write options (synced): the one place every
        flush, tail, restore and marker reaches RocksDB, and so where tests inject a failed or slow
        write. Raises StateError when RocksDB refuses it (nothing of the batch is applied)."""
        self._call(action, lambda db: db.write(batch, self._write_options))

    def _call(self, action: str, op: Any) -> Any:
        """Run ``op(db)``, turning RocksDB's plain exceptions into StateError."""
        db = self._db
        if db is None:
            raise StateError(f"state store {self._path} is closed; cannot {action}")
        try:
            return op(db)
        except Exception as e:  # rocksdict raises plain Exception for every RocksDB error
            raise StateError(f"state store {self._path}: could not {action}: {e}") from e


def write_sorted_sst(path: Path, run: Iterable[tuple[Sequence[bytes], Sequence[bytes]]], *, where: object) -> int:
    """Write one sorted run of encoded (key, value) chunks into the SST file ``path`` with the
    stores' options; returns its keys (0: no file left, RocksDB cannot finish an empty one).

    Used to load a restore (:meth:`RocksDBBackingMap.restore_sorted`) and to write the SST
    beside a snapshot (:meth:`RocksDBBackingMap.restore_from_sst` ingests it). ``where`` names
    the store or snapshot, for errors.

    Raises:
        StateError: a chunk's lists differ in length, a key is not encoded or out of order, or
            a value is not bytes.
    """
    writer = SstFileWriter(_options())
    put = writer.__setitem__
    count = 0
    try:
        writer.open(str(path))
        for keys, values in run:
            if len(keys) != len(values):
                raise StateError(f"writing {path} for {where}: {len(keys)} keys but {len(values)} values in a chunk")
            if not keys:
                continue
            first, last = keys[0], keys[-1]
            if first[:1] != b"[" or last[:1] != b"[":
                bad = first if first[:1] != b"[" else last
                raise StateError(_bad_encoded_pair(Path(str(where)), bad, None))
            deque(map(put, keys, values), maxlen=0)  # the hot loop of a restore, without bytecode per key
            count += len(keys)
        if count:
            writer.finish()
    except StateError:
        raise
    except Exception as e:  # rocksdict raises plain Exception (order) or TypeError (not bytes)
        raise StateError(
            f"writing {path} for {where}: {e} (keys must be encoded bytes in strictly ascending order, values bytes); "
            "a store being restored holds a partial restore without a marker — destroy it and restore again"
        ) from e
    return count


def _bad_encoded_pair(path: Path, key: Any, value: Any) -> str:
    return (
        f"restore_encoded into {path}: expected (encoded key bytes starting with '[', encoded value bytes), "
        f"got ({type(key).__name__} {key!r:.80}, {type(value).__name__} {value!r:.80}); "
        "the store holds a partial restore without a marker — destroy it and restore again"
    )


def _encode_marker(txid: int, epoch: int) -> bytes:
    for name, number in (("txid", txid), ("epoch", epoch)):
        if not isinstance(number, int) or isinstance(number, bool) or number < 0:
            raise StateError(f"state store marker {name} must be a non-negative integer, got {number!r}")
    return json.dumps({"txid": txid, "epoch": epoch}, separators=(",", ":")).encode("utf-8")
