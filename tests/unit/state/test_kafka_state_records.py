"""The state topic on Kafka without a broker: its records, the replay rule over them, and the
conf that chooses it."""

from __future__ import annotations

from typing import Any

import pytest

from stream_ops.errors import ConfigError, ReplayError
from stream_ops.state import OpaqueValue, TransactionalValue
from stream_ops.state.kafka_state_records import (
    HEADER_ATTEMPT,
    HEADER_END,
    HEADER_EPOCH,
    HEADER_TASK,
    HEADER_TXID,
    KafkaRecord,
    KafkaStateBatches,
    batch_records,
    replay_kafka_state,
)
from stream_ops.state.kafka_state_topic import KafkaStateTopic
from stream_ops.state.state_topic import encode_items


class Partition:
    """An in-memory partition: appended records get consecutive offsets, as a broker gives them."""

    def __init__(self) -> None:
        self.records: list[KafkaRecord] = []

    def append(
        self, txid: int, epoch: int, items: list[tuple[Any, Any]], *, attempt: str | None = None, cut: int | None = None
    ) -> None:
        """Append one batch (``cut``: only its first ``cut`` records, as a crashed producer would)."""
        encoded = encode_items(items)
        outgoing = batch_records(3, txid, epoch, attempt or f"a-{txid}-{epoch}-{len(self.records)}", encoded)
        for record in outgoing[:cut]:
            self.add(record.key, record.value, dict(record.headers))

    def add(self, key: bytes | None, value: bytes | None, headers: dict[str, bytes]) -> None:
        self.records.append(KafkaRecord(len(self.records), key, value, headers))


def tx(txid: int, value: int) -> TransactionalValue:
    return TransactionalValue(txid, value)


def test_batch_records_are_the_entries_then_an_end_record_with_the_batch_in_headers() -> None:
    records = batch_records(2, 7, 3, "abc", [('["apple"]', '{"k":"tx","txid":7,"val":5}'), ('["pear"]', None)])
    assert [(r.key, r.value) for r in records] == [
        (b'["apple"]', b'{"k":"tx","txid":7,"val":5}'),
        (b'["pear"]', None),
        (None, None),
    ]
    headers = dict(records[-1].headers)
    assert headers == {HEADER_TASK: b"2", HEADER_TXID: b"7", HEADER_EPOCH: b"3", HEADER_ATTEMPT: b"abc", HEADER_END: b"2"}
    assert HEADER_END not in dict(records[0].headers)


def test_the_last_entry_per_key_of_committed_txids_wins() -> None:
    log = Partition()
    log.append(0, 1, [(("a",), tx(0, 1)), (("b",), tx(0, 7))])
    log.append(1, 1, [(("a",), tx(1, 2)), (("a",), tx(1, 3))])
    log.append(2, 1, [(("b",), tx(2, 9))])  # not committed
    assert replay_kafka_state(log.records, committed_txid=1) == {("a",): tx(1, 3), ("b",): tx(0, 7)}


def test_a_deletion_removes_the_key_and_a_later_value_revives_it() -> None:
    log = Partition()
    log.append(0, 1, [(("a",), tx(0, 1)), (("b",), tx(0, 1))])
    log.append(1, 1, [(("a",), None)])
    assert replay_kafka_state(log.records, committed_txid=1) == {("b",): tx(0, 1)}
    log.append(2, 1, [(("a",), OpaqueValue(2, 5, 4))])
    assert replay_kafka_state(log.records, committed_txid=2) == {("a",): OpaqueValue(2, 5, 4), ("b",): tx(0, 1)}


def test_a_zombies_lower_epoch_is_ignored_even_when_it_lands_later() -> None:
    log = Partition()
    log.append(0, 1, [(("a",), tx(0, 1))])
    log.append(1, 2, [(("a",), tx(1, 2))])  # the new owner (epoch 2) commits txid 1
    log.append(1, 1, [(("a",), tx(1, 100)), (("z",), tx(1, 1))])  # the zombie's late produce of txid 1
    batches = KafkaStateBatches("p")
    batches.extend(log.records)
    assert batches.counted(1) is not None and batches.counted(1).epoch == 2
    assert replay_kafka_state(log.records, committed_txid=1) == {("a",): tx(1, 2)}


