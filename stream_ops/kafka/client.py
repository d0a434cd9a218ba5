"""Small confluent-kafka helpers: a topic's partition count, creating a topic, a partition's end offset.

The clients log through Python's ``logging`` (logger ``stream_ops.kafka.librdkafka``), not
librdkafka's own stderr lines, so a broker that is down does not flood a worker's output.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

from stream_ops.errors import KafkaServerError, StreamOpsError
from stream_ops.topology_env import PASS_ENV_VARIABLE, topology_environment

logger = logging.getLogger(__name__)
_client_logger = logging.getLogger("stream_ops.kafka.librdkafka")


def client_config(bootstrap: str, **extra: Any) -> dict[str, Any]:
    """confluent-kafka settings reaching ``bootstrap``, logging through :mod:`logging`."""
    return {"bootstrap.servers": bootstrap, "logger": _client_logger, **extra}


ENV_PREFIX = "env:"
"""A client setting ``env:NAME`` is read from the environment variable ``NAME``, so secrets stay
out of plans and confs stored in ZooKeeper. Only names a topology may see resolve: the
allow-listed environment and the names passed through to topologies
(:mod:`stream_ops.topology_env`), in a worker and in the Dagster process alike, so a topology's
conf cannot have Dagster send its database password, or a worker its ZooKeeper credentials, to a
broker of the topology's choosing."""


def resolve_env_settings(
    config: Mapping[str, str],
    *,
    what: str,
    error: type[StreamOpsError],
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """``config`` with every ``env:NAME`` value read from ``environ`` (default: what a topology
    may see of this process's environment, :func:`~stream_ops.topology_env.topology_environment`).

    Raises:
        StreamOpsError: (``error``) a named environment variable is not set, or is not one a
            topology may read; the message names ``what`` the setting belongs to.
        TopologyEnvironmentError: ``STREAM_OPS_WORKER_PASS_ENV`` names a secret of stream_ops,
            Dagster or a database.
    """
    env = topology_environment(os.environ) if environ is None else environ
    resolved: dict[str, str] = {}
    for key, value in config.items():
        if value.startswith(ENV_PREFIX):
            variable = value[len(ENV_PREFIX) :]
            if variable not in env:
                hidden = environ is None and variable in os.environ
                raise error(
                    f"{what} setting {key!r} names the environment variable {variable!r}, which "
                    + (
                        "topologies may not read: only allow-listed names and those passed through resolve; if the "
                        f"topology may see it, pass it through ({PASS_ENV_VARIABLE}, stream-ops worker --pass-env, "
                        "StreamClusterResource.worker_pass_env)"
                        if hidden
                        else f"is not set (workers keep only allow-listed variables: pass it through with {PASS_ENV_VARIABLE} "
                        "or stream-ops worker --pass-env)"
                    )
                )
            value = env[variable]
        resolved[key] = value
    return resolved


def partition_count(bootstrap: str, topic: str, *, timeout_s: float = 10.0, config: Mapping[str, Any] | None = None) -> int:
    """How many partitions ``topic`` has on the cluster at ``bootstrap`` (``config``: client settings).

    Raises:
        KafkaServerError: the cluster did not answer in ``timeout_s`` or has no such topic.
    """
    found = topic_partitions(bootstrap, topic, timeout_s=timeout_s, config=config)
    if found is None:
        raise KafkaServerError(f"Kafka at {bootstrap} has no topic {topic!r}")
    return found


def topic_partitions(
    bootstrap: str, topic: str, *, config: Mapping[str, Any] | None = None, timeout_s: float = 10.0
) -> int | None:
    """How many partitions ``topic`` has, None when the cluster has no such topic.

    Raises:
        KafkaServerError: the cluster did not answer in ``timeout_s``.
    """
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(client_config(bootstrap, **(config or {})))
    try:
        metadata = admin.list_topics(topic=topic, timeout=timeout_s)
    except KafkaException as e:
        raise KafkaServerError(f"Kafka at {bootstrap} did not answer in {timeout_s:.0f} s: {e}") from e
    found = metadata.topics.get(topic)
    if found is None or (found.error is not None and found.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
        return None
    if found.error is not None:
        raise KafkaServerError(f"Kafka at {bootstrap}: topic {topic!r}: {found.error}")
    return len(found.partitions) or None


def ensure_topic(
    bootstrap: str,
    topic: str,
    *,
    partitions: int,
    replication_factor: int | None = None,
    topic_config: Mapping[str, str] | None = None,
    config: Mapping[str, Any] | None = None,
    timeout_s: float = 30.0,
) -> int:
    """Create ``topic`` unless it exists (another client creating it meanwhile is fine); returns
    its partition count. ``replication_factor`` None takes the brokers' default.

    Raises:
        KafkaServerError: Kafka refused to create it (a bad setting, no permission) or did not
            answer in ``timeout_s``.
    """
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    existing = topic_partitions(bootstrap, topic, config=config, timeout_s=timeout_s)
    if existing is not None:
        return existing
    admin = AdminClient(client_config(bootstrap, **(config or {})))
    new = NewTopic(
        topic,
        num_partitions=partitions,
        replication_factor=-1 if replication_factor is None else replication_factor,
        config=dict(topic_config or {}),
    )
    futures = admin.create_topics([new], operation_timeout=timeout_s, request_timeout=timeout_s)
    try:
        futures[topic].result(timeout=timeout_s)
        logger.info("created Kafka topic %r (%d partitions) at %s", topic, partitions, bootstrap)
    except KafkaException as e:
        if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise KafkaServerError(f"Kafka at {bootstrap} did not create topic {topic!r}: {e}") from e
    deadline = time.monotonic() + timeout_s
    while True:  # the topic reaches every broker's metadata shortly after the controller's answer
        found = topic_partitions(bootstrap, topic, config=config, timeout_s=timeout_s)
        if found is not None:
            return found
        if time.monotonic() >= deadline:
            raise KafkaServerError(f"topic {topic!r} did not show up at {bootstrap} in {timeout_s:.0f} s")
        time.sleep(0.1)


class OffsetReader:
    """Reads partitions' end offsets with one consumer per bootstrap, shared by threads (a lock
    serialises the calls: a confluent-kafka client is not documented as thread-safe)."""

    def __init__(self) -> None:
        self._consumers: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
        self._lock = threading.Lock()

    def watermarks(
        self, bootstrap: str, topic: str, partition: int, *, timeout_s: float = 2.0, config: Mapping[str, str] | None = None
    ) -> tuple[int, int] | None:
        """(low, high) offsets of the partition (high: the offset the next record gets), None
        when the broker does not answer in time. ``config``: client settings (SASL, TLS)."""
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        settings = dict(config or {})
        key = (bootstrap, tuple(sorted(settings.items())))
        with self._lock:
            consumer = self._consumers.get(key)
            if consumer is None:
                options = client_config(bootstrap, **settings, **{"group.id": "stream-ops-offsets", "enable.auto.commit": False})
                consumer = self._consumers[key] = Consumer(options)
            try:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout_s, cached=False)
            except KafkaException as e:
                logger.debug("end offset of %s-%d at %s not read: %s", topic, partition, bootstrap, e)
                return None
        return int(low), int(high)
