"""Spark's checkpoint writes on the local file system without a forked ``chmod``.

Without Hadoop's native library (pyspark ships none), ``RawLocalFileSystem.setPermission``
runs the ``chmod`` command for every file it creates, and a streaming query creates three
checkpoint files per micro-batch (source log, offsets, commits): 15-18 ms each where the write
and rename take well under a millisecond (``CheckpointFileManager.createAtomic`` measured
18 ms, a java.nio write and move 3 ms through py4j, 2-core machine). With four queries per
worker that is the largest fixed cost of a small batch.

The fix is two small Java classes shipped as sources (``spark/java/``): Hadoop's local file
system with ``setPermission`` through java.nio, and its FileContext binding, which Spark's
checkpoint file manager uses. They are built into the jar of stream_ops' JVM classes
(:mod:`stream_ops.spark.jvm_classes`), put on the driver's class path when this process starts
the JVM, and bound to ``file:`` for FileContext only (``fs.AbstractFileSystem.file.impl``, the
driver's checkpoint writes). Executors read and write files through Hadoop's FileSystem, not
FileContext, so a cluster's executors need no jar; only Spark's own state stores (stateful
Spark operators, which stream_ops does not use) write through FileContext on executors, and
would need the jar there. Without a JDK, or when the JVM was started elsewhere, Hadoop's
``RawLocalFs`` is bound instead (no ``.crc`` files: one file per entry, not two).
"""

from __future__ import annotations

import logging

from pyspark.sql import SparkSession

from stream_ops.spark.jvm_classes import loadable

logger = logging.getLogger(__name__)

LOCAL_FS_CLASS = "io.streamops.hadoop.NioLocalFs"
"""The FileContext file system bound to ``file:`` when its jar is on the driver's class path."""
FALLBACK_CLASS = "org.apache.hadoop.fs.local.RawLocalFs"
"""Hadoop's own binding without checksum files, used otherwise."""
BINDING_KEY = "fs.AbstractFileSystem.file.impl"
"""The Hadoop setting naming the FileContext implementation of ``file:``."""


def bind_local_fs(spark: SparkSession) -> str:
    """Bind ``file:`` for FileContext in the driver's Hadoop configuration to the java.nio
    file system when the JVM can load it, else to Hadoop's ``RawLocalFs``; returns the class.

    A binding the session was configured with (``spark.hadoop.fs.AbstractFileSystem.file.impl``)
    is left as it is.
    """
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    if spark.sparkContext.getConf().contains(f"spark.hadoop.{BINDING_KEY}"):
        return str(conf.get(BINDING_KEY))
    chosen = LOCAL_FS_CLASS if loadable(spark, LOCAL_FS_CLASS) else FALLBACK_CLASS
    conf.set(BINDING_KEY, chosen)
    logger.info("checkpoint writes through %s", chosen)
    return chosen
