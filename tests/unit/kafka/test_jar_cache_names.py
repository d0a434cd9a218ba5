"""The jar cache names each directory for the jars it holds: Spark's Kafka connector fetched in
another version than pyspark's (none published yet) lives under a name saying both, and a cache
an earlier release filled under pyspark's version keeps working and is renamed without Maven."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stream_ops.kafka.jars import (
    MARKER_NAME,
    NEWEST_PUBLISHED_CONNECTOR,
    JarSet,
    cached_jar_set,
    connector_jar_set,
    fetch_jar_set,
)


@pytest.fixture(autouse=True)
def _no_maven(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing here may fetch: a call that tried would fail for want of mvn."""
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("MAVEN_HOME", raising=False)
    monkeypatch.delenv("M2_HOME", raising=False)
    monkeypatch.delenv("STREAM_OPS_SPARK_KAFKA_VERSION", raising=False)


def _fill(directory: Path, jar_set: JarSet, fetched: tuple[str, ...], version: str) -> list[Path]:
    """A complete set as fetch_jar_set writes it: Maven fetched ``fetched``."""
    directory.mkdir(parents=True)
    names = sorted([f"spark-sql-kafka-0-10_2.13-{version}.jar", "commons-pool2-2.13.1.jar"])
    for name in names:
        (directory / name).write_bytes(b"PK")
    marker = {"artifacts": list(fetched), "asked": list(jar_set.artifacts), "jars": names, "resolved": [], "skipped": []}
    (directory / MARKER_NAME).write_text(json.dumps(marker))
    return [directory / name for name in names]


def test_a_fallback_connector_is_named_for_both_versions() -> None:
    jar_set = connector_jar_set("4.3.0")
    assert jar_set.name == "spark-sql-kafka-4.3.0"
    assert jar_set.fallback_name == f"spark-sql-kafka-{NEWEST_PUBLISHED_CONNECTOR}-for-spark-4.3.0"
    assert jar_set.fallback_artifacts == (f"org.apache.spark:spark-sql-kafka-0-10_2.13:{NEWEST_PUBLISHED_CONNECTOR}",)
    assert jar_set.directory_name(jar_set.artifacts) == "spark-sql-kafka-4.3.0"
    assert jar_set.directory_name(jar_set.fallback_artifacts) == jar_set.fallback_name
    published = connector_jar_set(NEWEST_PUBLISHED_CONNECTOR)
    assert (published.fallback_version, published.fallback_name) == (None, None)


def test_the_connector_of_pyspark_version_is_preferred_to_the_fallback(tmp_path: Path) -> None:
    jar_set = connector_jar_set("4.3.0")
    assert jar_set.fallback_name is not None and jar_set.fallback_artifacts is not None
    _fill(tmp_path / jar_set.fallback_name, jar_set, jar_set.fallback_artifacts, NEWEST_PUBLISHED_CONNECTOR)
    exact = _fill(tmp_path / jar_set.name, jar_set, jar_set.artifacts, "4.3.0")
    assert cached_jar_set(jar_set, tmp_path) == exact
    assert fetch_jar_set(jar_set, tmp_path) == exact


def test_a_fallback_under_its_own_name_is_found(tmp_path: Path) -> None:
    jar_set = connector_jar_set("4.3.0")
    assert jar_set.fallback_name is not None and jar_set.fallback_artifacts is not None
    jars = _fill(tmp_path / jar_set.fallback_name, jar_set, jar_set.fallback_artifacts, NEWEST_PUBLISHED_CONNECTOR)
    assert cached_jar_set(jar_set, tmp_path) == jars
    assert fetch_jar_set(jar_set, tmp_path) == jars


def test_a_fallback_kept_under_the_old_name_keeps_working_and_is_renamed_without_maven(tmp_path: Path) -> None:
    jar_set = connector_jar_set("4.3.0")
    assert jar_set.fallback_name is not None and jar_set.fallback_artifacts is not None
    old = tmp_path / jar_set.name
    old_jars = _fill(old, jar_set, jar_set.fallback_artifacts, NEWEST_PUBLISHED_CONNECTOR)

    assert cached_jar_set(jar_set, tmp_path) == old_jars  # read where it is, nothing renamed
    assert old.is_dir() and not old.is_symlink()

    renamed = fetch_jar_set(jar_set, tmp_path)  # no mvn on PATH: renaming needs none
    new = tmp_path / jar_set.fallback_name
    assert renamed == [new / jar.name for jar in old_jars]
    assert all(jar.is_file() for jar in renamed)
    assert old.is_symlink() and old.resolve() == new.resolve()
    assert all(jar.is_file() for jar in old_jars), "a process started with the old paths must still read them"
    assert cached_jar_set(jar_set, tmp_path) == renamed
    assert fetch_jar_set(jar_set, tmp_path) == renamed


def test_a_set_whose_marker_names_other_fetched_artifacts_is_not_taken(tmp_path: Path) -> None:
    jar_set = connector_jar_set("4.3.0")
    assert jar_set.fallback_name is not None
    _fill(tmp_path / jar_set.fallback_name, jar_set, jar_set.artifacts, "4.3.0")  # the wrong contents for the name
    assert cached_jar_set(jar_set, tmp_path) is None
