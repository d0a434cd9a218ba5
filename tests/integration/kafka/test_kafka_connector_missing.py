"""A Spark without the Kafka connector (the shared test session is built without ``spark.jars``)
gets an error saying how to give it one, instead of Spark's bare "data source not found"."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from stream_ops.errors import SourceError
from stream_ops.sources import KafkaTopic, source_kind, source_spec


def test_reading_kafka_without_the_connector_says_how_to_add_it(spark: SparkSession) -> None:
    spec = source_spec(KafkaTopic("127.0.0.1:9", "words", partitions=1), ["word"])
    try:
        df = source_kind(spec.kind).read_stream(spark, spec, 0, max_files_per_trigger=1, max_file_age="7d")
    except SourceError as e:
        assert "start the worker with --kafka-connector" in str(e)
        assert "--spark-conf spark.jars=$(python -m stream_ops.kafka.jars --spark-jars)" in str(e)
    else:
        assert "kafka_offset" in df.columns
        pytest.skip("the shared SparkSession has the Kafka connector: nothing to say")
