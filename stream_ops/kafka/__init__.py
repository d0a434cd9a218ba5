"""Kafka: the jars stream_ops fetches once (:mod:`stream_ops.kafka.jars`) and an embedded
broker for local runs and tests (:mod:`stream_ops.kafka.embedded`)."""
