"""What users pass to ``topology.source(name, <source>, schema=...)``, and its spec for the plan.

Example:
    >>> source_spec(FileTopic("/data/sentences", queues=2), {"sentence": "string"}).kind
    'file_topic'
    >>> source_spec(RateSource(rows_per_second=1000), None).fields
    {'timestamp': 'long', 'value': 'long'}
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import ValidationError

from stream_ops.errors import TopologyDefinitionError
from stream_ops.sources.base import SchemaArg, SourceDefinition, SourceSpec, schema_fields, source_kind
from stream_ops.sources.file_topic_source import file_topic_spec
from stream_ops.sources.kafka_source import kafka_spec
from stream_ops.sources.landed_files import landed_files_spec
from stream_ops.sources.rate import RATE_FIELDS, rate_spec
from stream_ops.topics.file_topic import FileTopic


def _one_schema(own: SchemaArg | None, given: SchemaArg | None, what: str) -> SchemaArg | None:
    """The schema of a definition object or the ``schema=`` argument; both only if they agree."""
    if own is None or given is None:
        return own if own is not None else given
    if schema_fields(own, what) != schema_fields(given, what):
        raise TopologyDefinitionError(f"{what}: two different schemas, one on the source and one in schema=; give one")
    return own


@dataclass(frozen=True)
class ParquetFiles:
    """Parquet files landed in ``path`` by other systems (see :mod:`stream_ops.sources.landed_files`).

    Attributes:
        path: the directory; one task reads every file that lands directly in it.
        schema: field -> Spark type; None infers it from the first file there now. Columns
            are read by name, so the schema may leave columns out.
    """

    path: str | os.PathLike[str]
    schema: SchemaArg | None = None

    def to_source_spec(self, schema: SchemaArg | None) -> SourceSpec:
        """The plan's spec; ``schema`` is ``topology.source``'s ``schema=``."""
        return landed_files_spec(self.path, "parquet", _one_schema(self.schema, schema, repr(self)))


@dataclass(frozen=True)
class CsvFiles:
    """CSV files landed in ``path`` by other systems (see :mod:`stream_ops.sources.landed_files`).

    Attributes:
        path: the directory; one task reads every file that lands directly in it.
        schema: field -> scalar Spark type of every column in order; None infers it from the
            first file there now (names from the header, or ``_c0``, ``_c1``, ... without one).
        header: whether each file starts with a header line. With a header and field names
            equal to it, Spark fails the task on a file whose header differs (columns moved);
            with renamed fields, columns are read by position.
        delimiter: the field separator (one character).
    """

    path: str | os.PathLike[str]
    schema: SchemaArg | None = None
    header: bool = True
    delimiter: str = ","

    def to_source_spec(self, schema: SchemaArg | None) -> SourceSpec:
        """The plan's spec; ``schema`` is ``topology.source``'s ``schema=``."""
        return landed_files_spec(
            self.path,
            "csv",
            _one_schema(self.schema, schema, repr(self)),
            header=self.header,
            delimiter=self.delimiter,
        )


@dataclass(frozen=True)
class JsonFiles:
    """JSON-lines files landed in ``path`` by other systems (see :mod:`stream_ops.sources.landed_files`).

    Attributes:
        path: the directory; one task reads every file that lands directly in it.
        schema: field -> Spark type (nested DDL allowed); None infers it from the first file
            there now.
    """

    path: str | os.PathLike[str]
    schema: SchemaArg | None = None

    def to_source_spec(self, schema: SchemaArg | None) -> SourceSpec:
        """The plan's spec; ``schema`` is ``topology.source``'s ``schema=``."""
        return landed_files_spec(self.path, "json", _one_schema(self.schema, schema, repr(self)))


@dataclass(frozen=True)
class RateSource:
    """Spark's rate source for load tests: records (``timestamp`` epoch ms, ``value``) in one task.

    Attributes:
        rows_per_second: how many records Spark makes per second.
        num_partitions: how many Spark partitions they are spread over.
    """

    rows_per_second: int = 100
    num_partitions: int = 1

    def to_source_spec(self, schema: SchemaArg | None) -> SourceSpec:
        """The plan's spec; ``schema`` must be left out (or be the fixed fields)."""
        if schema is not None and schema_fields(schema, repr(self)) != RATE_FIELDS:
            raise TopologyDefinitionError(f"{self!r}: its fields are fixed ({RATE_FIELDS}); leave schema= out")
        return rate_spec(self.rows_per_second, self.num_partitions)


