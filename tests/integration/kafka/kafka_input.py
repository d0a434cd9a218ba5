"""Input of the Kafka driver-path tests: plain records, committed and aborted transactions (and
so their control markers), null keys and values, keys that are not UTF-8 and headers, produced to
a real broker; and what a consumer with each isolation level reads of it."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

from confluent_kafka import Consumer, Producer, TopicPartition

from stream_ops.kafka.client import client_config


@dataclass(frozen=True)
class Sent:
    """One record produced, and whether its transaction was aborted."""

    key: bytes | None
    value: bytes | None
    aborted: bool = False


def sentence(text: str) -> bytes:
    return json.dumps({"sentence": text}).encode()


MIXED: list[tuple[str, list[Sent]]] = [
    ("plain", [Sent(b"k1", sentence("how are you")), Sent(None, sentence("how now")), Sent(b"k3", None)]),
    ("committed", [Sent(b"t1", sentence("brown cow")), Sent(b"t2", sentence("how"))]),
    ("aborted", [Sent(b"a1", sentence("never seen"), aborted=True), Sent(b"a2", sentence("how"), aborted=True)]),
    ("plain", [Sent(b"k4", sentence("you too")), Sent(b"", sentence(""))]),
    ("committed", [Sent(None, sentence("cow"))]),
]
"""Groups of records, in order: each ``committed`` or ``aborted`` group is one transaction."""

NOT_UTF8: list[tuple[str, list[Sent]]] = [("plain", [Sent(b"\xff\xfe", sentence("odd key")), Sent(b"k", b"\xc3(")])]
"""A key and a raw value that are not UTF-8 (the value is no JSON either)."""


def produce(bootstrap: str, topic: str, groups: list[tuple[str, list[Sent]]]) -> int:
    """Produce ``groups`` to partition 0 of ``topic`` (each transaction with its own producer);
    returns how many records were produced (markers not counted)."""
    plain = Producer(client_config(bootstrap, **{"enable.idempotence": True}))
    count = 0
    for kind, records in groups:
        if kind == "plain":
            for sent in records:
                plain.produce(topic, key=sent.key, value=sent.value, partition=0, headers=[("h", b"\x00v"), ("h", None)])
            plain.flush(30)
        else:
            producer = Producer(client_config(bootstrap, **{"transactional.id": f"test-{uuid.uuid4().hex}"}))
            producer.init_transactions(30)
            producer.begin_transaction()
            for sent in records:
                producer.produce(topic, key=sent.key, value=sent.value, partition=0)
            producer.flush(30)
            if kind == "aborted":
                producer.abort_transaction(30)
            else:
                producer.commit_transaction(30)
        count += len(records)
    return count


def words(groups: list[tuple[str, list[Sent]]], *, committed_only: bool) -> list[str]:
    """The words of the JSON sentences a consumer reads (``committed_only``: ``read_committed``)."""
    found: list[str] = []
    for _kind, records in groups:
        for sent in records:
            if sent.value is None or (committed_only and sent.aborted):
                continue
            found.extend(json.loads(sent.value)["sentence"].split(" "))
    return found


def stable_end(bootstrap: str, topic: str, timeout_s: float = 30.0) -> int:
    """Partition 0's end offset once every transaction in it is decided: its last stable offset
    (what a ``read_committed`` reader, and so Spark planning a batch for one, sees as its end)
    equal to its high watermark. Right after ``commit_transaction`` returns, the markers may
    not be written yet."""
    readers = {
        level: Consumer(client_config(bootstrap, **{"group.id": f"test-end-{level}", "isolation.level": level}))
        for level in ("read_uncommitted", "read_committed")
    }
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            ends = {
                level: reader.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)[1]
                for level, reader in readers.items()
            }
            if ends["read_uncommitted"] == ends["read_committed"]:
                return int(ends["read_committed"])
            assert time.monotonic() < deadline, f"transactions of {topic} still open: {ends}"
            time.sleep(0.05)
    finally:
        for reader in readers.values():
            reader.close()
