"""stream_ops' own Spark settings (``spark.stream_ops.*``), read with errors that say what to set."""

from __future__ import annotations

from pyspark.sql import SparkSession

from stream_ops.errors import ConfigError

DRIVER_BATCH_BYTES_CONF = "spark.stream_ops.driverBatchBytes"
"""Spark setting: the largest total input size (bytes) of a source batch computed on the
driver; 0 turns the driver path off."""
DEFAULT_DRIVER_BATCH_BYTES = 1 << 20
"""Its value when the session does not set it (see ``spark/session.py`` for the measurement)."""


def whole_number_setting(spark: SparkSession, name: str, *, meaning: str) -> int | None:
    """The session's setting ``name`` as a whole number of at least 0, None when it is not set.

    Raises:
        ConfigError: the setting is not such a number; the message asks for ``meaning``
            (e.g. "a number of milliseconds (0 turns the wait off)").
    """
    value = spark.conf.get(name, None)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise ConfigError(f"{name} is {value!r}; set it to {meaning}")
    return number
