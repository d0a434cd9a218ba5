"""The consumer lag of a tick, from the Kafka source topics' offsets.

The offsets come from :class:`~stream_ops.kafka.offsets.EndOffsets` (one admin client per
bootstrap and settings, bounded in time, a failed bootstrap not asked again for a while);
failures are :class:`KafkaServerError`, which the tick reports in the observation and the check
and goes on.

:func:`read_topology_lags` is what a tick does per observed topology; a :class:`TickOffsets`
memo reads each (bootstrap, topic) once per tick however many topologies read it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from stream_ops.errors import KafkaServerError
from stream_ops.kafka.offsets import EndOffsets, Marks
from stream_ops.nimbus.status import TopologyStatus
from stream_ops.orchestration.consumer_lag import KafkaSourceWatch, TopologyLag, partition_lags

__all__ = ["TickOffsets", "read_topology_lags"]

logger = logging.getLogger(__name__)


class TickOffsets:
    """One tick's reads through an :class:`EndOffsets`: each (bootstrap, topic, settings) once."""

    def __init__(self, offsets: EndOffsets) -> None:
        self._offsets = offsets
        self._read: dict[tuple[str, str, tuple[tuple[str, str], ...]], Marks | KafkaServerError] = {}

    def marks(self, watch: KafkaSourceWatch) -> Marks:
        """(low, high) offsets of the topic ``watch`` reads (raising what :meth:`EndOffsets.read` raises)."""
        key = (watch.bootstrap, watch.topic, watch.client_config)
        found = self._read.get(key)
        if found is None or (isinstance(found, dict) and len(found) < watch.partitions):
            try:
                found = self._offsets.read(watch.bootstrap, watch.topic, watch.partitions, config=watch.client_config)
            except KafkaServerError as e:
                found = e
            self._read[key] = found
        if isinstance(found, KafkaServerError):
            raise found
        return found


def read_topology_lags(status: TopologyStatus, watches: Iterable[KafkaSourceWatch], offsets: TickOffsets) -> list[TopologyLag]:
    """The lag of each Kafka topic ``status``'s topology reads (a failed read: lags unknown, with the error)."""
    lags: list[TopologyLag] = []
    for watch in watches:
        try:
            marks: Marks | None = offsets.marks(watch)
            error = None
        except KafkaServerError as e:
            marks, error = None, str(e)
        lags.append(
            TopologyLag(
                watch=watch,
                topology_id=status.topology_id,
                status=status.status,
                partitions=partition_lags(watch, status.tasks, marks),
                error=error,
            )
        )
    return lags
