"""A shuffle queue read as a Spark stream whose offsets stay small: per upstream task, the
highest txid read (``io.streamops.spark.ShuffleQueueSource``, compiled from ``spark/java/``).

Spark's file source logs every file it ever read and rewrites that whole log every ten batches,
so a long-running shuffle stage would spend more on its log each hour, and no consumed file
could ever be deleted. A shuffle queue needs none of that: its files are named
``t<task>-x<txid>-e<epoch>.<suffix>`` and each upstream task publishes them in txid order (a
batch's files after its commit, its next batch after that). The queue source's offset is
therefore ``{"queueTxids": {task: txid}}``, and batch n's files are those above batch n-1's
offset and at or below batch n's, which Spark logs before it runs the batch. The source yields
no rows: the query's callback reads the batch's files (:func:`batch_files`), and once the
batch after them has been planned (Spark committed the batch that read them) the task deletes
them (:meth:`~stream_ops.topics.file_topic.FileTopic.retire_consumed`).

An upstream batch with no rows for a queue writes no file there, so a task's files in a queue
skip txids, and a file lost in between would leave the same gap. Every txid a batch reads up
to is accounted for: one with a file is read, and every skipped one must be vouched for by the
file after it, which names its task's previous file in the queue (a chained topic, see
:mod:`stream_ops.topics.file_topic`). Any other gap is a lost committed file
(:class:`~stream_ops.errors.CommittedBatchLostError`). The check costs nothing for consecutive
txids and one small read (a JSON line, a Parquet footer) per file after a gap.

A task with time-based windows or triggers writes tick files into its own queue
(:func:`tick_file_name`) so that a batch runs although no data arrives; the offset counts them
as one more task, key ``-1`` (:data:`TICKS`), whose "txid" is the tick's stamp in nanoseconds.

Where the input clock wakes the stage (:mod:`stream_ops.spark.input_wake`), the source also
holds back a batch that would read the files of only some upstream tasks, until the rest of
their round lands or :data:`ROUND_WAIT_CONF` passes: one batch then reads the whole round (a
keyed task that starts while one source task has published and the other is still computing
runs one batch, not two). Only the end offset Spark logs moves, so replays are unchanged.

A checkpoint keeps the source that wrote it: a task started where the JVM classes cannot be
built (no JDK) uses Spark's file source from its start, and its checkpoint, holding file-source
offsets, goes on with the file source.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from stream_ops.errors import CommittedBatchLostError, ShuffleSourceUnavailableError, TopicError
from stream_ops.helpers.spark_ddl import schema_ddl
from stream_ops.spark.checkpoint import batch_offsets
from stream_ops.spark.jvm_classes import loadable
from stream_ops.spark.settings import whole_number_setting
from stream_ops.topics.file_topic import FileTopic, parse_batch_file_name
from stream_ops.topics.shuffle_files import previous_txid
from stream_ops.topology.plan import StageSpec

logger = logging.getLogger(__name__)

QUEUE_SOURCE = "io.streamops.spark.ShuffleQueueSource"
OFFSET_KEY = "queueTxids"
"""The one key of the queue source's offset JSON (Spark logs it under ``offsets/<batch>``)."""
TICKS = -1
"""The offset key of a queue's tick files (task ids are never negative)."""
ROUND_WAIT_CONF = "spark.stream_ops.shuffleRoundWaitMs"
"""Spark setting: how long, in milliseconds, a shuffle stage's batch waits for the rest of a
round of upstream batches when only some upstream tasks have published (0: never waits;
default: one trigger interval). Applies where the input clock wakes the stage
(:data:`~stream_ops.spark.input_wake.SHUFFLE_WAKE_CONF`)."""
_TICK_FILE = re.compile(r"^tick-t\d+-(?P<stamp>\d+)\.jsonl$")


def tick_file_prefix(task_id: int) -> str:
    """What the names of ``task_id``'s tick files start with."""
    return f"tick-t{task_id:05d}-"


def tick_file_name(task_id: int, stamp_ns: int) -> str:
    """The name of a tick file ``task_id`` writes into its own queue, stamped ``stamp_ns``."""
    return f"{tick_file_prefix(task_id)}{stamp_ns}.jsonl"


def next_tick_stamp(checkpoint_dir: Path, now_ns: int) -> int:
    """A stamp for the next tick file: now, or just above the newest tick already planned (a
    task moved to a machine whose clock is behind must not write ticks the offset skips)."""
    planned = planned_txids(checkpoint_dir) or {}
    return max(now_ns, planned.get(TICKS, -1) + 1)


def shuffle_suffix(stage: StageSpec) -> str:
    """The extension of the shuffle files ``stage`` reads: Parquet partials, else JSON lines."""
    return ".parquet" if stage.kind_info.reads == "partials" and stage.shuffle_format == "parquet" else ".jsonl"


