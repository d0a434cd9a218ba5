"""The pure parts of the shuffle on Kafka: the conf that chooses it, its names, the staged rows and
their messages, and the checkpoint fingerprint of a Kafka-read batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stream_ops.errors import ConfigError, KafkaShuffleError
from stream_ops.kafka.shuffle_options import KafkaShuffle, output_name
from stream_ops.kafka.shuffle_writer import encode_row, shuffle_messages, staged_rows
from stream_ops.kafka.sink_options import transactional_id
from stream_ops.spark.checkpoint import batch_input, batch_input_files


def test_files_stay_the_default_shuffle() -> None:
    assert KafkaShuffle.from_conf({}) is None
    assert KafkaShuffle.from_conf({"shuffle": "files", "shuffle_bootstrap": "ignored:1"}) is None


def test_the_conf_round_trips_and_names_its_keys() -> None:
    shuffle = KafkaShuffle(
        bootstrap="k1:9092,k2:9092",
        config={"security.protocol": "SASL_SSL", "sasl.password": "env:PW"},
        spark_options={"security.protocol": "SASL_SSL"},
        replication_factor=3,
        timeout_s=5.0,
    )
    conf = shuffle.to_conf()
    assert conf["shuffle"] == "kafka" and conf["shuffle_bootstrap"] == "k1:9092,k2:9092"
    assert conf["shuffle_replication_factor"] == 3
    assert KafkaShuffle.from_conf(conf) == shuffle
    assert KafkaShuffle(bootstrap="k:1").to_conf() == {"shuffle": "kafka", "shuffle_bootstrap": "k:1", "shuffle_timeout_s": 30.0}


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"shuffle": "nfs"}, "must be 'files' or 'kafka'"),
        ({"shuffle": "kafka"}, "needs shuffle_bootstrap"),
        ({"shuffle": "kafka", "shuffle_bootstrap": ""}, "bad Kafka shuffle settings"),
        ({"shuffle": "kafka", "shuffle_bootstrap": "k:1", "shuffle_replication_factor": 0}, "bad Kafka shuffle settings"),
    ],
)
def test_a_bad_conf_is_a_config_error(conf: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        KafkaShuffle.from_conf(conf)


def test_names_of_topics_and_producers() -> None:
    shuffle = KafkaShuffle(bootstrap="k:1")
    assert shuffle.topic_name("wc-3-1700", 1, "words count/by word") == "stream_ops-shuffle.wc-3-1700.001-words_count_by_word"
    assert shuffle.transactional_id("wc-3-1700", 2, 7) == transactional_id("stream-ops", "wc-3-1700", "shuffle-002", 7)
    assert output_name(12) == "shuffle-012"
    with pytest.raises(ConfigError, match="longer than Kafka"):
        shuffle.topic_name("t", 1, "x" * 260)


def test_env_settings_are_read_from_the_environment() -> None:
    shuffle = KafkaShuffle(bootstrap="k:1", config={"sasl.password": "env:PW"}, spark_options={"sasl.jaas.config": "env:JAAS"})
    assert shuffle.client_config({"PW": "secret"}) == {"sasl.password": "secret"}
    assert shuffle.reader_options({"JAAS": "j"}) == {"sasl.jaas.config": "j"}
    with pytest.raises(KafkaShuffleError, match="PW"):
        shuffle.client_config({})


def test_staged_rows_keep_each_queues_rows_in_order_and_become_messages_per_partition() -> None:
    rows = staged_rows({1: [{"key": '["b"]', "value": 2}], 0: [{"key": '["a"]', "value": 1}, {"key": '["c"]', "value": 3}]})
    assert [r["partition"] for r in rows] == [0, 0, 1]
    headers = (("stream-ops-txid", b"4"),)
    messages = shuffle_messages(rows, headers, partitions=2)
    assert [(m.partition, m.key, json.loads(m.value or b"")) for m in messages] == [
        (0, None, {"key": '["a"]', "value": 1}),
        (0, None, {"key": '["c"]', "value": 3}),
        (1, None, {"key": '["b"]', "value": 2}),
    ]
    assert all(m.headers == headers for m in messages)
    assert encode_row({"stream": "s", "key": None, "record": "{}"}) == b'{"stream":"s","key":null,"record":"{}"}'


def test_a_row_for_a_partition_the_topic_lacks_is_refused() -> None:
    with pytest.raises(KafkaShuffleError, match="partition 2"):
        shuffle_messages([{"partition": 2, "row": {}}], (), partitions=2)


def test_a_kafka_read_batch_is_fingerprinted_by_its_offset_range_from_batch_zero(tmp_path: Path) -> None:
    # What Spark's Kafka source leaves in a checkpoint: its starting offsets in sources/0/0, the
    # planned end offsets per batch in offsets/<batch>.
    (tmp_path / "sources" / "0").mkdir(parents=True)
    (tmp_path / "sources" / "0" / "0").write_text('\x00v1\n{"t":{"0":0}}', encoding="utf-8")
    (tmp_path / "offsets").mkdir()
    for batch, end in ((0, 5), (1, 9)):
        (tmp_path / "offsets" / str(batch)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{{"t":{{"0":{end}}}}}', encoding="utf-8")
    assert batch_input_files(tmp_path, 0) is None
    first, second = batch_input(tmp_path, 0), batch_input(tmp_path, 1)
    assert first is not None and second is not None
    assert first.offsets and second.offsets and first.digest != second.digest
    assert batch_input(tmp_path, 0) == first  # the same plan replayed: the same fingerprint


def test_a_file_source_log_still_lists_its_files(tmp_path: Path) -> None:
    (tmp_path / "sources" / "0").mkdir(parents=True)
    entry = {"path": "file:/q/b.jsonl", "timestamp": 1, "batchId": 0, "action": "add"}
    (tmp_path / "sources" / "0" / "0").write_text("v1\n" + json.dumps(entry), encoding="utf-8")
    assert batch_input_files(tmp_path, 0) == ["file:/q/b.jsonl"]
