"""Spark's Kafka connector on ``spark.jars``: added from the jar cache when it has the set,
appended to jars already given, never fetched unless asked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stream_ops.errors import KafkaJarsError
from stream_ops.kafka.jars import MARKER_NAME, cached_jar_set, connector_jar_set, with_kafka_connector


def _cache_with_connector(root: Path) -> list[Path]:
    jar_set = connector_jar_set()
    directory = root / jar_set.name
    directory.mkdir(parents=True)
    names = ["spark-sql-kafka-0-10_2.13-4.0.0.jar", "kafka-clients-4.0.0.jar"]
    for name in names:
        (directory / name).write_bytes(b"PK")
    marker = {
        "asked": list(jar_set.artifacts),
        "jars": names,
        "artifacts": list(jar_set.artifacts),
        "resolved": [],
        "skipped": [],
    }
    (directory / MARKER_NAME).write_text(json.dumps(marker))
    return [directory / name for name in names]


def test_a_cached_connector_is_appended_to_the_jars_given(tmp_path: Path) -> None:
    jars = _cache_with_connector(tmp_path)
    conf = {"spark.jars": "/opt/extra.jar", "spark.app.name": "x"}
    merged = with_kafka_connector(conf, fetch=False, cache_dir=tmp_path)
    assert merged["spark.jars"].split(",") == ["/opt/extra.jar", *map(str, jars)]
    assert merged["spark.app.name"] == "x" and conf["spark.jars"] == "/opt/extra.jar"
    assert with_kafka_connector(merged, fetch=False, cache_dir=tmp_path) == merged  # not twice


def test_without_the_set_in_the_cache_nothing_is_added_and_nothing_fetched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # a fetch would need mvn
    monkeypatch.delenv("MAVEN_HOME", raising=False)
    monkeypatch.delenv("M2_HOME", raising=False)
    assert cached_jar_set(connector_jar_set(), tmp_path) is None
    assert with_kafka_connector({"a": "b"}, fetch=False, cache_dir=tmp_path) == {"a": "b"}
    with pytest.raises(KafkaJarsError, match="mvn|Maven"):
        with_kafka_connector({}, fetch=True, cache_dir=tmp_path)


def test_an_incomplete_set_counts_as_missing(tmp_path: Path) -> None:
    jars = _cache_with_connector(tmp_path)
    jars[0].unlink()
    assert cached_jar_set(connector_jar_set(), tmp_path) is None
