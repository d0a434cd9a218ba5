"""Spark's checkpoint writes on the local file system: without a forked ``chmod``, with the cluster's modes.

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

Modes. Hadoop's file systems set the mode of every file and directory they create with an
explicit ``setPermission`` (a ``chmod``, not subject to the process umask): the default mode
(0666, 0777) less Hadoop's own umask, ``fs.permissions.umask-mode`` (default 022), so a
checkpoint came out 0644/0755 whatever the process umask. FileContext (the driver's checkpoint
writes) reads the setting from the Hadoop configuration each time a file manager is made, and
FileSystem (cached per scheme, with the configuration it was first made with) from the
session's start. :func:`checkpoint_umask` is what stream_ops sets it to: the process umask
(``ClusterConfig.umask``, which every stream_ops process applies first) with at least
``durable_files.DEFAULT_UMASK``, so checkpoints are 0640/0750 like the files stream_ops
writes itself.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from pyspark.sql import SparkSession

from stream_ops.durable_files import DEFAULT_UMASK
from stream_ops.spark.jvm_classes import loadable

logger = logging.getLogger(__name__)

LOCAL_FS_CLASS = "io.streamops.hadoop.NioLocalFs"
"""The FileContext file system bound to ``file:`` when its jar is on the driver's class path."""
FALLBACK_CLASS = "org.apache.hadoop.fs.local.RawLocalFs"
"""Hadoop's own binding without checksum files, used otherwise."""
BINDING_KEY = "fs.AbstractFileSystem.file.impl"
"""The Hadoop setting naming the FileContext implementation of ``file:``."""
UMASK_KEY = "fs.permissions.umask-mode"
"""The Hadoop setting of the umask its file systems apply to the modes they set."""


def bind_local_fs(spark: SparkSession) -> str:
    """Bind ``file:`` for FileContext in the driver's Hadoop configuration to the java.nio
    file system when the JVM can load it, else to Hadoop's ``RawLocalFs``; returns the class.

    Also sets Hadoop's umask there to :func:`checkpoint_umask` unless the session was
    configured with one (``spark.hadoop.fs.permissions.umask-mode``, as
    :func:`~stream_ops.spark.session.create_spark_session` and ``DEFAULT_CONF`` do): checkpoint
    files and directories of a session started elsewhere then get the cluster's modes too.

    A binding the session was configured with (``spark.hadoop.fs.AbstractFileSystem.file.impl``)
    is left as it is.
    """
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    spark_conf = spark.sparkContext.getConf()
    if not spark_conf.contains(f"spark.hadoop.{UMASK_KEY}"):
        conf.set(UMASK_KEY, checkpoint_umask())
    if spark_conf.contains(f"spark.hadoop.{BINDING_KEY}"):
        return str(conf.get(BINDING_KEY))
    chosen = LOCAL_FS_CLASS if loadable(spark, LOCAL_FS_CLASS) else FALLBACK_CLASS
    conf.set(BINDING_KEY, chosen)
    logger.info("checkpoint writes through %s", chosen)
    return chosen


def checkpoint_umask(umask: int | None = None) -> str:
    """Hadoop's umask for checkpoint files, as ``fs.permissions.umask-mode`` takes it (octal).

    Args:
        umask: the umask of the cluster's processes; this process's by default (every
            stream_ops process applies ``ClusterConfig.umask`` before it starts Spark).

    Returns:
        ``umask`` with at least the bits of ``DEFAULT_UMASK`` (0o027): checkpoint files are at
        most 0640 and directories 0750, as the files stream_ops writes itself.

    Example:
        >>> checkpoint_umask(0o022), checkpoint_umask(0o077)
        ('027', '077')
    """
    bits = (process_umask() if umask is None else umask) | DEFAULT_UMASK
    return f"{bits & 0o777:03o}"


def process_umask() -> int:
    """This process's umask, read from ``/proc/self/status`` where Linux shows it; elsewhere set
    to 0o077 and back (files other threads create in that moment only get stricter modes)."""
    try:
        for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    current = os.umask(0o077)
    os.umask(current)
    return current
