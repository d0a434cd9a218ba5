"""Small helpers the end-to-end tests share: feeding sentences, waiting, reading Parquet sinks."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import pytest

from stream_ops.errors import KafkaJarsError
from stream_ops.kafka.jars import broker_jar_set, cached_jar_set, connector_jar_set, find_mvn
from stream_ops.topics.producer import produce

T = TypeVar("T")


def feed_sentences(topic: Any, batches: list[list[str]], sent: list[str], stop: threading.Event, pause_s: float = 0.15) -> None:
    """Produce each batch of sentences to ``topic`` (a FileTopic), recording what was sent."""
    for batch in batches:
        if stop.is_set():
            return
        produce(topic, ({"sentence": s} for s in batch))
        sent.extend(batch)
        time.sleep(pause_s)


def wait_for(condition: Callable[[], T], timeout_s: float, what: str, poll_s: float = 0.3) -> T:
    """Poll ``condition`` until it returns something truthy, and return that; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def graphql(url: str, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
    """POST a GraphQL ``query`` to the Dagster webserver at ``url``; its ``data`` (no ``errors`` allowed)."""
    request = urllib.request.Request(
        f"{url}/graphql",
        data=json.dumps({"query": query, "variables": variables or {}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        body = json.loads(response.read())
    assert "errors" not in body, body
    return body["data"]


def read_parquet(path: Path, columns: str) -> list[tuple]:
    """The sorted rows of ``columns`` of every Parquet file under ``path`` (a sink), or []."""
    if not path.exists() or not list(path.rglob("*.parquet")):
        return []
    return sorted(duckdb.sql(f"select {columns} from read_parquet('{path}/**/*.parquet')").fetchall())


def skip_without_kafka_jars() -> None:
    """Skip unless the Kafka jars are cached or Maven can fetch them (CI fetched them at
    install: there this never skips)."""
    cached = all(cached_jar_set(jar_set) is not None for jar_set in (broker_jar_set(), connector_jar_set()))
    if cached or os.environ.get("CI"):
        return
    try:
        find_mvn()
    except KafkaJarsError as e:
        pytest.skip(f"the Kafka jars are not cached and cannot be fetched: {e}")
