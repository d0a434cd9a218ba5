"""Which shuffle a topology uses between its stages: files (the default) or Kafka topics.

Chosen per topology in its conf, as the state topic is
(:class:`~stream_ops.state.kafka_state_topic.KafkaStateTopic`):
``submit(..., conf=KafkaShuffle(bootstrap).to_conf())``, i.e. ``shuffle="kafka"`` and
``shuffle_bootstrap``. Without it the shuffle stays files in the topics directory.

Names: the shuffle into stage ``s`` is the topic ``stream_ops-shuffle.<topology id>.<s index>-<s name>``
with one partition per queue (task) of ``s``; the producer of upstream task ``t`` for it has the
transactional id ``<prefix>.<topology id>.shuffle-<s index>.t<t>`` (``shuffle-...`` is no valid
sink name, so it never meets a sink's id).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from pydantic import Field

from stream_ops.errors import KafkaShuffleError
from stream_ops.kafka.client import resolve_env_settings
from stream_ops.kafka.conf_choice import KafkaConfChoice
from stream_ops.kafka.sink_options import DEFAULT_ID_PREFIX, DEFAULT_PROGRESS_TOPIC, transactional_id

TOPIC_PREFIX = "stream_ops-shuffle"
SHUFFLE_TOPIC_CONFIG: dict[str, str] = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}
"""Settings of the shuffle topics stream_ops creates: records are kept as the shuffle files are
(a downstream task replaying after a long outage reads its offset range again); delete a killed
topology's topics as you delete its topics directory."""


class KafkaShuffle(KafkaConfChoice):
    """Shuffle a topology's records between stages through Kafka (its conf says so, see :meth:`from_conf`).

    Conf keys: ``shuffle`` (``"files"``, the default, or ``"kafka"``), ``shuffle_bootstrap``
    (required for Kafka), ``shuffle_config``, ``shuffle_spark_options``,
    ``shuffle_replication_factor``, ``shuffle_timeout_s``.

    Example:
        >>> submit(store, cluster, topology, conf={**KafkaShuffle(bootstrap="kafka:9092").to_conf()})
    """

    KIND_KEY: ClassVar[str] = "shuffle"
    WHAT: ClassVar[str] = "shuffle"
    TOPIC_PREFIX: ClassVar[str] = TOPIC_PREFIX

    spark_options: dict[str, str] = Field(
        default_factory=dict,
        description="Java client settings for Spark's Kafka reader (passed as kafka.<name>; env:NAME read likewise).",
    )

    def transactional_id(self, topology_id: str, stage_index: int, task_id: int) -> str:
        """The transactional id of upstream task ``task_id``'s producer into stage ``stage_index``."""
        return transactional_id(DEFAULT_ID_PREFIX, topology_id, output_name(stage_index), task_id)

    @property
    def progress_topic(self) -> str:
        """The compacted progress topic (shared with the Kafka sinks: one key per transactional id)."""
        return DEFAULT_PROGRESS_TOPIC

    def client_config(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """The librdkafka settings with ``env:NAME`` values read (KafkaShuffleError if one is unset)."""
        return resolve_env_settings(self.config, what="Kafka shuffle", error=KafkaShuffleError, environ=environ)

    def reader_options(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """Spark's Kafka reader settings (without the ``kafka.`` prefix), ``env:NAME`` values read."""
        return resolve_env_settings(self.spark_options, what="Kafka shuffle", error=KafkaShuffleError, environ=environ)


def output_name(stage_index: int) -> str:
    """The name of the shuffle into stage ``stage_index`` in progress records and transactional ids."""
    return f"shuffle-{stage_index:03d}"
