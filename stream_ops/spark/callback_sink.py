"""Micro-batches handed to a task's callback unplanned (``io.streamops.spark.CallbackSink``).

Spark's ``foreachBatch`` sink plans each micro-batch's RDD before its function runs: it
builds the physical plan's RDD and code-generates the scan, 20-50 ms a batch on two cores.
A task often never runs that plan: a source batch read and computed in Arrow from its files,
or a shuffle batch read by the queue source (which yields no rows) whose files the callback
reads itself. So a task's query writes to stream_ops' :data:`SINK`, which calls the callback
with the batch as a :class:`BatchFrame`: a DataFrame whose Spark plan is made, exactly as
``foreachBatch`` makes it, the first time an operation uses it.

A query may read a bare relation (a Kafka source's raw records) and give a ``shape``: the
projection that turns a batch of it into what the callback expects (the source's columns). It
is applied to the batch when Spark plans it, so Spark's planning of every micro-batch (analysis,
optimisation, physical planning and the plan description each batch's execution posts) works
on the relation alone: a Kafka source batch read on the driver is never planned with its
``from_json`` and metadata columns.

Without stream_ops' JVM classes (no JDK to build them) the query uses ``foreachBatch``; the
callback sees the same DataFrame either way. The sink keeps nothing in the checkpoint, so a
task may move between the two.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeAlias

from pyspark import SparkContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from stream_ops.spark.jvm_classes import jvm_class

logger = logging.getLogger(__name__)

SINK = "io.streamops.spark.CallbackSink"
_BATCH_FUNCTION = "org.apache.spark.sql.execution.streaming.sources.PythonForeachBatchFunction"
_IDS = itertools.count()
_IDS_LOCK = threading.Lock()
_FALLBACK_LOGGED = threading.Event()

BatchShape: TypeAlias = Callable[[DataFrame], DataFrame]
"""The projection a query's callback sees its batches through (applied when Spark plans one)."""


class _Context:
    """What ``DataFrame.__init__`` reads of its session (the SparkContext) while the batch's
    session is not made yet."""

    def __init__(self, sc: SparkContext) -> None:
        self._sc = sc


class BatchFrame(ClassicDataFrame):
    """A micro-batch as the DataFrame ``foreachBatch`` would give, planned on first use.

    PySpark's DataFrame reaches its JVM Dataset through ``_jdf`` only; here that is the batch
    Dataset Spark's own ``foreachBatch`` sink builds, made when first asked for. Its session
    (``sparkSession``: the batch's own, as ``foreachBatch`` gives it) is likewise made when
    first used: a PySpark session over the batch's JVM session costs 5-7 calls into the JVM,
    which a batch whose files the callback reads itself never needs. With a ``shape``, the
    batch is ``shape`` of that Dataset (the query read a bare relation).
    """

    def __init__(self, streaming: Any, batch_id: int, sc: SparkContext, shape: BatchShape | None = None) -> None:
        self._streaming = streaming
        self._batch_id = batch_id
        self._shape = shape
        self._planned: Any = None
        self._made_session: SparkSession | None = None
        super().__init__(streaming, _Context(sc))  # type: ignore[arg-type]

    @property
    def _jdf(self) -> Any:
        if self._planned is None:
            batch = jvm_class(self._session, SINK).asBatch(self._streaming, self._batch_id)
            if self._shape is not None:
                batch = self._shape(ClassicDataFrame(batch, self._session))._jdf
            self._planned = batch
        return self._planned

    @_jdf.setter
    def _jdf(self, streaming: Any) -> None:
        self._streaming, self._planned = streaming, None

    @property
    def _session(self) -> SparkSession:
        if self._made_session is None:
            # Spark runs each batch in a clone of the query's session
            self._made_session = SparkSession(self._sc, self._streaming.sparkSession())
        return self._made_session

    @_session.setter
    def _session(self, session: SparkSession | _Context) -> None:
        self._made_session = session if isinstance(session, SparkSession) else None

    @property
    def planned(self) -> bool:
        """Whether Spark planned the batch (an operation used the DataFrame)."""
        return self._planned is not None

    @property
    def session_made(self) -> bool:
        """Whether the batch's PySpark session was made (something used it)."""
        return self._made_session is not None


class _Callback:
    """The py4j proxy the sink calls: Spark's ``PythonForeachBatchFunction`` interface."""

    def __init__(self, session: SparkSession, on_batch: Callable[[DataFrame, int], None], shape: BatchShape | None) -> None:
        self.session = session
        self.on_batch = on_batch
        self.shape = shape

    def call(self, streaming: Any, batch_id: int) -> None:
        self.on_batch(BatchFrame(streaming, int(batch_id), self.session.sparkContext, self.shape), int(batch_id))

    class Java:
        implements = [_BATCH_FUNCTION]


def start_with_callback(
    spark: SparkSession,
    writer: DataStreamWriter,
    on_batch: Callable[[DataFrame, int], None],
    *,
    shape: BatchShape | None = None,
) -> StreamingQuery:
    """Start the query of ``writer`` with ``on_batch(df, batch_id)`` run per micro-batch: through
    :data:`SINK` when this JVM has it, else through ``foreachBatch``. With ``shape``, ``df`` is
    ``shape`` of the batch ``writer``'s query read (made when Spark plans the batch)."""
    sink = jvm_class(spark, SINK)
    if sink is None:
        if not _FALLBACK_LOGGED.is_set():
            _FALLBACK_LOGGED.set()
            logger.info("%s is not on the driver's class path (no JDK): tasks take their batches through foreachBatch", SINK)
        if shape is not None:
            shaped, on_raw = shape, on_batch
            return writer.foreachBatch(lambda df, batch_id: on_raw(shaped(df), batch_id)).start()
        return writer.foreachBatch(on_batch).start()
    from pyspark.java_gateway import ensure_callback_server_started

    gateway = spark.sparkContext._gateway
    assert gateway is not None
    ensure_callback_server_started(gateway)
    with _IDS_LOCK:
        callback_id = f"{spark.sparkContext.applicationId}-{next(_IDS)}"
    sink.register(callback_id, _Callback(spark, on_batch, shape))
    try:
        return writer.format(SINK).option("callback", callback_id).start()
    finally:
        sink.unregister(callback_id)  # the sink took it when the query started