def test_a_zombies_records_interleaved_with_the_owners_count_for_nothing() -> None:
    log = Partition()
    owner = batch_records(3, 0, 2, "owner", encode_items([(("a",), tx(0, 1)), (("b",), tx(0, 1))]))
    zombie = batch_records(3, 0, 1, "zombie", encode_items([(("a",), tx(0, 50)), (("c",), tx(0, 50))]))
    for mine, theirs in zip(owner, zombie, strict=True):
        log.add(mine.key, mine.value, dict(mine.headers))
        log.add(theirs.key, theirs.value, dict(theirs.headers))
    assert replay_kafka_state(log.records, committed_txid=0) == {("a",): tx(0, 1), ("b",): tx(0, 1)}


def test_a_batch_without_its_end_record_counts_for_nothing() -> None:
    log = Partition()
    log.append(0, 1, [(("a",), tx(0, 1))])
    log.append(1, 2, [(("a",), tx(1, 9)), (("b",), tx(1, 9))], cut=1)  # crashed after one entry
    batches = KafkaStateBatches("p")
    batches.extend(log.records)
    assert batches.counted(1) is None
    assert replay_kafka_state(log.records, committed_txid=1) == {("a",): tx(0, 1)}
    with pytest.raises(ReplayError, match="txid 1 have no complete batch"):
        batches.replayed_changes(after_txid=-1, committed_txid=1, committed_epoch=2)


def test_an_end_record_naming_more_entries_than_arrived_leaves_the_batch_incomplete() -> None:
    log = Partition()
    records = batch_records(3, 0, 1, "x", encode_items([(("a",), tx(0, 1)), (("b",), tx(0, 1))]))
    log.add(records[0].key, records[0].value, dict(records[0].headers))  # the second entry was refused
    log.add(records[2].key, records[2].value, dict(records[2].headers))
    batches = KafkaStateBatches("p")
    batches.extend(log.records)
    assert batches.counted(0) is None


def test_a_replayed_batch_replaces_its_earlier_attempt_instead_of_adding_to_it() -> None:
    log = Partition()
    log.append(0, 1, [(("a",), tx(0, 1)), (("gone",), tx(0, 1))], attempt="first")
    log.append(0, 1, [(("a",), tx(0, 1))], attempt="again")  # the same txid and epoch appended again
    batches = KafkaStateBatches("p")
    batches.extend(log.records)
    changes = batches.replayed_changes(after_txid=-1, committed_txid=0, committed_epoch=1)
    assert changes.entries == 1 and changes.files == 1
    assert replay_kafka_state(log.records, committed_txid=0) == {("a",): tx(0, 1)}


def test_the_committed_epoch_must_be_the_counted_one() -> None:
    log = Partition()
    log.append(0, 1, [(("a",), tx(0, 1))])
    batches = KafkaStateBatches("p")
    batches.extend(log.records)
    with pytest.raises(ReplayError, match="committed by epoch 2"):
        batches.replayed_changes(after_txid=-1, committed_txid=0, committed_epoch=2)


def test_changes_above_a_snapshot_and_incremental_reads_give_the_same_state() -> None:
    log = Partition()
    for txid in range(6):
        log.append(txid, 1, [((f"k{txid % 3}",), tx(txid, txid))])
    whole = KafkaStateBatches("p")
    whole.extend(log.records)
    # read in two polls, cutting a batch in the middle: its end record arrives in the second
    polled = KafkaStateBatches("p")
    polled.extend(log.records[:7])
    assert polled.counted(3) is None
    polled.extend(log.records[7:])
    for batches in (whole, polled):
        tail = batches.encoded_changes(after_txid=2, committed_txid=5, committed_epoch=1)
        assert tail.top_epochs == {3: 1, 4: 1, 5: 1}
        assert dict(tail.encoded_items("p")) == {
            b'["k0"]': b'{"k":"tx","txid":3,"val":3}',
            b'["k1"]': b'{"k":"tx","txid":4,"val":4}',
            b'["k2"]': b'{"k":"tx","txid":5,"val":5}',
        }
    counted = whole.counted(2)
    assert counted is not None and counted.end_offset == 5  # entry at 4, end record at 5


