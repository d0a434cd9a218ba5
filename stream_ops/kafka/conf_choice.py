"""What the Kafka options a topology's conf can choose share: the Kafka state topic
(:class:`~stream_ops.state.kafka_state_topic.KafkaStateTopic`, conf ``state_topic="kafka"``) and
the Kafka shuffle (:class:`~stream_ops.kafka.shuffle_options.KafkaShuffle`, ``shuffle="kafka"``).

Each is a frozen pydantic model whose fields map to conf keys ``<kind key>_<field>``
(``state_topic_bootstrap``, ``shuffle_timeout_s``, ...); ``from_conf`` reads it from a conf
(None when the conf keeps the files default), ``to_conf`` writes it, and ``topic_name`` names
its per-stage topic.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stream_ops.errors import ConfigError

MAX_TOPIC_NAME = 249
_ILLEGAL = re.compile(r"[^A-Za-z0-9._-]")


class KafkaConfChoice(BaseModel):
    """Base of a conf-chosen Kafka option (see the module docstring).

    Subclasses set :attr:`KIND_KEY` (the conf key whose value ``"kafka"`` chooses it),
    :attr:`WHAT` (for messages) and :attr:`TOPIC_PREFIX`.
    """

    KIND_KEY: ClassVar[str]
    WHAT: ClassVar[str]
    TOPIC_PREFIX: ClassVar[str]

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap: str = Field(min_length=1, description="host:port[,host:port...] of the brokers, as workers reach them.")
    config: dict[str, str] = Field(
        default_factory=dict,
        description="librdkafka settings for the clients (SASL, TLS); a value env:NAME is read from the worker's environment.",
    )
    replication_factor: int | None = Field(
        None, ge=1, description="Replicas to create the topics with (None: the brokers' default)."
    )
    timeout_s: float = Field(30.0, gt=0, description="How long a produce, a read or an admin call may take.")

    @classmethod
    def conf_keys(cls) -> dict[str, str]:
        """Field name -> conf key."""
        return {name: f"{cls.KIND_KEY}_{name}" for name in cls.model_fields}

    @classmethod
    def from_conf(cls, conf: Mapping[str, Any]) -> Self | None:
        """The option a topology's conf asks for, or None for the files default.

        Raises:
            ConfigError: an unknown kind, or Kafka settings that are missing or malformed.
        """
        kind = conf.get(cls.KIND_KEY, "files")
        if kind == "files":
            return None
        if kind != "kafka":
            raise ConfigError(f"topology conf: {cls.KIND_KEY} must be 'files' or 'kafka', got {kind!r}")
        values = {name: conf[key] for name, key in cls.conf_keys().items() if key in conf}
        if "bootstrap" not in values:
            raise ConfigError(f"topology conf: {cls.KIND_KEY}='kafka' needs {cls.KIND_KEY}_bootstrap (host:port of the brokers)")
        try:
            return cls(**values)
        except ValidationError as e:
            raise ConfigError(f"topology conf: bad Kafka {cls.WHAT} settings: {e}") from None

    def to_conf(self) -> dict[str, Any]:
        """The conf entries that choose this option (merge them into ``submit(conf=...)``)."""
        conf: dict[str, Any] = {self.KIND_KEY: "kafka"}
        for name, key in self.conf_keys().items():
            value = getattr(self, name)
            if value is not None and value != {}:
                conf[key] = value
        return conf

    def topic_name(self, topology_id: str, stage_index: int, stage_name: str) -> str:
        """The Kafka topic of stage ``stage_index`` (``<prefix>.<topology id>.<index>-<stage>``).

        Raises:
            ConfigError: the name would be longer than Kafka allows.
        """
        name = _ILLEGAL.sub("_", f"{self.TOPIC_PREFIX}.{topology_id}.{stage_index:03d}-{stage_name}")
        if len(name) > MAX_TOPIC_NAME:
            raise ConfigError(
                f"the {self.WHAT} topic name {name!r} is longer than Kafka's {MAX_TOPIC_NAME} characters; use a shorter name"
            )
        return name
