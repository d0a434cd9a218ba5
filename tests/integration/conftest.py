"""Fixtures for integration tests: one local SparkSession for the whole test session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from stream_ops.spark.session import create_spark_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """A real ``local[2]`` SparkSession shared by every integration test."""
    session = create_spark_session(master="local[2]", app_name="stream-ops-tests")
    try:
        yield session
    finally:
        session.stop()
