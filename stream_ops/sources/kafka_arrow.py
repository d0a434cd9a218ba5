"""A Kafka source batch read on the driver, as the columns the Kafka source's query gives.

:meth:`KafkaKind.read_stream <stream_ops.sources.kafka_source.KafkaKind.read_stream>` turns
the rows of Spark's Kafka source (key, value, topic, partition, offset, timestamp,
timestampType, headers) into the source's fields with Spark SQL. :func:`source_table` does the
same to those rows read on the driver (:mod:`stream_ops.kafka.range_reader`), in Arrow, and
answers None ("let Spark read this batch") wherever it cannot prove Spark's answer:

* ``encoding="utf8"``: Spark's ``cast(binary as string)`` keeps bytes that are not UTF-8 as
  they are; a key, raw value or header value that is not UTF-8 is left to Spark.
* ``encoding="base64"``: Spark's ``base64`` (Java's encoder, padded; chunked into 76-character
  lines when ``spark.sql.chunkBase64String.enabled``): a value of more than 57 bytes, whose text
  could be chunked, is left to Spark.
* ``format="json"``: the values are parsed by the Arrow JSON reader's guards
  (:func:`~stream_ops.sources.arrow_json.read_json_bytes`), one value per line: a value holding
  a line break, one that is not exactly one JSON object or that Spark's PERMISSIVE parse would
  mark corrupt or coerce is left to Spark, so the table never has a corrupt record (and no
  :data:`~stream_ops.sources.base.CORRUPT_COLUMN`). A record without a value has every field
  null, as ``from_json(null)`` gives.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Mapping

import numpy as np
import pyarrow as pa

from stream_ops.arrow_types import ARROW_TYPES
from stream_ops.sources.arrow_json import read_json_bytes

logger = logging.getLogger(__name__)

HEADERS_ARROW_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.string())]))
"""The Arrow type of ``kafka_headers`` (``array<struct<key:string,value:string>>``)."""
BASE64_UNCHUNKED_BYTES = 57
"""The most bytes whose base64 text (76 characters) no encoder setting of Spark's splits."""


def source_table(
    raw: pa.Table, fields: Mapping[str, str], metadata: Mapping[str, str], *, fmt: str, encoding: str
) -> pa.Table | None:
    """The source's columns (``fields``: the value's fields then ``metadata``, the ``kafka_*``
    ones) of the Kafka rows ``raw``, or None when Spark must build them (see the module doc)."""
    key = _text(raw.column("key").combine_chunks(), encoding)
    header_values = _headers(raw.column("headers").combine_chunks(), encoding)
    if key is None or header_values is None:
        return None
    value_fields = {name: typ for name, typ in fields.items() if name not in metadata}
    values = raw.column("value").combine_chunks()
    if fmt == "raw":
        text = _text(values, encoding)
        if text is None:
            return None
        value_columns = {name: text for name in value_fields}
    else:
        parsed = _parsed(values, value_fields)
        if parsed is None:
            return None
        value_columns = {name: parsed.column(name).combine_chunks() for name in value_fields}
    stamps = raw.column("timestamp").combine_chunks().cast(pa.int64())  # microseconds
    columns: dict[str, pa.Array] = {
        **value_columns,
        "kafka_key": key,
        "kafka_partition": raw.column("partition").combine_chunks(),
        "kafka_offset": raw.column("offset").combine_chunks(),
        "kafka_timestamp": _millis(stamps),
        "kafka_headers": header_values,
    }
    if set(columns) != set(fields):
        logger.warning("Kafka columns %s are not the source's fields %s", sorted(columns), sorted(fields))
        return None
    schema = pa.schema(
        [(name, HEADERS_ARROW_TYPE if name == "kafka_headers" else ARROW_TYPES[typ]) for name, typ in fields.items()]
    )
    return pa.Table.from_arrays([columns[name] for name in fields], schema=schema)


def _millis(micros: pa.Array) -> pa.Array:
    """Epoch microseconds as milliseconds, rounded down as Spark's ``unix_millis`` (``floorDiv``)."""
    values = np.floor_divide(micros.fill_null(0).to_numpy(), 1000)
    mask = micros.is_null().to_numpy(zero_copy_only=False) if micros.null_count else None
    return pa.array(values, pa.int64(), mask=mask)


def _text(column: pa.Array, encoding: str) -> pa.Array | None:
    """Binary ``column`` as Spark's ``text`` gives it (``cast(... as string)`` or ``base64``), or None."""
    if encoding == "base64":
        items = column.to_pylist()
        if any(item is not None and len(item) > BASE64_UNCHUNKED_BYTES for item in items):
            logger.debug("a Kafka batch is left to Spark: a value of more than %d bytes in base64", BASE64_UNCHUNKED_BYTES)
            return None
        return pa.array([None if item is None else base64.b64encode(item).decode("ascii") for item in items], pa.string())
    try:
        return column.cast(pa.string())  # validates UTF-8
    except pa.ArrowInvalid:
        logger.debug("a Kafka batch is left to Spark: bytes that are not UTF-8")
        return None


def _headers(column: pa.Array, encoding: str) -> pa.Array | None:
    """The headers (``list<struct<key, value binary>>``) with their values as text, or None."""
    entries = column.values  # every list's structs, as the offsets index them
    values = _text(entries.field("value"), encoding)
    if values is None:
        return None
    structs = pa.StructArray.from_arrays([entries.field("key"), values], names=["key", "value"])
    return pa.ListArray.from_arrays(column.offsets, structs, type=HEADERS_ARROW_TYPE, mask=column.is_null())


def _parsed(values: pa.Array, fields: Mapping[str, str]) -> pa.Table | None:
    """The JSON ``values`` (one object each) parsed against ``fields``, null fields for a null
    value, or None when Spark must parse them."""
    present = values.drop_null() if values.null_count else values
    data = _lines(present)
    if data is None:
        logger.debug("a Kafka batch is left to Spark: a JSON value holding a line break")
        return None
    parsed = read_json_bytes(data, fields)
    if parsed is None or parsed.num_rows != len(present):
        return None  # read_json_bytes logged why; an empty value is a line it skips
    if not values.null_count:
        return parsed
    valid = values.is_valid().to_numpy(zero_copy_only=False)
    rows = np.cumsum(valid) - 1  # the parsed row of each present value
    return parsed.take(pa.array(rows, pa.int64(), mask=~valid))


def _lines(values: pa.Array) -> bytes | None:
    """The binary ``values`` (no nulls) joined by line breaks, None when one holds a line break."""
    if len(values) == 0:
        return b""
    array = values.cast(pa.binary()) if values.type != pa.binary() else values
    offsets = np.frombuffer(array.buffers()[1], np.int32)[array.offset : array.offset + len(array) + 1]
    body = np.frombuffer(array.buffers()[2], np.uint8)[offsets[0] : offsets[-1]]
    if np.count_nonzero(body == 0x0A):
        return None
    return np.insert(body, offsets[1:-1] - offsets[0], 0x0A).tobytes()