def test_forget_through_drops_applied_batches_but_keeps_a_half_read_one() -> None:
    log = Partition()
    log.append(0, 1, [(("a",), tx(0, 1))])
    log.append(1, 1, [(("a",), tx(1, 2))])
    batches = KafkaStateBatches("p")
    batches.extend(log.records[:3])  # txid 1's entry, not its end
    batches.forget_through(0)
    batches.extend(log.records[3:])
    assert batches.counted(0) is None and batches.counted(1) is not None
    assert batches.replayed_changes(after_txid=0, committed_txid=1, committed_epoch=1).changes == {
        ("a",): {"k": "tx", "txid": 1, "val": 2}
    }


@pytest.mark.parametrize(
    ("key", "value", "headers", "match"),
    [
        (b'["a"]', None, {HEADER_TXID: b"1", HEADER_EPOCH: b"1", HEADER_ATTEMPT: b"x"}, "no stream_ops.task header"),
        (b'["a"]', None, {HEADER_TASK: b"1", HEADER_TXID: b"-1", HEADER_EPOCH: b"1", HEADER_ATTEMPT: b"x"}, "not a non-negative"),
        (b'["a"]', None, {HEADER_TASK: b"1", HEADER_TXID: b"1", HEADER_EPOCH: b"1"}, "no stream_ops.attempt"),
        (b"a", None, {HEADER_TASK: b"1", HEADER_TXID: b"1", HEADER_EPOCH: b"1", HEADER_ATTEMPT: b"x"}, "not a state key"),
        (b'["a"]', b"5", {HEADER_TASK: b"1", HEADER_TXID: b"1", HEADER_EPOCH: b"1", HEADER_ATTEMPT: b"x"}, "not a stored"),
    ],
)
def test_a_record_a_task_did_not_write_is_an_error(
    key: bytes, value: bytes | None, headers: dict[str, bytes], match: str
) -> None:
    with pytest.raises(ReplayError, match=match):
        KafkaStateBatches("p").add(KafkaRecord(0, key, value, headers))


def test_a_record_after_its_batchs_end_is_an_error() -> None:
    log = Partition()
    log.append(0, 1, [(("a",), tx(0, 1))], attempt="x")
    extra = batch_records(3, 0, 1, "x", encode_items([(("b",), tx(0, 1))]))[0]
    log.add(extra.key, extra.value, dict(extra.headers))
    with pytest.raises(ReplayError, match="after its end record"):
        KafkaStateBatches("p").extend(log.records)


# --- choosing it ------------------------------------------------------------------------------


def test_the_conf_chooses_files_by_default_and_kafka_with_its_settings() -> None:
    assert KafkaStateTopic.from_conf({}) is None
    assert KafkaStateTopic.from_conf({"state_topic": "files"}) is None
    chosen = KafkaStateTopic(bootstrap="k:9092", config={"security.protocol": "SSL"}, replication_factor=3)
    assert KafkaStateTopic.from_conf(chosen.to_conf()) == chosen
    assert chosen.to_conf()["state_topic"] == "kafka"


@pytest.mark.parametrize(
    ("conf", "match"),
    [
        ({"state_topic": "s3"}, "'files' or 'kafka'"),
        ({"state_topic": "kafka"}, "needs state_topic_bootstrap"),
        ({"state_topic": "kafka", "state_topic_bootstrap": "k:1", "state_topic_replication_factor": 0}, "bad Kafka"),
    ],
)
def test_a_bad_state_topic_conf_is_refused(conf: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        KafkaStateTopic.from_conf(conf)


def test_topic_names_are_per_topology_and_stage_and_legal_for_kafka() -> None:
    name = KafkaStateTopic(bootstrap="k:1").topic_name("word count-3-1700000000", 1, "count")
    assert name == "stream_ops-state.word_count-3-1700000000.001-count"
