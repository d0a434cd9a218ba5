"""Trident's word count on Kafka: sentences from a Kafka topic, counted per word.

The brokers come from ``STREAM_OPS_KAFKA`` (default ``127.0.0.1:9092``, where
``stream-ops kafka start`` listens); ``stream-ops demo --kafka`` and ``stream-ops dev --kafka``
start a local broker, set it, create the topic and feed it. Each record's value is a JSON
object ``{"sentence": "..."}``; one task per partition of :data:`INPUT_TOPIC`.
"""

from __future__ import annotations

import os

from stream_ops import Count, OpaqueMapState, Topology
from stream_ops.sources import KafkaTopic

INPUT_TOPIC = "sentences"
PARTITIONS = 2
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


def bootstrap() -> str:
    """The brokers the example reads from (``STREAM_OPS_KAFKA``)."""
    return os.environ.get("STREAM_OPS_KAFKA") or DEFAULT_BOOTSTRAP


def build_kafka_wordcount(brokers: str, *, name: str = "kafka_wordcount", topic: str = INPUT_TOPIC) -> Topology:
    """The word count reading ``topic`` (:data:`PARTITIONS` partitions) at ``brokers``."""
    t = Topology(name)
    sentences = t.source("sentences", KafkaTopic(brokers, topic, partitions=PARTITIONS), schema={"sentence": "string"})
    words = sentences.select_expr("explode(split(sentence, ' ')) AS word")
    t.query("words", words.group_by("word").persistent_aggregate(Count(), out="count", state=OpaqueMapState))
    return t


def topology() -> Topology:
    """The example on the configured brokers."""
    return build_kafka_wordcount(bootstrap())