def checkpoint_reader(checkpoint_dir: Path) -> str | None:
    """Which source planned the batches of ``checkpoint_dir``: "queue" (this module's),
    "files" (Spark's file source) or None (no batch planned yet)."""
    latest = _latest_planned(checkpoint_dir)
    if latest is None:
        return "files" if _has_entries(checkpoint_dir / "sources" / "0") else None
    return "queue" if offset_txids(checkpoint_dir, latest) is not None else "files"


def planned_txids(checkpoint_dir: Path) -> dict[int, int] | None:
    """Per upstream task, the highest txid the query has planned a batch up to (None: no batch
    planned yet, or not by the queue source)."""
    latest = _latest_planned(checkpoint_dir)
    return offset_txids(checkpoint_dir, latest) if latest is not None else None


def uses_queue_source(spark: SparkSession, checkpoint_dir: Path) -> bool:
    """Whether a shuffle-reading task on ``checkpoint_dir`` reads its queue with the queue source.

    Raises:
        ShuffleSourceUnavailableError: the checkpoint was written by the queue source and this
            JVM cannot load it (the task cannot go on with another source's offsets).
    """
    written_by = checkpoint_reader(checkpoint_dir)
    if written_by == "files":
        return False
    available = loadable(spark, QUEUE_SOURCE)
    if written_by == "queue" and not available:
        raise ShuffleSourceUnavailableError(
            f"checkpoint {checkpoint_dir} was written by stream_ops' shuffle-queue source, which this worker's JVM "
            "cannot load (its classes are built with the JDK's javac at the first start): install a JDK on this "
            "worker, or run the task on a worker that has one"
        )
    if not available:
        logger.warning(
            "stream_ops' shuffle-queue source is not loadable (no JDK to build it): %s reads its shuffle with "
            "Spark's file source, whose log keeps every file read",
            checkpoint_dir,
        )
    return available


def round_wait_ms(spark: SparkSession, trigger_seconds: float) -> int:
    """The session's :data:`ROUND_WAIT_CONF`, or one trigger interval when it is not set.

    Raises:
        ConfigError: the setting is not a whole number of milliseconds.
    """
    millis = whole_number_setting(spark, ROUND_WAIT_CONF, meaning="a number of milliseconds (0 turns the wait off)")
    return max(0, round(trigger_seconds * 1000)) if millis is None else millis


def read_queue_stream(
    spark: SparkSession,
    input_dir: Path,
    fields: Mapping[str, str],
    *,
    suffix: str,
    max_files_per_trigger: int,
    producers: int = 0,
    round_wait_ms: int = 0,
) -> DataFrame:
    """The streaming DataFrame of one shuffle queue (no rows: offsets only, see the module doc).

    With ``producers`` upstream tasks and ``round_wait_ms``, a batch that would read the files
    of only some of them waits for the rest of their round, at most that long (the round wait
    of ``ShuffleQueueSource``).
    """
    return (
        spark.readStream.format(QUEUE_SOURCE)
        .schema(schema_ddl(dict(fields)))
        .options(
            path=str(input_dir),
            suffix=suffix.lstrip("."),
            maxFilesPerTrigger=str(max_files_per_trigger),
            producers=str(producers),
            roundWaitMillis=str(round_wait_ms),
        )
        .load()
    )


def offset_txids(checkpoint_dir: Path, batch_id: int) -> dict[int, int] | None:
    """Per upstream task, the highest txid batch ``batch_id`` reads up to (None: Spark logged no
    queue-source offset for it)."""
    offsets = batch_offsets(checkpoint_dir, batch_id)
    if len(offsets) != 1 or not isinstance(offsets[0], dict) or not isinstance(offsets[0].get(OFFSET_KEY), dict):
        return None
    return {int(task): int(txid) for task, txid in offsets[0][OFFSET_KEY].items()}


def read_before(checkpoint_dir: Path, batch_id: int) -> dict[int, int]:
    """Per upstream task, the highest txid the batches before ``batch_id`` read (empty for batch 0).

    Raises:
        CommittedBatchLostError: Spark's log lacks the previous batch's offset, so the batch's
            files cannot be told from those read before (Spark keeps the last 100 entries).
    """
    if batch_id == 0:
        return {}
    before = offset_txids(checkpoint_dir, batch_id - 1)
    if before is None:
        raise CommittedBatchLostError(
            f"checkpoint {checkpoint_dir}: no offset of batch {batch_id - 1}, so the input of batch {batch_id} is unknown"
        )
    return before


