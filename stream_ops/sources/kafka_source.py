"""A Kafka topic as a source: one task per partition, read by Spark's Kafka connector.

Task ``q`` of the source stage reads partition ``q`` only (Spark's ``assign``
``{"<topic>": [q]}``), so the stage has as many queues as the topic has partitions: given
(``partitions=``), or read from the brokers when the plan is built, at submit
(:meth:`KafkaKind.resolve_spec`), so that defining (importing) a topology never needs them.
Partitions added to the topic later are not read until the topology is submitted again.

Records carry these fields, besides the declared ones (``format="json"``) or ``value``
(``format="raw"``):

=================== ===================================== =======================================
field               type                                  what
=================== ===================================== =======================================
``kafka_key``       string                                the record key (None without one)
``kafka_partition`` int                                   the partition (= the task's queue)
``kafka_offset``    long                                  the record's offset in the partition
``kafka_timestamp`` long                                  the record timestamp, epoch ms
``kafka_headers``   array<struct<key:string,value:string>> the headers in order, repeats kept (None: none)
=================== ===================================== =======================================

Bytes (key, raw value, header values) become strings as UTF-8 (``encoding="utf8"``, bytes that
are not UTF-8 are replaced) or base64 (``encoding="base64"``, exact).

Malformed input: a JSON value is parsed PERMISSIVE against the declared fields, as the JSON
FileTopic source reads a line. A value that does not parse, is not a JSON object or has a value
of another type than its field is kept whole in :data:`CORRUPT_COLUMN` and becomes a dead
letter. A record without a value (a tombstone) is a record whose declared fields are all null.

Exactly-once: a micro-batch's offset range is fixed by Spark's offsets log before it runs, so a
replayed txid re-reads the same records; the commit protocol records the batch's end offset per
partition with each txid (the transactional record's ``offsets``, ``[{"<topic>": {"<p>": end}}]``;
the range starts at the previous txid's). The batch's input fingerprint
(:func:`stream_ops.spark.checkpoint.batch_input`) is that offset range, recorded with the
commit, so a replay that Spark re-planned with other offsets (a checkpoint that fell behind
ZooKeeper) stops the task with an ``InputMismatchError`` instead of reading other records under
a committed txid. Starting
offsets (``earliest``, ``latest``, or the first record at or after a timestamp, the end when
there is none) apply only when the task's checkpoint is new. ``fail_on_data_loss`` (Spark's
``failOnDataLoss``, on by default) fails the task when records it has not read are gone
(retention, a deleted topic) rather than skip them silently.

Small batches on the driver: a batch whose offset range (as Spark logged it) spans at most
``spark.stream_ops.kafkaDriverRecords`` offsets is read by :meth:`KafkaKind.read_offsets` with
confluent-kafka (:mod:`stream_ops.kafka.range_reader`, the Spark source's ``isolation.level``,
``client_config`` to reach the brokers) and computed without a Spark job; anything it cannot
read exactly as Spark does (:mod:`stream_ops.sources.kafka_arrow`) is left to Spark.

Lag: the partition's end offset (read from the broker) less the end offset of the last batch
of the streaming query in this process that reads the partition.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stream_ops.asset_metadata import AssetMetadata
from stream_ops.errors import KafkaServerError, SourceError, TopologyDefinitionError
from stream_ops.helpers.spark_ddl import schema_ddl
from stream_ops.kafka.client import OffsetReader, partition_count, resolve_env_settings
from stream_ops.kafka.range_reader import SPARK_ISOLATION_DEFAULT, RangeReader
from stream_ops.sources.base import (
    CORRUPT_COLUMN,
    OffsetRange,
    PartitionLagWatch,
    SchemaArg,
    SourceAsset,
    SourceKind,
    SourceLag,
    SourceSpec,
    SourceStream,
    schema_fields,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession

logger = logging.getLogger(__name__)

KIND = "kafka_topic"
FORMATS = ("json", "raw")
ENCODINGS = ("utf8", "base64")
OFFSET_KEYWORDS = ("earliest", "latest")
HEADER_TYPE = "array<struct<key:string,value:string>>"
METADATA_FIELDS: dict[str, str] = {
    "kafka_key": "string",
    "kafka_partition": "int",
    "kafka_offset": "long",
    "kafka_timestamp": "long",
    "kafka_headers": HEADER_TYPE,
}
"""The fields every Kafka record carries besides its value's, in column order."""
RAW_VALUE_FIELD = "value"
PROGRESS_TTL_S = 0.5
"""How long one scan of the active queries' progress serves every task's lag."""
PARTITIONS_TIMEOUT_S = 10.0
"""How long building a plan waits for the brokers to tell a topic's partition count."""