@dataclass(frozen=True)
class KafkaTopic:
    """A Kafka topic, one task per partition (see :mod:`stream_ops.sources.kafka_source`).

    Workers need Spark's Kafka connector: a worker puts it on ``spark.jars`` by itself when the
    jar cache has it (the install step fetches it: ``python -m stream_ops.kafka.jars``), and
    ``stream-ops worker --kafka-connector`` fetches it when it is missing.

    Attributes:
        bootstrap: ``host:port[,...]`` of the brokers, as the workers reach them.
        topic: the topic.
        format: ``"json"``: each value is a JSON object of ``schema``'s fields (a value that
            does not parse is a dead letter); ``"raw"``: the value as the string field ``value``.
        starting_offsets: where a new task starts reading: ``"earliest"``, ``"latest"`` or
            ``{"timestamp": epoch_ms}`` (the first record at or after it).
        schema: field -> Spark type of the JSON values (or ``schema=`` of ``topology.source``).
        partitions: the topic's partition count, one task each; None reads it from the brokers
            when the plan is built (at submit), never when the topology is defined.
        encoding: how the key, a raw value and header values become strings: ``"utf8"`` or
            ``"base64"``.
        fail_on_data_loss: fail the task when unread records are gone (retention, a deleted
            topic) instead of skipping them (Spark's ``failOnDataLoss``).
        max_offsets_per_trigger: at most this many records per batch; None: all available.
        spark_options: Kafka consumer settings for Spark's connector (Java client names, e.g.
            ``{"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.jaas.config":
            "env:KAFKA_JAAS"}``), passed as ``kafka.<name>``; ``env:NAME`` values are read from
            the worker's environment.
        client_config: librdkafka settings for stream_ops' own reads (partition count, lag, small
            batches read on the driver),
            e.g. ``{"security.protocol": "SASL_SSL", "sasl.username": "u", "sasl.password":
            "env:KAFKA_PASSWORD"}``.

    Besides its own fields, every record has ``kafka_key``, ``kafka_partition``,
    ``kafka_offset``, ``kafka_timestamp`` (epoch ms) and ``kafka_headers``.
    """

    bootstrap: str
    topic: str
    format: str = "json"
    starting_offsets: str | Mapping[str, int] = "earliest"
    schema: SchemaArg | None = None
    partitions: int | None = None
    encoding: str = "utf8"
    fail_on_data_loss: bool = True
    max_offsets_per_trigger: int | None = None
    spark_options: Mapping[str, str] | None = None
    client_config: Mapping[str, str] | None = None

    def to_source_spec(self, schema: SchemaArg | None) -> SourceSpec:
        """The plan's spec; ``schema`` is ``topology.source``'s ``schema=``."""
        return kafka_spec(
            self.bootstrap,
            self.topic,
            format=self.format,
            schema=_one_schema(self.schema, schema, repr(self)),
            starting_offsets=self.starting_offsets,
            partitions=self.partitions,
            encoding=self.encoding,
            fail_on_data_loss=self.fail_on_data_loss,
            max_offsets_per_trigger=self.max_offsets_per_trigger,
            spark_options=self.spark_options,
            client_config=self.client_config,
        )


def source_spec(source: object, schema: SchemaArg | None = None) -> SourceSpec:
    """The plan's spec of what a user passed to ``topology.source``.

    Args:
        source: a :class:`~stream_ops.topics.file_topic.FileTopic` (JSON lines, one task per
            queue), :class:`ParquetFiles`, :class:`CsvFiles`, :class:`JsonFiles`,
            :class:`RateSource`, :class:`KafkaTopic`, or any object with a ``to_source_spec(schema)`` method.
        schema: field -> Spark type, or a list of string field names. Required for a
            FileTopic; optional for landed files (inferred from them when left out).

    Raises:
        TopologyDefinitionError: anything else as ``source``, a missing or bad schema, bad
            options, or a spec of an unregistered kind.
    """
    if isinstance(source, FileTopic):
        what = f"FileTopic({source.path!r})"
        if schema is None:
            raise TopologyDefinitionError(f"{what}: a FileTopic source needs schema= (field -> type of its JSON records)")
        spec = file_topic_spec(source, schema_fields(schema, what))
    elif isinstance(source, SourceDefinition):
        try:
            spec = source.to_source_spec(schema)
        except ValidationError as e:
            raise TopologyDefinitionError(f"{source!r}: {e}") from e
    else:
        raise TopologyDefinitionError(
            "a source must be a FileTopic, ParquetFiles, CsvFiles, JsonFiles, RateSource or KafkaTopic "
            f"(or have a to_source_spec(schema) method), got {type(source).__name__}"
        )
    source_kind(spec.kind)
    return spec
