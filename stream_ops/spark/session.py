"""SparkSession factory for workers, tests and benchmarks."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from stream_ops.durable_files import DEFAULT_UMASK
from stream_ops.spark.jvm_classes import jvm_classes_jar, with_jvm_classes
from stream_ops.spark.local_fs import UMASK_KEY, bind_local_fs, checkpoint_umask
from stream_ops.spark.settings import DEFAULT_DRIVER_BATCH_BYTES, DRIVER_BATCH_BYTES_CONF

logger = logging.getLogger(__name__)

DEFAULT_CONF: dict[str, str] = {
    # Micro-batches are small: one reduce task per aggregation and no adaptive re-planning. A
    # source stage's batch (10 files, 5,000 records, partial counts) took 303 ms instead of
    # 368 ms (median of 14, local[2], load ~7; bench/latency.py --spark-conf to compare).
    # Override both for a cluster running large batches.
    "spark.sql.shuffle.partitions": "1",
    "spark.sql.adaptive.enabled": "false",
    # A source batch whose input files total at most this many bytes is collected in one job
    # and its Python operations run on the driver (compute/collect_on_driver.py): 5 lines of a word
    # count took 46 ms instead of 351 ms through mapInArrow and a groupBy, 10,000 lines (350 kB)
    # 158 ms instead of 838 ms (local[2], load ~2-3). Above it the executors work in parallel
    # and the driver's Python thread (shared by every task of the worker) stays free.
    DRIVER_BATCH_BYTES_CONF: str(DEFAULT_DRIVER_BATCH_BYTES),
    # A file-source batch lists its files (Spark's InMemoryFileIndex) when the trigger plans it;
    # above this many paths (32 by default) that listing is a distributed Spark job. For a
    # batch of 50 local files it took 570-880 ms of the trigger's getBatch, listed on the
    # driver 14-51 ms (bench/wordcount.py, local[2]). Lower it for a remote store with slow
    # metadata calls.
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "10000",
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    # Every micro-batch's SQL execution posts its plan's description to the status store, built in
    # this mode whether or not a UI shows it: 'formatted' (Spark's default, per-operator details)
    # took 0.20-0.41 ms a call against 0.13-0.19 ms for 'simple' on a Kafka batch's plan, 0.47 against
    # 0.25 with the source's projection (py4j round trip of ~0.1 ms included; local[2], load ~2.5).
    # Small: bench/kafka.py's CPU at 2,000 sentences/s did not separate it from run-to-run noise.
    "spark.sql.ui.explainMode": "simple",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.streaming.stopGracefullyOnShutdown": "true",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
    # Hadoop chmods every checkpoint file and directory it creates to its default mode less this
    # umask (022 unless set: 0644/0755, readable by every local user, whatever the process umask):
    # 027 gives 0640/0750, as ClusterConfig.umask's default does for stream_ops' own files.
    # create_spark_session sets it from the process umask (spark/local_fs.py, checkpoint_umask).
    f"spark.hadoop.{UMASK_KEY}": f"{DEFAULT_UMASK:03o}",
}


def create_spark_session(
    *,
    master: str = "local[*]",
    app_name: str = "stream-ops",
    conf: Mapping[str, str] | None = None,
    kafka_connector: bool | None = False,
) -> SparkSession:
    """Create (or reuse) the process's SparkSession with stream_ops' defaults.

    ``conf`` overrides the defaults; for a cluster, pass the driver host the executors can
    reach (``spark.driver.host``) since the defaults bind to loopback. ``kafka_connector``
    adds Spark's Kafka connector to ``spark.jars``: True fetches it into the jar cache when
    it is not there (:mod:`stream_ops.kafka.jars`; raises ``KafkaJarsError`` when it cannot),
    None adds it only when the cache has it, False never. It counts only when this call
    starts the JVM.

    Spark's checkpoints get the modes of the process umask (``ClusterConfig.umask``, which
    workers and the CLI apply before they start Spark), at most 0640/0750, unless ``conf``
    sets ``spark.hadoop.fs.permissions.umask-mode``.
    """
    builder = SparkSession.builder.master(master).appName(app_name)
    # Python workers must run the interpreter that has stream_ops and its dependencies; the
    # JVM reads PYSPARK_PYTHON from the environment it is launched with.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    defaults = {
        **DEFAULT_CONF,
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        f"spark.hadoop.{UMASK_KEY}": checkpoint_umask(),
    }
    settings = {**defaults, **dict(conf or {})}
    if kafka_connector is not False:
        from stream_ops.kafka.jars import with_kafka_connector

        settings = with_kafka_connector(settings, fetch=kafka_connector is True)
    # stream_ops' JVM classes (spark/jvm_classes.py): checkpoint writes without a forked chmod
    # per file (18 ms -> ~1 ms per log entry, three per micro-batch and query), and the clock
    # that starts a shuffle stage's batch when its input lands (spark/input_wake.py).
    settings = with_jvm_classes(settings, jvm_classes_jar())
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    bind_local_fs(spark)
    logger.info("SparkSession ready (master %s, Spark %s)", master, spark.version)
    return spark