# --- definition time -------------------------------------------------------------------------


def _starting_offsets(value: object, what: str) -> str | dict[str, int]:
    if isinstance(value, str) and value in OFFSET_KEYWORDS:
        return value
    if isinstance(value, Mapping) and set(value) == {"timestamp"}:
        ms = value["timestamp"]
        if isinstance(ms, int) and not isinstance(ms, bool) and ms >= 0:
            return {"timestamp": ms}
    raise TopologyDefinitionError(
        f"{what}: starting_offsets must be 'earliest', 'latest' or {{'timestamp': <epoch ms>}}, got {value!r}"
    )


SPARK_OWNED_OPTIONS = (
    "bootstrap.servers",
    "auto.offset.reset",
    "enable.auto.commit",
    "key.deserializer",
    "value.deserializer",
    "interceptor.classes",
)
"""Kafka consumer settings Spark's connector or this source sets itself (Spark refuses most of them)."""


def _settings(value: Mapping[str, str] | None, what: str, name: str, owned: tuple[str, ...] = ()) -> dict[str, str]:
    """A client-settings argument as a plain ``{str: str}``, refusing what the source owns."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise TopologyDefinitionError(f"{what}: {name} must map setting names to strings (env:NAME reads a worker variable)")
    taken = sorted(key for key in value if key.removeprefix("kafka.") in owned)
    if taken:
        raise TopologyDefinitionError(f"{what}: {name} may not set {taken}: the source sets them itself")
    return {key.removeprefix("kafka."): v for key, v in value.items()}


def kafka_spec(
    bootstrap: str,
    topic: str,
    *,
    format: str = "json",  # noqa: A002 - the user-facing name
    schema: SchemaArg | None = None,
    starting_offsets: object = "earliest",
    partitions: int | None = None,
    encoding: str = "utf8",
    fail_on_data_loss: bool = True,
    max_offsets_per_trigger: int | None = None,
    spark_options: Mapping[str, str] | None = None,
    client_config: Mapping[str, str] | None = None,
) -> SourceSpec:
    """The spec of a source reading ``topic`` on the cluster at ``bootstrap`` (never contacts it).

    Args:
        bootstrap: ``host:port[,host:port...]`` of the brokers (as workers reach them).
        topic: the topic.
        format: ``json`` (each value a JSON object of ``schema``'s fields) or ``raw`` (the value
            as a string field ``value``).
        schema: field -> Spark type of the JSON values (required for ``json``, not allowed for ``raw``).
        starting_offsets: where a new task starts: ``earliest``, ``latest`` or ``{"timestamp": ms}``.
        partitions: the topic's partition count; None: the brokers are asked when the plan is built.
        encoding: how bytes become strings: ``utf8`` or ``base64``.
        fail_on_data_loss: Spark's ``failOnDataLoss``.
        max_offsets_per_trigger: at most this many records per batch (Spark's
            ``maxOffsetsPerTrigger``); None: everything available.
        spark_options: Kafka consumer settings (Java client names: ``security.protocol``,
            ``sasl.mechanism``, ``sasl.jaas.config``, ``ssl.truststore.location``, ...) Spark's
            connector gets as ``kafka.<name>`` options; ``env:NAME`` values are read from the
            worker's environment when the task starts.
        client_config: librdkafka settings (``security.protocol``, ``sasl.username``,
            ``ssl.ca.location``, ...) for stream_ops' own reads of the topic: its partition
            count when the plan is built, the end offsets behind the lag and small batches read
            on the driver (:meth:`KafkaKind.read_offsets`); ``env:NAME`` values are read from
            the environment of the process that reads.

    Raises:
        TopologyDefinitionError: a bad argument.
    """
    what = f"Kafka topic {topic!r} at {bootstrap!r}"
    if not isinstance(bootstrap, str) or not bootstrap.strip():
        raise TopologyDefinitionError(f"{what}: bootstrap must name the brokers (host:port)")
    if not isinstance(topic, str) or not topic or len(topic) > 249 or not all(c.isalnum() or c in "._-" for c in topic):
        raise TopologyDefinitionError(f"{what}: not a valid topic name (letters, digits, '.', '_', '-', at most 249)")
    if format not in FORMATS:
        raise TopologyDefinitionError(f"{what}: format must be one of {FORMATS}, got {format!r}")
    if encoding not in ENCODINGS:
        raise TopologyDefinitionError(f"{what}: encoding must be one of {ENCODINGS}, got {encoding!r}")
    if not isinstance(fail_on_data_loss, bool):
        raise TopologyDefinitionError(f"{what}: fail_on_data_loss must be True or False")
    if max_offsets_per_trigger is not None and (
        not isinstance(max_offsets_per_trigger, int) or isinstance(max_offsets_per_trigger, bool) or max_offsets_per_trigger < 1
    ):
        raise TopologyDefinitionError(f"{what}: max_offsets_per_trigger must be a positive integer or None")
    if format == "json":
        if schema is None:
            raise TopologyDefinitionError(f"{what}: format='json' needs schema= (field -> type of the JSON values)")
        fields = schema_fields(schema, what)
    else:
        if schema is not None:
            raise TopologyDefinitionError(
                f"{what}: format='raw' has fixed fields ({RAW_VALUE_FIELD} and the kafka_* ones); leave schema= out"
            )
        fields = {RAW_VALUE_FIELD: "string"}
    clash = sorted(set(fields) & set(METADATA_FIELDS))
    if clash:
        raise TopologyDefinitionError(f"{what}: field(s) {clash} are reserved for the record's Kafka metadata")
    spark_settings = _settings(spark_options, what, "spark_options", SPARK_OWNED_OPTIONS)
    client_settings = _settings(client_config, what, "client_config", ("bootstrap.servers",))
    if partitions is not None and (not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1):
        raise TopologyDefinitionError(f"{what}: partitions must be a positive integer, got {partitions!r}")
    options: dict[str, Any] = {
        "bootstrap": bootstrap.strip(),
        "topic": topic,
        "format": format,
        "starting_offsets": _starting_offsets(starting_offsets, what),
        "encoding": encoding,
        "fail_on_data_loss": fail_on_data_loss,
    }
    if max_offsets_per_trigger is not None:
        options["max_offsets_per_trigger"] = max_offsets_per_trigger
    if spark_settings:
        options["spark_options"] = spark_settings
    if client_settings:
        options["client_config"] = client_settings
    return SourceSpec(kind=KIND, path=None, queues=partitions, fields={**fields, **METADATA_FIELDS}, options=options)


# --- run time ----------------------------------------------------------------------------------


class KafkaKind(SourceKind):
    """A Kafka topic, one partition per queue (Spark's ``kafka`` source; needs its connector jars)."""

    name = KIND
    supports_corrupt_column = True
    asset_kinds = frozenset({"kafka"})
    offsets_readable = True

    def __init__(self) -> None:
        self._offsets = OffsetReader()
        self._ranges = RangeReader()
        self._sessions: list[SparkSession] = []
        self._progress: dict[tuple[str, int], list[int]] = {}
        self._progress_at = 0.0
        self._lock = threading.Lock()

    def columns(self, spec: SourceSpec) -> dict[str, str]:
        """The fields, plus :data:`CORRUPT_COLUMN` for the JSON format."""
        if spec.options.get("format", "json") == "json":
            return {**spec.fields, CORRUPT_COLUMN: "string"}
        return dict(spec.fields)

    def _settings(self, spec: SourceSpec, name: str) -> dict[str, str]:
        """The spec's ``spark_options`` or ``client_config`` with ``env:NAME`` values read here."""
        raw = spec.options.get(name) or {}
        if not isinstance(raw, Mapping):
            raise SourceError(f"a kafka source spec's {name} must be a mapping")
        settings = {str(k): str(v) for k, v in raw.items()}
        return resolve_env_settings(settings, what=f"Kafka source {name}", error=SourceError)

    def _options(self, spec: SourceSpec) -> dict[str, Any]:
        options = spec.options
        for required in ("bootstrap", "topic"):
            if not isinstance(options.get(required), str):
                raise SourceError(f"a kafka source spec needs the option {required!r}")
        return options

    def read_stream(
        self,
        spark: SparkSession,
        spec: SourceSpec,
        queue: int,
        *,
        max_files_per_trigger: int,
        max_file_age: str,
    ) -> DataFrame:
        """Partition ``queue`` of the topic; ``max_files_per_trigger`` and ``max_file_age`` do not apply."""
        stream = self.open_stream(spark, spec, queue, max_files_per_trigger=max_files_per_trigger, max_file_age=max_file_age)
        assert stream.shape is not None
        return stream.shape(stream.raw)

    def open_stream(
        self,
        spark: SparkSession,
        spec: SourceSpec,
        queue: int,
        *,
        max_files_per_trigger: int,
        max_file_age: str,
    ) -> SourceStream:
        """Spark's Kafka relation of partition ``queue`` as it is (key, value, ..., headers), and
        the projection to the source's fields (values parsed, metadata columns, bytes as
        strings): a batch read on the driver is planned by Spark without them."""
        self.check_spec(spec, queue)
        options = self._options(spec)
        topic = str(options["topic"])
        reader = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", str(options["bootstrap"]))
            .option("assign", json.dumps({topic: [queue]}))
            .option("failOnDataLoss", bool(options.get("fail_on_data_loss", True)))
            .option("includeHeaders", True)
        )
        starting = options.get("starting_offsets", "earliest")
        if isinstance(starting, dict):
            reader = reader.option("startingOffsetsByTimestamp", json.dumps({topic: {str(queue): starting["timestamp"]}}))
            reader = reader.option("startingOffsetsByTimestampStrategy", "latest")
        else:
            reader = reader.option("startingOffsets", str(starting))
        if options.get("max_offsets_per_trigger") is not None:
            reader = reader.option("maxOffsetsPerTrigger", int(str(options["max_offsets_per_trigger"])))
        for name, setting in self._settings(spec, "spark_options").items():
            reader = reader.option(f"kafka.{name}", setting)
        with self._lock:
            if not any(s is spark for s in self._sessions):
                self._sessions.append(spark)
        try:
            raw = reader.load()
        except Exception as e:
            if "KAFKA_DATA_SOURCE_NOT_ENABLED" in str(e) or "Failed to find data source: kafka" in str(e):
                raise SourceError(
                    "this worker's Spark has no Kafka connector: start the worker with --kafka-connector (fetches "
                    "it into the jar cache if needed), or with --spark-conf spark.jars=$(python -m "
                    "stream_ops.kafka.jars --spark-jars) (spark.jars must be set before its SparkSession is created)"
                ) from e
            raise
        fmt, encoding = str(options.get("format", "json")), str(options.get("encoding", "utf8"))
        value_fields = {name: typ for name, typ in spec.fields.items() if name not in METADATA_FIELDS}
        return SourceStream(raw, lambda records: _source_columns(records, value_fields, fmt=fmt, encoding=encoding))

    def with_batch_offsets_bound(self, spec: SourceSpec, offsets: int) -> SourceSpec:
        """``spec`` with Spark's ``maxOffsetsPerTrigger`` at ``offsets`` when its definition set
        none (``max_offsets_per_trigger``); one partition per query, so per partition."""
        if spec.options.get("max_offsets_per_trigger") is not None:
            return spec
        return spec.model_copy(update={"options": {**spec.options, "max_offsets_per_trigger": offsets}})

    def read_offsets(self, spec: SourceSpec, ranges: Sequence[OffsetRange]) -> pa.Table | None:
        """The batch over ``ranges`` (one partition of the topic: a task's) read on the driver with confluent-kafka
        (:mod:`stream_ops.kafka.range_reader`: the Spark source's isolation level, the spec's
        ``client_config`` to reach the brokers) and turned into the source's fields as
        :meth:`read_stream` turns Spark's rows (:mod:`stream_ops.sources.kafka_arrow`); None when
        that is not exactly what Spark would read (the batch is then Spark's to read)."""
        from stream_ops.sources.kafka_arrow import source_table

        options = self._options(spec)
        topic = str(options["topic"])
        if len(ranges) != 1 or ranges[0].topic != topic:
            logger.warning("a Kafka batch of topic %s: Spark logged the offsets of %s", topic, list(ranges))
            return None
        span = ranges[0]
        self.check_spec(spec, span.partition)
        queue = span.partition
        try:
            spark_settings = self._settings(spec, "spark_options")
            config = self._settings(spec, "client_config")
        except SourceError as e:
            logger.info("Kafka batch of %s-%d left to Spark: %s", topic, queue, e)
            return None
        isolation = spark_settings.get("isolation.level", SPARK_ISOLATION_DEFAULT)
        raw = self._ranges.read(
            str(options["bootstrap"]), topic, queue, span.start, span.end, isolation_level=isolation, config=config
        )
        if raw is None:
            return None
        return source_table(
            raw,
            spec.fields,
            METADATA_FIELDS,
            fmt=str(options.get("format", "json")),
            encoding=str(options.get("encoding", "utf8")),
        )

    def queue_dir(self, spec: SourceSpec, queue: int) -> Path | None:
        self.check_spec(spec, queue)
        return None

    def resolve_spec(self, spec: SourceSpec, what: str) -> SourceSpec:
        """``spec`` with the topic's partition count read from the brokers, when it gives none.

        Raises:
            SourceError: the brokers did not answer in :data:`PARTITIONS_TIMEOUT_S`, do not have
                the topic, or an ``env:NAME`` setting names a variable that is not set.
        """
        self.check_spec(spec)
        if spec.queues is not None:
            return spec
        options = self._options(spec)
        bootstrap, topic = str(options["bootstrap"]), str(options["topic"])
        try:
            partitions = partition_count(
                bootstrap, topic, timeout_s=PARTITIONS_TIMEOUT_S, config=self._settings(spec, "client_config")
            )
        except (KafkaServerError, SourceError) as e:
            raise SourceError(
                f"{what}: cannot read the partition count of Kafka topic {topic!r} at {bootstrap} to plan one task per "
                f"partition ({e}); start the brokers or create the topic (or give KafkaTopic(partitions=N)), then submit "
                "again"
            ) from e
        logger.info("%s: Kafka topic %r at %s has %d partitions", what, topic, bootstrap, partitions)
        return spec.model_copy(update={"queues": partitions})

    def lag(self, spec: SourceSpec, queue: int, consumed_until_ms: int) -> SourceLag:
        """Records of the partition after the last batch read: the end offset less the position
        of this process's streaming query reading it. ``records`` is None when no such query has
        reported progress yet, when two of them read the partition (another topology on the same
        topic) or when the broker does not answer. ``consumed_until_ms`` does not apply."""
        self.check_spec(spec, queue)
        options = self._options(spec)
        topic = str(options["topic"])
        positions = self._positions().get((topic, queue), [])
        if len(set(positions)) != 1:
            return SourceLag(records=None, files=None)
        try:
            config = self._settings(spec, "client_config")
        except SourceError as e:
            logger.debug("lag of %s-%d not read: %s", topic, queue, e)
            return SourceLag(records=None, files=None)
        marks = self._offsets.watermarks(str(options["bootstrap"]), topic, queue, config=config)
        if marks is None:
            return SourceLag(records=None, files=None)
        return SourceLag(records=max(marks[1] - positions[0], 0), files=None)

    def _positions(self) -> dict[tuple[str, int], list[int]]:
        """(topic, partition) -> end offsets of the last batch of each active Kafka query, read
        from the queries' progress at most every :data:`PROGRESS_TTL_S`."""
        with self._lock:
            now = time.monotonic()
            if now - self._progress_at < PROGRESS_TTL_S:
                return self._progress
            found: dict[tuple[str, int], list[int]] = {}
            for spark in self._sessions:
                try:
                    queries = spark.streams.active
                except Exception as e:  # noqa: BLE001 - a stopped session must not break heartbeats
                    logger.debug("cannot list the streaming queries: %s", e)
                    continue
                for query in queries:
                    try:
                        progress = query.lastProgress
                        data = json.loads(progress.json) if progress is not None else {}
                    except Exception as e:  # noqa: BLE001 - a query stopping meanwhile
                        logger.debug("no progress of query %s: %s", query.name, e)
                        continue
                    for source in data.get("sources", []):
                        if not str(source.get("description", "")).startswith("KafkaV2[Assign["):
                            continue
                        end = source.get("endOffset")
                        if isinstance(end, str):
                            try:
                                end = json.loads(end)
                            except ValueError:
                                continue
                        for topic, partitions in (end or {}).items():
                            for partition, offset in (partitions or {}).items():
                                found.setdefault((str(topic), int(partition)), []).append(int(offset))
            self._progress, self._progress_at = found, now
            return found

    def describe(self, spec: SourceSpec) -> str:
        options = spec.options
        what = "JSON" if options.get("format", "json") == "json" else "raw"
        partitions = "partitions read at submit" if spec.queues is None else f"{spec.queues} partitions"
        return f"reads {what} records of the Kafka topic `{options.get('topic')}` at {options.get('bootstrap')} ({partitions})"

    def identity(self, spec: SourceSpec) -> dict[str, Any]:
        """The bootstrap servers and the topic."""
        return {"kind": spec.kind, "bootstrap": spec.options.get("bootstrap"), "topic": spec.options.get("topic")}

    def asset(self, spec: SourceSpec) -> SourceAsset | None:
        """``kafka/<topic>`` (None without a topic), with the topic and the brokers as metadata."""
        topic = spec.options.get("topic")
        if not topic:
            return None
        bootstrap = spec.options.get("bootstrap")
        return SourceAsset(
            key_parts=("kafka", str(topic)),
            kinds=self.asset_kinds,
            description=(
                f"Kafka topic `{topic}` on `{bootstrap}` ({spec.queues} partitions), read by the stream_ops "
                "topologies downstream (one task per partition)."
            ),
            metadata={
                "stream_ops/kafka_topic": AssetMetadata("text", str(topic)),
                "stream_ops/kafka_bootstrap": AssetMetadata("text", str(bootstrap)),
            },
        )

    def lag_watch(self, spec: SourceSpec) -> PartitionLagWatch:
        """The topic's partitions: end offsets on the brokers less each task's committed ones."""
        config = spec.options.get("client_config")
        if not isinstance(config, Mapping):
            config = {}
        return PartitionLagWatch(
            bootstrap=str(spec.options.get("bootstrap")),
            topic=str(spec.options.get("topic")),
            client_config=tuple(sorted((str(k), str(v)) for k, v in config.items())),
            from_earliest=spec.options.get("starting_offsets", "earliest") == "earliest",
        )


