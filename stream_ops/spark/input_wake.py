"""Start a shuffle stage's next batch when its input lands, not at the next trigger.

A query with a processing-time trigger of ``t`` seconds waits, after each trigger, until the
next multiple of ``t`` on the wall clock. For a stage that reads a shuffle this wait comes
after every upstream commit: its batch starts 0 to ``t`` seconds after the upstream tasks
published it (the latency benchmark's "wait for the keyed batch"). A shorter trigger shortens
that wait but lists the input directory more often, and an idle listing costs 3-8 ms of JVM
CPU (Spark's file source builds a Hadoop configuration and a file index each time).

:class:`io.streamops.spark.InputWakeClock` (``spark/java/``) replaces the clock of such a
query's trigger: it checks the input directory's modification time every few milliseconds (one
``stat``) and ends the wait as soon as a round of upstream batches has landed: every upstream
task has published a newer batch file than at the last round, and one of them is not yet read.
A round of upstream batches so becomes one batch of the stage at once, and a timed trigger that
read half a round is followed by the other half as soon as it lands. An upstream task that
publishes nothing for a queue leaves that queue's query on its trigger, as before. Spark's file
source still lists and logs each batch's files, so what a batch reads and how it replays do not
change. Spark gives no way to pass a clock to ``DataStreamWriter.start()``: the clock is set by
reflection into the started query's trigger executor, and when that fails (another Spark, no
JDK to build the class) the query keeps its trigger, with a logged line.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from py4j.protocol import Py4JError
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from stream_ops.errors import ConfigError
from stream_ops.spark.jvm_classes import jvm_class

logger = logging.getLogger(__name__)

SHUFFLE_WAKE_CONF = "spark.stream_ops.shuffleWake"
"""Spark setting: ``true`` (the default) starts a shuffle stage's batch as soon as every
upstream task published a newer batch; ``false`` leaves it to the processing-time trigger."""

WAKE_CLASS = "io.streamops.spark.InputWakeClock"
POLL_MS = 10
"""How often the input directory's modification time is checked while a query waits."""
_INSTALL_TIMEOUT_MS = 5000


def shuffle_wake_setting(spark: SparkSession) -> bool:
    """The session's :data:`SHUFFLE_WAKE_CONF`.

    Raises:
        ConfigError: the value is not ``true`` or ``false``.
    """
    value = str(spark.conf.get(SHUFFLE_WAKE_CONF, "true")).strip().lower()
    if value not in ("true", "false"):
        raise ConfigError(f"{SHUFFLE_WAKE_CONF} must be true or false, got {value!r}")
    return value == "true"


def wake_on_input(spark: SparkSession, query: StreamingQuery, input_dir: Path, producers: int) -> threading.Thread | None:
    """Make ``query`` start its next batch once each of ``producers`` upstream tasks has
    published a newer batch file into ``input_dir`` (see the module text).

    The query's trigger executor appears once its thread has planned its sources, which on a
    busy driver takes 50-200 ms after ``start()`` returns: the clock is set from a daemon thread
    (returned; None when the class is not on the driver's class path), so starting the
    worker's other tasks does not wait for it. Its first wait comes after its first batch.
    """
    wake_clock = jvm_class(spark, WAKE_CLASS)
    if wake_clock is None:
        logger.info("%s is not on the driver's class path: query %s waits for its trigger", WAKE_CLASS, query.name)
        return None
    clock = wake_clock(str(input_dir), producers, POLL_MS)

    def install() -> None:
        try:
            installed = wake_clock.install(query._jsq, clock, _INSTALL_TIMEOUT_MS)
        except Py4JError as e:  # the gateway closed under a stopping worker
            logger.info("query %s: input clock not set (%s)", query.name, e)
            return
        if not installed:
            logger.warning(
                "could not set the input clock of query %s (Spark's trigger classes differ): it waits for its trigger", query.name
            )

    thread = threading.Thread(target=install, name=f"input-wake-{query.name}", daemon=True)
    thread.start()
    return thread
