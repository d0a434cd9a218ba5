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

import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stream_ops.errors import ConfigError, KafkaShuffleError
from stream_ops.kafka.client import resolve_env_settings
from stream_ops.kafka.sink_options import DEFAULT_ID_PREFIX, DEFAULT_PROGRESS_TOPIC, transactional_id

TOPIC_PREFIX = "stream_ops-shuffle"
SHUFFLE_TOPIC_CONFIG: dict[str, str] = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}
"""Settings of the shuffle topics stream_ops creates: records are kept as the shuffle files are
(a downstream task replaying after a long outage reads its offset range again); delete a killed
topology's topics as you delete its topics directory."""
_ILLEGAL = re.compile(r"[^A-Za-z0-9._-]")
_CONF_KEYS = {
    "bootstrap": "shuffle_bootstrap",
    "config": "shuffle_config",
    "spark_options": "shuffle_spark_options",
    "replication_factor": "shuffle_replication_factor",
    "timeout_s": "shuffle_timeout_s",
}


class KafkaShuffle(BaseModel):
    """Shuffle a topology's records between stages through Kafka (its conf says so, see :meth:`from_conf`).

    Example:
        >>> submit(store, cluster, topology, conf={**KafkaShuffle(bootstrap="kafka:9092").to_conf()})
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap: str = Field(min_length=1, description="host:port[,host:port...] of the brokers, as workers reach them.")
    config: dict[str, str] = Field(
        default_factory=dict,
        description="librdkafka settings for the producers (SASL, TLS); a value env:NAME is read from the worker's environment.",
    )
    spark_options: dict[str, str] = Field(
        default_factory=dict,
        description="Java client settings for Spark's Kafka reader (passed as kafka.<name>; env:NAME read likewise).",
    )
    replication_factor: int | None = Field(
        None, ge=1, description="Replicas to create the topics with (None: the brokers' default)."
    )
    timeout_s: float = Field(30.0, gt=0, description="How long a delivery, a progress read or an admin call may take.")

    @classmethod
    def from_conf(cls, conf: Mapping[str, Any]) -> KafkaShuffle | None:
        """The Kafka shuffle a topology's conf asks for, or None for the file shuffle.

        Keys: ``shuffle`` (``"files"``, the default, or ``"kafka"``), ``shuffle_bootstrap``
        (required for Kafka), ``shuffle_config``, ``shuffle_spark_options``,
        ``shuffle_replication_factor``, ``shuffle_timeout_s``.

        Raises:
            ConfigError: an unknown ``shuffle``, or Kafka settings that are missing or malformed.
        """
        kind = conf.get("shuffle", "files")
        if kind == "files":
            return None
        if kind != "kafka":
            raise ConfigError(f"topology conf: shuffle must be 'files' or 'kafka', got {kind!r}")
        values = {name: conf[key] for name, key in _CONF_KEYS.items() if key in conf}
        if "bootstrap" not in values:
            raise ConfigError("topology conf: shuffle='kafka' needs shuffle_bootstrap (host:port of the brokers)")
        try:
            return cls(**values)
        except ValidationError as e:
            raise ConfigError(f"topology conf: bad Kafka shuffle settings: {e}") from None

    def to_conf(self) -> dict[str, Any]:
        """The conf entries that choose this shuffle (merge them into ``submit(conf=...)``)."""
        conf: dict[str, Any] = {"shuffle": "kafka"}
        for name, key in _CONF_KEYS.items():
            value = getattr(self, name)
            if value is not None and value != {}:
                conf[key] = value
        return conf

    def topic_name(self, topology_id: str, stage_index: int, stage_name: str) -> str:
        """The Kafka topic of the shuffle into a stage.

        Raises:
            ConfigError: the name would be longer than Kafka allows.
        """
        name = _ILLEGAL.sub("_", f"{TOPIC_PREFIX}.{topology_id}.{stage_index:03d}-{stage_name}")
        if len(name) > 249:
            raise ConfigError(f"the shuffle topic name {name!r} is longer than Kafka's 249 characters; use a shorter name")
        return name

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
