"""A downstream task's input when the shuffle is kept in Kafka: its partition, ``read_committed``.

Task ``q`` of a non-source stage reads partition ``q`` of the stage's shuffle topic with Spark's
Kafka source (``assign``, from the earliest offset when its checkpoint is new) and
``kafka.isolation.level=read_committed``: Spark plans each micro-batch up to the last stable
offset, so a batch holds only rows of committed upstream transactions (aborted ones, a zombie's
fenced ones and open ones are never read), and the batch's offset range, logged by Spark before
the batch runs, is its input fingerprint (:func:`stream_ops.spark.checkpoint.batch_input`): a
replayed txid reads the same rows. Each value is one JSON row, parsed against the stage's input
fields exactly as the file shuffle's JSON lines are (partials, records, ticks and watermark
progress rows alike).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stream_ops.errors import KafkaShuffleError
from stream_ops.helpers.spark_ddl import schema_ddl
from stream_ops.kafka.shuffle_options import KafkaShuffle

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

ROW_COLUMN = "_shuffle_row"


@dataclass(frozen=True)
class KafkaShuffleInput:
    """What a downstream task reads instead of its shuffle queue directory."""

    shuffle: KafkaShuffle
    topic: str
    """The stage's shuffle topic; the task reads the partition of its queue."""


def parse_shuffle_values(df: DataFrame, fields: Mapping[str, str]) -> DataFrame:
    """The rows of a DataFrame of Kafka messages (its ``value`` column, bytes or text) as the
    columns ``fields``, parsed as the file shuffle reads a JSON line (a value that does not parse
    is a row of nulls)."""
    from pyspark.sql import functions as F

    parsed = F.from_json(F.col("value").cast("string"), schema_ddl(dict(fields)))
    return df.select(parsed.alias(ROW_COLUMN)).select(*[F.col(ROW_COLUMN).getField(name).alias(name) for name in fields])


def read_shuffle_stream(
    spark: SparkSession, shuffle: KafkaShuffle, *, topic: str, queue: int, fields: Mapping[str, str]
) -> DataFrame:
    """The streaming DataFrame of partition ``queue`` of ``topic``, committed rows only, as ``fields``.

    Raises:
        KafkaShuffleError: this worker's Spark has no Kafka connector, or a reader setting names
            an unset environment variable.
    """
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", shuffle.bootstrap)
        .option("assign", json.dumps({topic: [queue]}))
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")
        .option("failOnDataLoss", True)
    )
    for name, setting in shuffle.reader_options().items():
        reader = reader.option(f"kafka.{name}", setting)
    try:
        raw = reader.load()
    except Exception as e:
        if "KAFKA_DATA_SOURCE_NOT_ENABLED" in str(e) or "Failed to find data source: kafka" in str(e):
            raise KafkaShuffleError(
                "this topology shuffles through Kafka but this worker's Spark has no Kafka connector: start the "
                "worker with --kafka-connector (spark.jars must be set before its SparkSession is created)"
            ) from e
        raise
    return parse_shuffle_values(raw, fields)
