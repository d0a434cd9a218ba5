"""The largest event time a source task sent each window stage, as its commits keep it: known
only from the record of the txid just before the batch, carried through every commit."""

from __future__ import annotations

from stream_ops.coordination.records import TransactionalRecord
from stream_ops.runtime.event_times_sent import sent_before, sent_through


def test_the_first_batch_of_a_task_has_sent_nothing_before():
    assert sent_before(TransactionalRecord(), 0) == {}


def test_the_bound_comes_from_the_record_of_the_batch_just_before():
    record = TransactionalRecord(committed_txid=6, event_times_sent={"1": 40.0, "3": -2.5})
    assert sent_before(record, 7) == {1: 40.0, 3: -2.5}


def test_a_record_of_another_txid_or_without_the_maximum_is_not_known():
    assert sent_before(TransactionalRecord(committed_txid=6, event_times_sent={"1": 40.0}), 6) is None  # a replay of 6
    assert sent_before(TransactionalRecord(committed_txid=6, event_times_sent={"1": 40.0}), 9) is None
    assert sent_before(TransactionalRecord(committed_txid=6), 7) is None  # written before the maximum was kept
    assert sent_before(TransactionalRecord(), 3) is None


def test_a_commit_keeps_the_maximum_over_every_batch_and_an_unknown_one_stays_unknown():
    assert sent_through({}, {}) == {}
    assert sent_through({1: 40.0}, {1: 12.0}) == {"1": 40.0}
    assert sent_through({1: 40.0}, {1: 52.0, 2: 1.0}) == {"1": 52.0, "2": 1.0}
    assert sent_through({1: None}, {}) == {}
    assert sent_through(None, {1: 52.0}) is None


def test_the_maximum_survives_the_records_json():
    record = TransactionalRecord(committed_txid=0, event_times_sent=sent_through({}, {2: 1_699_999_200.123}))
    again = TransactionalRecord.model_validate(record.to_json_obj())
    assert sent_before(again, 1) == {2: 1_699_999_200.123}
