"""What a ``to_kafka`` sink is: its options, checked when the topology is defined, and its names.

:func:`kafka_sink_spec` validates what :meth:`stream_ops.Stream.to_kafka` was given without
contacting Kafka (defining a topology stays offline; the brokers are reached by the tasks) and
returns the :class:`KafkaSinkSpec` the plan carries. :func:`transactional_id` names the Kafka
transactional producer of one task of one sink, the identity that fences a stale owner (see
:mod:`stream_ops.kafka.sink`). :func:`resolve_config` turns the pass-through client settings
into what librdkafka gets, reading ``env:NAME`` values from the worker's environment so secrets
need not be stored in the plan.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from stream_ops.errors import KafkaSinkError, TopologyDefinitionError
from stream_ops.helpers.field_paths import path_type
from stream_ops.kafka.client import resolve_env_settings

DEFAULT_PROGRESS_TOPIC = "stream-ops-sink-progress"
"""The compacted topic where each sink task records, in its delivery transactions, the last txid
it delivered (shared by every sink on the cluster; one key per transactional id)."""
DEFAULT_ID_PREFIX = "stream-ops"
"""The first part of every transactional id (for brokers with prefixed transactional-id ACLs)."""
RESERVED_CONFIG = frozenset(
    {
        "bootstrap.servers",
        "transactional.id",
        "enable.idempotence",
        "isolation.level",
        "group.id",
        "enable.auto.commit",
        "enable.partition.eof",
        "logger",
    }
)
"""Client settings the sink sets itself: exactly-once depends on them."""
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_ID_PART = re.compile(r"^[A-Za-z0-9._-]{1,100}$")
_CONFIG_KEY = re.compile(r"^[a-z][a-z0-9._-]*$")


class KafkaSinkSpec(BaseModel):
    """The options of a Kafka sink, as the plan carries them (see :meth:`stream_ops.Stream.to_kafka`)."""

    model_config = ConfigDict(frozen=True)

    bootstrap: str
    topic: str
    key: str | None = None
    """The field whose value is the record key (None: no key)."""
    value: str | None = None
    """The field whose value is the record value (None: the record's fields as a JSON object)."""
    partitions: int | None = None
    """Create the topic with this many partitions when it is missing (None: it must exist)."""
    replication_factor: int | None = None
    """Replicas of the topics the sink creates (None: the brokers' default)."""
    config: dict[str, str] = {}
    """librdkafka settings for every client of the sink (SASL, TLS, timeouts, ...)."""
    progress_topic: str = DEFAULT_PROGRESS_TOPIC
    transactional_id_prefix: str = DEFAULT_ID_PREFIX


def check_topic_name(name: object, what: str, argument: str = "topic") -> str:
    """``name`` if Kafka accepts it as a topic name.

    Raises:
        TopologyDefinitionError: it is not a string of 1 to 249 letters, digits, '.', '_' or '-',
            or it is '.' or '..'.
    """
    if not isinstance(name, str) or not _TOPIC.match(name) or name in (".", ".."):
        raise TopologyDefinitionError(
            f"{what}: {argument} {name!r} is not a valid Kafka topic name (1 to 249 letters, digits, '.', '_', '-')"
        )
    return name


def _optional_count(value: object, what: str, argument: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise TopologyDefinitionError(f"{what}: {argument} must be a positive integer or None, got {value!r}")
    return value


def _config(config: Mapping[str, Any] | None, what: str) -> dict[str, str]:
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        raise TopologyDefinitionError(f"{what}: config must be a mapping of librdkafka settings, got {type(config).__name__}")
    found: dict[str, str] = {}
    for key, value in config.items():
        if not isinstance(key, str) or not _CONFIG_KEY.match(key):
            raise TopologyDefinitionError(f"{what}: config key {key!r} is not a librdkafka setting name")
        if key in RESERVED_CONFIG:
            raise TopologyDefinitionError(
                f"{what}: config may not set {key!r}: the sink sets it itself (exactly-once depends on it)"
            )
        if isinstance(value, bool):
            found[key] = "true" if value else "false"
        elif isinstance(value, str | int | float):
            found[key] = str(value)
        else:
            raise TopologyDefinitionError(f"{what}: config {key!r} must be a string, number or bool, got {type(value).__name__}")
    return found


def kafka_sink_spec(
    bootstrap: object,
    topic: object,
    *,
    fields: Mapping[str, str],
    what: str,
    key: str | None = None,
    value: str | None = None,
    partitions: int | None = None,
    replication_factor: int | None = None,
    config: Mapping[str, Any] | None = None,
    progress_topic: str = DEFAULT_PROGRESS_TOPIC,
    transactional_id_prefix: str = DEFAULT_ID_PREFIX,
) -> KafkaSinkSpec:
    """The spec of a sink writing a stream of ``fields`` into ``topic``; ``what`` names the call in errors.

    Raises:
        TopologyDefinitionError: a bad argument: no brokers, a bad topic name, a key or value
            field the stream does not have, a count that is not positive, a config setting
            the sink owns, the progress topic being the output topic.
    """
    if not isinstance(bootstrap, str) or not bootstrap.strip() or any(not part.strip() for part in bootstrap.split(",")):
        raise TopologyDefinitionError(f"{what}: bootstrap must name the brokers (host:port[,host:port...]), got {bootstrap!r}")
    name = check_topic_name(topic, what)
    for argument, field in (("key", key), ("value", value)):
        if field is None:
            continue
        if not isinstance(field, str):
            raise TopologyDefinitionError(f"{what}: {argument} must be a field name or None, got {field!r}")
        path_type(fields, field, f"{what}: {argument}")
    progress = check_topic_name(progress_topic, what, "progress_topic")
    if progress == name:
        raise TopologyDefinitionError(f"{what}: progress_topic must differ from the output topic {name!r}")
    if not isinstance(transactional_id_prefix, str) or not _ID_PART.match(transactional_id_prefix):
        raise TopologyDefinitionError(
            f"{what}: transactional_id_prefix {transactional_id_prefix!r} must be 1 to 100 letters, digits, '.', '_', '-'"
        )
    return KafkaSinkSpec(
        bootstrap=",".join(part.strip() for part in bootstrap.split(",")),
        topic=name,
        key=key,
        value=value,
        partitions=_optional_count(partitions, what, "partitions"),
        replication_factor=_optional_count(replication_factor, what, "replication_factor"),
        config=_config(config, what),
        progress_topic=progress,
        transactional_id_prefix=transactional_id_prefix,
    )


def transactional_id(prefix: str, topology_id: str, sink: str, task_id: int) -> str:
    """The transactional id of task ``task_id``'s producer for ``sink``: ``<prefix>.<topology id>.<sink>.t<task>``.

    Stable across owners of the task (so a new owner's producer fences the old one's) and
    distinct per submission (txids start again at 0 in a new submission)."""
    return f"{prefix}.{topology_id}.{sink}.t{task_id:05d}"


def resolve_config(config: Mapping[str, str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The sink's client settings with every ``env:NAME`` value read from ``environ`` (the process's).

    Raises:
        KafkaSinkError: a named environment variable is not set.
    """
    return resolve_env_settings(config, what="Kafka sink", error=KafkaSinkError, environ=environ)
