"""The range reader's consumer settings: a source's client settings may tune the fetch, never
undo what an exact read of a range needs, and may name a setting the reader sets too."""

from __future__ import annotations

from confluent_kafka import Consumer

from stream_ops.kafka.range_reader import RangeReader, consumer_settings


def test_the_sources_settings_tune_the_fetch_but_not_the_exact_read():
    user = {"fetch.wait.max.ms": "50", "group.id": "mine", "isolation.level": "read_uncommitted", "enable.auto.commit": "true"}
    settings = consumer_settings("127.0.0.1:1", "t", 3, "read_committed", user)
    assert settings["fetch.wait.max.ms"] == "50"
    assert settings["group.id"] == "stream-ops-batch-t-3"
    assert settings["isolation.level"] == "read_committed"
    assert settings["enable.auto.commit"] is False
    assert settings["bootstrap.servers"] == "127.0.0.1:1"


def test_a_consumer_is_made_when_the_source_sets_a_setting_the_reader_sets_too():
    reader = RangeReader()
    consumer, _lock = reader._consumer("127.0.0.1:1", "t", 0, "read_committed", {"fetch.wait.max.ms": "50", "group.id": "mine"})
    try:
        assert isinstance(consumer, Consumer)
    finally:
        consumer.close()