def _source_columns(raw: DataFrame, value_fields: Mapping[str, str], *, fmt: str, encoding: str) -> DataFrame:
    """Spark's Kafka records ``raw`` (streaming, or one batch of them) as the source's columns:
    the values parsed against ``value_fields`` (JSON) or as a string (raw), then the metadata
    fields and, for JSON, :data:`CORRUPT_COLUMN`."""
    from pyspark.sql import functions as F

    def text(column: Column) -> Column:
        return F.base64(column) if encoding == "base64" else column.cast("string")

    headers = F.transform(F.col("headers"), lambda h: F.struct(h["key"].alias("key"), text(h["value"]).alias("value")))
    metadata = [
        text(F.col("key")).alias("kafka_key"),
        F.col("partition").cast("int").alias("kafka_partition"),
        F.col("offset").cast("long").alias("kafka_offset"),
        F.unix_millis(F.col("timestamp")).alias("kafka_timestamp"),
        headers.cast(HEADER_TYPE).alias("kafka_headers"),
    ]
    if fmt == "raw":
        return raw.select(text(F.col("value")).alias(RAW_VALUE_FIELD), *metadata)
    value = F.col("value").cast("string")
    parsed = F.from_json(
        value,
        schema_ddl({**value_fields, CORRUPT_COLUMN: "string"}),
        {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_COLUMN},
    )
    fields = raw.select(parsed.alias("_parsed"), value.alias("_value"), *metadata)
    # A value that is no JSON object at all ('', an array) parses to null, not to a corrupt record.
    corrupt = F.coalesce(
        F.col(f"_parsed.{CORRUPT_COLUMN}"), F.when(F.col("_value").isNotNull() & F.col("_parsed").isNull(), F.col("_value"))
    )
    return fields.select(
        *[F.col("_parsed").getField(name).alias(name) for name in value_fields],
        *[F.col(name) for name in METADATA_FIELDS],
        corrupt.alias(CORRUPT_COLUMN),
    )