def batch_files(checkpoint_dir: Path, batch_id: int, input_dir: Path, suffix: str) -> list[Path]:
    """The files of batch ``batch_id``, sorted by name: per upstream task, those above the
    previous batch's offset up to this batch's.

    Raises:
        CommittedBatchLostError: Spark logged no queue offset for the batch, the newest file it
            planned of some task is gone, or a txid in between has no file although the file
            after it names it as its task's previous one (deleted or lost: its batch would be
            skipped).
        TopicError: a file names a previous txid at or below one this reader has read after it
            (the queue holds files its upstream task did not write in this order), or a file
            after a skipped txid names no previous file.
    """
    end = offset_txids(checkpoint_dir, batch_id)
    if end is None:
        raise CommittedBatchLostError(f"checkpoint {checkpoint_dir}: no shuffle-queue offset logged for batch {batch_id}")
    start = read_before(checkpoint_dir, batch_id)
    by_task: dict[int, dict[int, Path]] = {}
    for path, task, txid in _queue_files(input_dir, suffix):
        if task in end and start.get(task, -1) < txid <= end[task]:
            by_task.setdefault(task, {})[txid] = path
    missing = [(task, txid) for task, txid in end.items() if txid > start.get(task, -1) and txid not in by_task.get(task, {})]
    if missing:
        raise CommittedBatchLostError(
            f"{input_dir}: batch {batch_id} was planned over the files of (task, txid) {sorted(missing)}, which are gone"
        )
    for task, files in by_task.items():
        if task != TICKS:
            _check_skipped_txids(input_dir, batch_id, task, start.get(task, -1), files)
    return sorted(path for files in by_task.values() for path in files.values())


def _check_skipped_txids(input_dir: Path, batch_id: int, task: int, read: int, files: Mapping[int, Path]) -> None:
    """Check that every txid of ``task`` above ``read`` (the highest read before) that has no
    file among ``files`` (txid -> file) wrote none: the next file must name the one before
    the gap as its previous file; a file after a gap that names none is refused (TopicError):
    nothing could tell its skipped txids from lost files."""
    last = read
    for txid in sorted(files):
        if txid != last + 1:
            previous = previous_txid(files[txid])
            if previous is None:
                raise TopicError(
                    f"{input_dir}: {files[txid].name} follows a gap after upstream task {task}'s txid {last} but names no "
                    "previous file in this queue (every shuffle file this stream_ops writes does), so the skipped txids "
                    "cannot be told from lost files; it was not written by this stream_ops: remove it or restore the queue"
                )
            if previous > last:
                lost = f"t{task:05d}-x{previous:012d}-e*{files[txid].suffix}"
                raise CommittedBatchLostError(
                    f"{input_dir}: batch {batch_id} reads upstream task {task}'s file of txid {txid}, which follows its "
                    f"file of txid {previous} in this queue, but that file ({lost}) is gone: the committed batch was lost "
                    "(deleted, or an OS crash on storage that did not honour fsync) and its rows would be skipped. The "
                    "task stops; restore the file from a backup, or accept the loss by re-running the topology"
                )
            if previous < last:
                raise TopicError(
                    f"{input_dir}: {files[txid].name} names txid {previous} as its task's previous file in this queue, "
                    f"but this reader read its file of txid {last} before it: the queue holds files its upstream task "
                    "did not write in this order (copied in by hand?); remove the stray file or restore the queue"
                )
        last = txid


def unread_files(input_dir: Path, read: Mapping[int, int], suffix: str) -> list[Path]:
    """Files of the queue above ``read`` (per upstream task the highest txid read)."""
    return sorted(path for path, task, txid in _queue_files(input_dir, suffix) if txid > read.get(task, -1))


def _queue_files(input_dir: Path, suffix: str) -> list[tuple[Path, int, int]]:
    try:
        entries = list(input_dir.iterdir())
    except FileNotFoundError:
        return []
    return [entry for entry in _queue_files_of(entries) if entry[0].suffix == suffix]


def _queue_files_of(paths: list[Path]) -> list[tuple[Path, int, int]]:
    """(path, task, txid) of the batch files and tick files (task :data:`TICKS`) among ``paths``."""
    found = []
    for path in paths:
        parsed = parse_batch_file_name(path.name)
        if parsed is not None:
            found.append((path, parsed.task_id, parsed.txid))
            continue
        tick = _TICK_FILE.match(path.name)
        if tick is not None:
            found.append((path, TICKS, int(tick["stamp"])))
    return found


def retire_read(topic: FileTopic, queue: int, read: Mapping[int, int], *, epoch: int | None = None) -> int:
    """Delete what committed batches read up to ``read`` (an offset): upstream batch files
    through :meth:`FileTopic.retire_consumed` (recorded first), tick files at or below their
    stamp (only this task writes them, and a planned one was read by a committed batch whoever
    deletes it). Given the reading task's owner ``epoch``, a previous owner's call records and
    deletes no upstream file once a newer owner has recorded. Returns the files deleted."""
    removed = topic.retire_consumed(queue, {task: txid for task, txid in read.items() if task != TICKS}, epoch=epoch)
    upto = read.get(TICKS)
    if upto is not None:
        for path, task, stamp in _queue_files(topic.queue_path(queue), ".jsonl"):
            if task == TICKS and stamp <= upto:
                path.unlink(missing_ok=True)
                removed += 1
    return removed


def _latest_planned(checkpoint_dir: Path) -> int | None:
    try:
        planned = [int(p.name) for p in (checkpoint_dir / "offsets").iterdir() if p.name.isdigit()]
    except OSError:
        return None
    return max(planned, default=None)


def _has_entries(directory: Path) -> bool:
    try:
        return any(not p.name.startswith(".") for p in directory.iterdir())
    except OSError:
        return False
