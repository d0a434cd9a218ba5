"""The records of a state topic kept in Kafka, and the replay rule over them (pure; no broker).

One partition of the Kafka topic is one queue of the state topic. A batch (task, txid n, owner
epoch e) is one *attempt*: its entries, then an end record, produced in that order by one
idempotent producer, all carrying the headers

    ``stream_ops.task``, ``stream_ops.txid``, ``stream_ops.epoch``   decimal ASCII
    ``stream_ops.attempt``                                          an id unique to the append

An entry's key is the state key's bytes in a store (``encode_key`` as UTF-8) and its value the
stored value's bytes (``encode_stored``), or null for a deletion. The end record has a null key
and value and the extra header ``stream_ops.end``: the number of entries of its attempt.

The rule is the file state topic's (:mod:`stream_ops.state.state_topic`), with an attempt in
place of a batch file:

- an attempt is *complete* when its end record follows exactly the number of entries it names
  (an append cut short by a crash has no end record, or too few entries: it is ignored, as its
  batch was never committed — step 5 runs only after the end record is acknowledged);
- per txid the *counted* attempt is the complete one of the highest owner epoch (the committing
  owner always wrote one; a lower epoch is a zombie's late write); when that epoch appended the
  txid more than once, the attempt whose end record came last counts (a replay overwrites its
  own batch, as a file is rewritten);
- the state at a committed txid C is, per key, the last entry of the counted attempts of the
  txids up to C, applied in txid order (which is their offset order: batch n + 1 is appended
  only after batch n was committed); a winning deletion means the key is absent.

Records of other attempts (zombies, crashed appends, txids above C) may interleave anywhere;
they change nothing. :class:`KafkaStateBatches` collects records incrementally (a standby adds
what it reads on each poll) and answers with the same :class:`ReplayedChanges` /
:class:`EncodedChanges` as the file replay, so snapshots and restores share their code.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stream_ops.errors import ReplayError, StateError
from stream_ops.state.keys import Key, as_key
from stream_ops.state.state_topic import EncodedChanges, ReplayedChanges
from stream_ops.state.values import from_json_obj

HEADER_TASK = "stream_ops.task"
HEADER_TXID = "stream_ops.txid"
HEADER_EPOCH = "stream_ops.epoch"
HEADER_ATTEMPT = "stream_ops.attempt"
HEADER_END = "stream_ops.end"

_VALUE_HEAD = b'{"k":"'


@dataclass(frozen=True)
class KafkaRecord:
    """One record read from a state-topic partition.

    Attributes:
        offset: its offset in the partition.
        key: the record key (an entry's key bytes; None for an end record).
        value: the record value (stored value bytes; None for a deletion or an end record).
        headers: header name -> bytes (the last value of a repeated header).
    """

    offset: int
    key: bytes | None
    value: bytes | None
    headers: Mapping[str, bytes]

    @classmethod
    def from_message(cls, message: Any) -> KafkaRecord:
        """A record from a confluent-kafka ``Message``."""
        return cls(
            offset=message.offset(),
            key=message.key(),
            value=message.value(),
            headers={name: value or b"" for name, value in message.headers() or ()},
        )


@dataclass(frozen=True)
class OutgoingRecord:
    """One record to produce: key, value and headers (as confluent-kafka takes them)."""

    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]


def batch_records(
    task_id: int, txid: int, epoch: int, attempt: str, encoded: Sequence[tuple[str, str | None]]
) -> list[OutgoingRecord]:
    """The records of one batch: an entry per (key text, stored value text or None), then the end record.

    Example:
        >>> [r.key for r in batch_records(2, 7, 3, "a1", [('["apple"]', '{"k":"tx","txid":7,"val":5}')])]
        [b'["apple"]', None]
    """
    headers = [
        (HEADER_TASK, str(task_id).encode()),
        (HEADER_TXID, str(txid).encode()),
        (HEADER_EPOCH, str(epoch).encode()),
        (HEADER_ATTEMPT, attempt.encode()),
    ]
    records = [
        OutgoingRecord(key.encode("utf-8"), None if value is None else value.encode("utf-8"), headers) for key, value in encoded
    ]
    records.append(OutgoingRecord(None, None, [*headers, (HEADER_END, str(len(encoded)).encode())]))
    return records


@dataclass
class _Attempt:
    """The records of one append seen so far."""

    task_id: int
    txid: int
    epoch: int
    entries: list[tuple[bytes, bytes | None]] = field(default_factory=list)
    end_offset: int | None = None
    declared: int | None = None

    @property
    def complete(self) -> bool:
        return self.end_offset is not None and self.declared == len(self.entries)


@dataclass(frozen=True)
class CountedBatch:
    """The attempt that counts for a txid.

    Attributes:
        txid: the batch.
        epoch: the owner epoch that wrote it (the committing one, for a committed txid).
        end_offset: the offset of its end record; everything a later txid counts lies above it.
        entries: its number of entries.
    """

    txid: int
    epoch: int
    end_offset: int
    entries: int


class KafkaStateBatches:
    """The attempts of one state-topic partition read so far, and the replay rule over them.

    Records are added in offset order with :meth:`add` (or :meth:`extend`), possibly over
    several reads; an attempt whose end record has not been read yet simply is not complete
    yet.

    Example:
        >>> batches = KafkaStateBatches("kafka:state/0")
        >>> batches.extend(records)                       # read from the partition
        >>> batches.counted(7)
        CountedBatch(txid=7, epoch=3, end_offset=41, entries=5)
        >>> batches.replayed_changes(after_txid=-1, committed_txid=7).changes
        {('apple',): {'k': 'tx', 'txid': 7, 'val': 5}}
    """

    def __init__(self, where: str) -> None:
        self.where = where
        self._attempts: dict[tuple[int, int, str], _Attempt] = {}
        self._counted: dict[int, tuple[CountedBatch, _Attempt]] = {}
        self.records = 0
        self.next_offset: int | None = None
        """The offset after the last record added (where the next read goes on)."""

    def extend(self, records: Iterable[KafkaRecord]) -> None:
        """:meth:`add` each record, in order."""
        for record in records:
            self.add(record)

    def add(self, record: KafkaRecord) -> None:
        """Take one record (offsets must increase).

        Raises:
            ReplayError: the record is not a state-topic record (headers missing or malformed),
                or its attempt is malformed (an entry or a second end record after its end).
        """
        where = f"state topic {self.where} offset {record.offset}"
        if self.next_offset is not None and record.offset < self.next_offset:
            raise ReplayError(f"{where}: read after offset {self.next_offset - 1}; records must come in offset order")
        self.next_offset = record.offset + 1
        self.records += 1
        task_id = _number(record.headers, HEADER_TASK, where)
        txid = _number(record.headers, HEADER_TXID, where)
        epoch = _number(record.headers, HEADER_EPOCH, where)
        attempt_id = record.headers.get(HEADER_ATTEMPT)
        if not attempt_id:
            raise ReplayError(f"{where}: no {HEADER_ATTEMPT} header; not a stream_ops state-topic record")
        key = (txid, epoch, attempt_id.decode("utf-8", "replace"))
        attempt = self._attempts.get(key)
        if attempt is None:
            attempt = self._attempts[key] = _Attempt(task_id, txid, epoch)
        if attempt.end_offset is not None:
            raise ReplayError(
                f"{where}: a record of txid {txid} epoch {epoch} attempt {key[2]} after its end record at offset "
                f"{attempt.end_offset}; the partition holds records a stream_ops task did not write"
            )
        if HEADER_END in record.headers:
            attempt.end_offset = record.offset
            attempt.declared = _number(record.headers, HEADER_END, where)
            if attempt.complete:
                self._count(attempt)
            return
        if record.key is None or record.key[:1] != b"[" or record.key[-1:] != b"]":
            raise ReplayError(f"{where}: the key {record.key!r:.80} is not a state key (a JSON list)")
        if record.value is not None and (record.value[:6] != _VALUE_HEAD or record.value[-1:] != b"}"):
            raise ReplayError(f"{where}: the value {record.value!r:.80} is not a stored state value")
        attempt.entries.append((record.key, record.value))

    def _count(self, attempt: _Attempt) -> None:
        """Make a just completed attempt the counted one of its txid if the rule says so."""
        assert attempt.end_offset is not None
        current = self._counted.get(attempt.txid)
        if current is None or attempt.epoch >= current[0].epoch:  # a later end of the same epoch rewrites
            batch = CountedBatch(attempt.txid, attempt.epoch, attempt.end_offset, len(attempt.entries))
            self._counted[attempt.txid] = (batch, attempt)

    def counted(self, txid: int) -> CountedBatch | None:
        """The batch that counts for ``txid`` among what was read, None if no complete one."""
        found = self._counted.get(txid)
        return found[0] if found is not None else None

    def forget_through(self, txid: int) -> None:
        """Drop every attempt of txids up to ``txid`` (applied already; a standby keeps the rest)."""
        self._attempts = {key: a for key, a in self._attempts.items() if a.txid > txid}
        self._counted = {t: c for t, c in self._counted.items() if t > txid}

    def replayed_changes(self, *, after_txid: int, committed_txid: int, committed_epoch: int | None = None) -> ReplayedChanges:
        """The net changes of txids ``after_txid < txid <= committed_txid``, values as JSON objects.

        Args:
            after_txid: the txid the changes apply on top of (-1 for an empty state).
            committed_txid: the last txid to count.
            committed_epoch: the epoch ZooKeeper recorded for ``committed_txid``; when given,
                every txid of the range must have a counted batch and the committed one must be
                of this epoch (else the committed batches were not all read, or were lost).

        Raises:
            ReplayError: see ``committed_epoch``; or a key or value is not JSON.
        """
        pairs, top_epochs, batches, entries = self._net(after_txid, committed_txid, committed_epoch)
        keys = _decode_keys([key for key, _ in pairs], self.where)
        values = _decode_values([value for _, value in pairs], self.where)
        return ReplayedChanges(
            changes=dict(zip(keys, values, strict=True)), top_epochs=top_epochs, files=batches, entries=entries
        )

    def encoded_changes(self, *, after_txid: int, committed_txid: int, committed_epoch: int | None = None) -> EncodedChanges:
        """:meth:`replayed_changes` with each value as the bytes a store keeps (the record values as they are)."""
        pairs, top_epochs, batches, entries = self._net(after_txid, committed_txid, committed_epoch)
        keys = _decode_keys([key for key, _ in pairs], self.where)
        changes = dict(zip(keys, (value for _, value in pairs), strict=True))
        return EncodedChanges(changes=changes, top_epochs=top_epochs, files=batches, entries=entries)

    def _net(
        self, after_txid: int, committed_txid: int, committed_epoch: int | None
    ) -> tuple[list[tuple[bytes, bytes | None]], dict[int, int], int, int]:
        """(key bytes, value bytes or None) of the last write per key, counted epochs, batches, entries."""
        if committed_epoch is not None:
            self._check_complete(after_txid, committed_txid, committed_epoch)
        net: dict[bytes, bytes | None] = {}
        top_epochs: dict[int, int] = {}
        batches = entries = 0
        for txid in sorted(t for t in self._counted if after_txid < t <= committed_txid):
            batch, attempt = self._counted[txid]
            net.update(attempt.entries)  # in offset order: the last entry per key wins
            top_epochs[txid] = batch.epoch
            batches += 1
            entries += batch.entries
        return list(net.items()), top_epochs, batches, entries

    def _check_complete(self, after_txid: int, committed_txid: int, committed_epoch: int) -> None:
        missing = [txid for txid in range(after_txid + 1, committed_txid + 1) if txid not in self._counted]
        if missing:
            shown = ", ".join(map(str, missing[:5])) + (" ..." if len(missing) > 5 else "")
            raise ReplayError(
                f"state topic {self.where}: committed batch(es) txid {shown} have no complete batch in the partition, "
                f"although ZooKeeper records txid {committed_txid} as committed and every batch appends one before its "
                "commit. The records were lost (deleted by hand or by a retention setting, or a topic recreated); "
                "rebuilding without them would silently drop their updates"
            )
        if committed_txid > after_txid:
            top = self._counted[committed_txid][0].epoch
            if top != committed_epoch:
                raise ReplayError(
                    f"state topic {self.where}: txid {committed_txid} was committed by epoch {committed_epoch}, but the "
                    f"highest epoch with a complete batch for it is {top}; the committing owner's records are lost"
                )


def replay_kafka_state(records: Iterable[KafkaRecord], committed_txid: int, *, where: str = "records") -> dict[Key, Any]:
    """The state a partition's records describe at ``committed_txid``: key -> wrapped value (pure).

    Example:
        >>> replay_kafka_state(batch_records_read_back, committed_txid=7)
        {('apple',): TransactionalValue(txid=7, val=5)}

    Raises:
        ReplayError: a record is not a state-topic record, or a value is not a stored state value.
    """
    batches = KafkaStateBatches(where)
    batches.extend(records)
    try:
        return {
            key: from_json_obj(obj)
            for key, obj in batches.replayed_changes(after_txid=-1, committed_txid=committed_txid).live_items()
        }
    except StateError as e:
        raise ReplayError(f"state topic {where}: {e}") from e


def _number(headers: Mapping[str, bytes], name: str, where: str) -> int:
    raw = headers.get(name)
    if raw is None:
        raise ReplayError(f"{where}: no {name} header; not a stream_ops state-topic record")
    text = raw.decode("ascii", "replace")
    if not text.isdigit():
        raise ReplayError(f"{where}: header {name} is {raw!r}, not a non-negative integer")
    return int(text)


def _decode_keys(keys: list[bytes], where: str) -> list[Key]:
    """Key tuples of encoded keys, with one ``json.loads`` for all."""
    if not keys:
        return []
    try:
        decoded = json.loads(b"[" + b",".join(keys) + b"]")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ReplayError(f"state topic {where}: a key is not JSON text: {e}") from e
    if len(decoded) != len(keys) or any(key.__class__ is not list for key in decoded):
        raise ReplayError(f"state topic {where}: a key is not one JSON list")
    try:
        return [as_key(key) if list in map(type, key) else tuple(key) for key in decoded]
    except StateError as e:
        raise ReplayError(f"state topic {where}: {e}") from e


def _decode_values(values: list[bytes | None], where: str) -> list[dict[str, Any] | None]:
    """JSON objects of stored values (None stays None), with one ``json.loads`` for all."""
    present = [value for value in values if value is not None]
    if not present:
        return [None] * len(values)
    try:
        objs = json.loads(b"[" + b",".join(present) + b"]")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ReplayError(f"state topic {where}: a value is not JSON text: {e}") from e
    if len(objs) != len(present):
        raise ReplayError(f"state topic {where}: a value is not one JSON object")
    decoded = iter(objs)
    out: list[dict[str, Any] | None] = []
    for value in values:
        if value is None:
            out.append(None)
            continue
        obj = next(decoded, None)
        if obj.__class__ is not dict:
            raise ReplayError(f"state topic {where}: a value is not a JSON object: {value!r:.80}")
        out.append(obj)
    return out
