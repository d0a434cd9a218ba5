"""The Arrow type of each scalar Spark type name a stream's fields may have."""

from __future__ import annotations

import pyarrow as pa

ARROW_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "long": pa.int64(),
    "int": pa.int32(),
    "double": pa.float64(),
    "float": pa.float32(),
    "boolean": pa.bool_(),
}
