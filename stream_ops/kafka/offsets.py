"""Reading Kafka topics' low and high offsets, bounded in time, with reused admin clients.

:class:`EndOffsets` holds one admin client per (bootstrap, client settings), reused across
calls (the Dagster heartbeat sensor keeps one for its lifetime), and reads a topic's low and high
offsets of every partition with two ``ListOffsets`` requests sent at once (one round trip,
whatever the partition count), each bounded by ``timeout_s``. A bootstrap that failed is not
asked again for ``retry_after_s``: a broker that is down costs one timeout every
``retry_after_s``, not one per topic and call. Failures are :class:`KafkaServerError`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from stream_ops.errors import KafkaServerError
from stream_ops.kafka.client import client_config, resolve_env_settings

__all__ = ["EndOffsets", "Marks"]

logger = logging.getLogger(__name__)

Marks = dict[int, tuple[int, int]]
"""Partition -> (low, high) offsets."""


class EndOffsets:
    """Low and high offsets of topics' partitions, one client per (bootstrap, settings), reused.

    Args:
        timeout_s: Longest wait for one topic's offsets.
        retry_after_s: A bootstrap that failed is not asked again for this long.
        clock: Monotonic clock (injectable for tests).
    """

    def __init__(
        self, *, timeout_s: float = 2.0, retry_after_s: float = 30.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if timeout_s <= 0 or retry_after_s < 0:
            raise ValueError(
                f"EndOffsets: timeout_s ({timeout_s}) must be positive and retry_after_s ({retry_after_s}) not negative"
            )
        self.timeout_s = timeout_s
        self.retry_after_s = retry_after_s
        self._clock = clock
        self._clients: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
        self._failures: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[float, str]] = {}
        self._lock = threading.Lock()

    @property
    def clients(self) -> int:
        """Admin clients held (one per bootstrap and settings seen)."""
        return len(self._clients)

    def read(self, bootstrap: str, topic: str, partitions: int, *, config: Iterable[tuple[str, str]] = ()) -> Marks:
        """(low, high) offsets of partitions ``0 .. partitions - 1`` of ``topic``.

        Args:
            bootstrap: The brokers.
            topic: The topic.
            partitions: How many partitions to read.
            config: librdkafka settings; ``env:NAME`` values resolve only for names a topology may see
                (:func:`~stream_ops.kafka.client.resolve_env_settings`).

        Raises:
            KafkaServerError: The brokers did not answer in ``timeout_s`` (or failed less than
                ``retry_after_s`` ago), refused, have no such partition, or a setting names an
                unset environment variable.
        """
        settings = resolve_env_settings(dict(config), what=f"Kafka topic {topic!r} client_config", error=KafkaServerError)
        key = (bootstrap, tuple(sorted(settings.items())))
        with self._lock:
            failed = self._failures.get(key)
            if failed is not None and self._clock() - failed[0] < self.retry_after_s:
                raise KafkaServerError(f"{failed[1]} (not asked again for {self.retry_after_s:g}s)")
            try:
                marks = self._list(self._client(key, settings), bootstrap, topic, partitions)
            except KafkaServerError as e:
                self._failures[key] = (self._clock(), str(e))
                logger.debug("offsets of %s at %s not read: %s", topic, bootstrap, e)
                raise
            self._failures.pop(key, None)
            return marks

    def _client(self, key: tuple[str, tuple[tuple[str, str], ...]], settings: Mapping[str, str]) -> Any:
        from confluent_kafka.admin import AdminClient

        client = self._clients.get(key)
        if client is None:
            client = self._clients[key] = AdminClient(client_config(key[0], **settings))
        return client

    def _list(self, admin: Any, bootstrap: str, topic: str, partitions: int) -> Marks:
        from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        deadline = self._clock() + self.timeout_s
        requests: dict[str, dict[Any, Future[Any]]] = {}
        try:
            for name, spec in (("low", OffsetSpec.earliest()), ("high", OffsetSpec.latest())):
                requests[name] = admin.list_offsets(
                    {TopicPartition(topic, p): spec for p in range(partitions)},
                    isolation_level=IsolationLevel.READ_UNCOMMITTED,
                    request_timeout=self.timeout_s,
                )
            found: dict[str, dict[int, int]] = {}
            for name, futures in requests.items():
                found[name] = {
                    tp.partition: int(future.result(timeout=max(0.05, deadline - self._clock()) + 0.5).offset)
                    for tp, future in futures.items()
                }
        except (KafkaException, FutureTimeout, ValueError, TypeError) as e:
            for futures in requests.values():
                for future in futures.values():
                    future.cancel()
            reason = str(e) or type(e).__name__
            raise KafkaServerError(f"offsets of {topic!r} at {bootstrap} not read in {self.timeout_s:g}s: {reason}") from e
        return {p: (found["low"][p], found["high"][p]) for p in range(partitions)}
