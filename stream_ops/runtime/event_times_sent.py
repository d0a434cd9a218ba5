"""The largest event time a source task sent to each event-time window stage, kept in its commit.

A source task sends a record to a window stage as part of a partial aggregate only when the
record cannot be late there: its event time is at least (the largest event time the task sent
the stage in its *earlier* batches) - lag (:mod:`stream_ops.operators.window_partials`). That
maximum must be the same for every computation of a batch (a replay, a new owner, a zombie), so
it is not process memory: each commit records the maximum up to its txid in the task's
transactional record (``TransactionalRecord.event_times_sent``), written in the same ZooKeeper
transaction, and batch ``n`` reads it from the record of txid ``n - 1``, which every owner that
may compute ``n`` sees. When that record is not the one of ``n - 1`` or does not keep the maximum
(a record written before it was kept), the bound is unknown: the batch goes as whole records and
the maximum stays unknown, as a bound below the truth would make a late record count.
"""

from __future__ import annotations

from collections.abc import Mapping

from stream_ops.coordination.records import TransactionalRecord


def sent_before(record: TransactionalRecord, txid: int) -> dict[int, float | None] | None:
    """Per window stage index, the largest event time sent in the batches before ``txid`` (an
    empty mapping: none sent yet), from the committed ``record``; None when not known.

    >>> sent_before(TransactionalRecord(), 0)
    {}
    >>> sent_before(TransactionalRecord(committed_txid=4, event_times_sent={"1": 12.5}), 5)
    {1: 12.5}
    >>> sent_before(TransactionalRecord(committed_txid=4, event_times_sent={"1": 12.5}), 7) is None
    True
    """
    if record.committed_txid != txid - 1:
        return None
    if record.committed_txid < 0:
        return {}
    if record.event_times_sent is None:
        return None
    return {int(stage): value for stage, value in record.event_times_sent.items()}


def sent_through(before: Mapping[int, float | None] | None, batch: Mapping[int, float]) -> dict[str, float] | None:
    """What the commit of a batch records: ``before`` raised by the largest event time the batch
    sent each stage (``batch``); None when ``before`` is not known.

    >>> sent_through({1: 12.5}, {1: 11.0, 2: 3.0})
    {'1': 12.5, '2': 3.0}
    """
    if before is None:
        return None
    through = {str(stage): value for stage, value in before.items() if value is not None}
    for stage, value in batch.items():
        seen = through.get(str(stage))
        through[str(stage)] = value if seen is None else max(seen, value)
    return through
