"""The jar cache: fetched once per set, never again while complete, fetched again when damaged,
and Spark's connector without what pyspark ships already."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from stream_ops.errors import KafkaJarsError
from stream_ops.kafka.jars import (
    MARKER_NAME,
    JarSet,
    broker_jar_set,
    broker_jars,
    fetch_jar_set,
    find_mvn,
    pyspark_jars,
    spark_kafka_jars,
)


def test_a_complete_set_is_returned_without_running_maven(
    kafka_broker_jars: list[Path], connector_jars: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = kafka_broker_jars[0].parent / MARKER_NAME
    before = marker.stat().st_mtime_ns
    monkeypatch.setenv("PATH", "/nonexistent")  # no mvn: a fetch would fail
    monkeypatch.delenv("MAVEN_HOME", raising=False)
    monkeypatch.delenv("M2_HOME", raising=False)
    assert broker_jars() == kafka_broker_jars
    assert spark_kafka_jars() == connector_jars
    assert marker.stat().st_mtime_ns == before


def test_the_broker_set_holds_kafka_and_its_runtime_dependencies(kafka_broker_jars: list[Path]) -> None:
    names = {jar.name for jar in kafka_broker_jars}
    assert {"kafka_2.13-4.3.1.jar", "kafka-clients-4.3.1.jar", "kafka-server-4.3.1.jar", "kafka-raft-4.3.1.jar"} <= names
    assert any(name.startswith("scala-library-2.13") for name in names)
    marker = json.loads((kafka_broker_jars[0].parent / MARKER_NAME).read_text())
    assert marker["asked"] == list(broker_jar_set().artifacts)


def test_the_connector_set_leaves_out_what_pyspark_ships(connector_jars: list[Path]) -> None:
    names = {jar.name for jar in connector_jars}
    assert any(re.match(r"spark-sql-kafka-0-10_2\.13-4\.\d+\.\d+\.jar$", n) for n in names)
    assert any(n.startswith("kafka-clients-") for n in names)
    assert any(n.startswith("spark-token-provider-kafka-0-10_2.13-") for n in names)
    assert any(n.startswith("commons-pool2-") for n in names)
    shipped = {jar.name for jar in pyspark_jars().glob("*.jar")}
    for name in names:
        artifact = re.sub(r"-\d[^-]*(-\d+)?\.jar$", "", name)
        assert not any(re.match(re.escape(artifact) + r"-\d", s) for s in shipped), f"{name}: pyspark ships {artifact} already"


def _maven_or_skip() -> None:
    try:
        find_mvn()
    except KafkaJarsError as e:
        if os.environ.get("CI"):
            raise  # CI installs Maven: not having it is a failure there
        pytest.skip(str(e))


def test_a_set_is_fetched_again_when_damaged_or_asked_for_other_artifacts(tmp_path: Path, kafka_broker_jars: list[Path]) -> None:
    _maven_or_skip()
    small = JarSet("small", ("org.apache.commons:commons-pool2:2.13.1",))
    first = fetch_jar_set(small, tmp_path)
    assert [jar.name for jar in first] == ["commons-pool2-2.13.1.jar"]
    first[0].unlink()  # a jar lost since
    assert fetch_jar_set(small, tmp_path) == first and first[0].is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".small-")], "the work directory is left behind"
    other = fetch_jar_set(JarSet("small", ("org.apache.kafka:kafka-clients:4.3.1",)), tmp_path)
    assert "kafka-clients-4.3.1.jar" in {jar.name for jar in other}
    assert "commons-pool2-2.13.1.jar" not in {jar.name for jar in other}


def test_without_maven_a_missing_set_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("MAVEN_HOME", raising=False)
    monkeypatch.delenv("M2_HOME", raising=False)
    with pytest.raises(KafkaJarsError, match="apt-get install maven"):
        fetch_jar_set(JarSet("x", ("org.apache.commons:commons-pool2:2.13.1",)), tmp_path)
