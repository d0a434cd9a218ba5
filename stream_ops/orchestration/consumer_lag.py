"""Consumer lag of the Kafka source assets: what it is, its observation and its check (pure).

For a Kafka topic a topology reads (its source asset ``stream_ops/kafka/<topic>``), the lag of
partition ``p`` is the partition's end offset on the broker (the offset the next record gets)
less the end offset committed in ZooKeeper for ``p``: the ``offsets`` the source task reading
``p`` recorded with its committed txid (``TransactionalRecord.offsets``,
``[{"<topic>": {"<p>": end}}]``). A replay re-reads exactly that range, so this is the number of
records of ``p`` no committed batch covers yet. Before a task's first commit its lag is the
partition's retained records when the source starts at ``earliest``, unknown otherwise.

**Several topologies reading one topic** share its source asset (the key names the topic, not
the topology), so each heartbeat tick records **one merged observation** per source asset:
``lag_p<partition>`` is the largest lag of any reading topology on that partition (the slowest
consumer, what retention must cover), ``lag_records`` their sum; the ``offsets`` table and
``topology_lag`` give every topology's own numbers. One series per key keeps Dagster's plot
of ``lag_records`` a single line; per-topology observations would interleave into a zigzag. The
``consumer_lag`` check judges each ACTIVE topology on its own total against its own threshold
(:data:`DEFAULT_CONSUMER_LAG_THRESHOLD` unless configured) and fails, severity WARN, when one is
at or over it, or when the end offsets could not be read.

Nothing here does I/O: :mod:`stream_ops.orchestration.kafka_offsets` reads the brokers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import dagster as dg

from stream_ops.nimbus.status import TaskStatus
from stream_ops.orchestration.checks import CheckOutcome
from stream_ops.orchestration.translator import StreamOpsTranslator
from stream_ops.sources import source_kind
from stream_ops.topology.plan import Plan

__all__ = [
    "CONSUMER_LAG",
    "DEFAULT_CONSUMER_LAG_THRESHOLD",
    "KafkaSourceWatch",
    "PartitionLag",
    "TopologyLag",
    "committed_offset",
    "consumer_lag_events",
    "consumer_lag_check_spec",
    "evaluate_consumer_lag",
    "kafka_source_watches",
    "lag_observation",
    "partition_lags",
]

#: Name of the check on a Kafka source asset that its readers keep up.
CONSUMER_LAG = "consumer_lag"
#: Records a topology may be behind on a topic (all partitions) before the check fails.
DEFAULT_CONSUMER_LAG_THRESHOLD = 10_000


@dataclass(frozen=True)
class KafkaSourceWatch:
    """A Kafka topic one topology's source stage reads, as the heartbeat sensor watches it.

    Attributes:
        asset_key: The topic's source asset.
        topology_name: The reading topology.
        stage_name: Its source stage (task on queue ``p`` reads partition ``p``).
        bootstrap: The brokers.
        topic: The topic.
        partitions: Partitions read (the stage's queues).
        client_config: librdkafka settings for reading offsets, ``env:NAME`` values unresolved
            (they are read in the process that reads, and never shown).
        from_earliest: The source starts at ``earliest`` (so a partition without a commit lags
            by all its retained records).
        threshold: The ``consumer_lag`` check fails at this many records behind (all partitions).
    """

    asset_key: dg.AssetKey
    topology_name: str
    stage_name: str
    bootstrap: str
    topic: str
    partitions: int
    client_config: tuple[tuple[str, str], ...] = ()
    from_earliest: bool = True
    threshold: int = DEFAULT_CONSUMER_LAG_THRESHOLD


def kafka_source_watches(
    plan: Plan, translator: StreamOpsTranslator, *, threshold: int = DEFAULT_CONSUMER_LAG_THRESHOLD
) -> list[KafkaSourceWatch]:
    """One watch per source stage of ``plan`` whose kind has a
    :meth:`~stream_ops.sources.SourceKind.lag_watch` (a Kafka topic) and that has a source asset,
    in stage order.

    Raises:
        ValueError: ``threshold`` is below 1.
    """
    if threshold < 1:
        raise ValueError(f"consumer_lag_threshold must be at least 1 record, got {threshold}")
    watches: list[KafkaSourceWatch] = []
    for stage in plan.stages:
        source = stage.source
        if source is None:
            continue
        watch = source_kind(source.kind).lag_watch(source)
        key = translator.source_asset_key(plan.topology, source) if watch is not None else None
        if watch is None or key is None:
            continue
        watches.append(
            KafkaSourceWatch(
                asset_key=key,
                topology_name=plan.topology,
                stage_name=stage.name,
                bootstrap=watch.bootstrap,
                topic=watch.topic,
                partitions=source.known_queues(),
                client_config=watch.client_config,
                from_earliest=watch.from_earliest,
                threshold=threshold,
            )
        )
    return watches


def committed_offset(offsets: Sequence[Any], topic: str, partition: int) -> int | None:
    """The end offset of ``topic``/``partition`` in a committed txid's recorded offsets (pure).

    Example:
        >>> committed_offset([{"words": {"1": 42}}], "words", 1), committed_offset([{"logOffset": 3}], "words", 1)
        (42, None)
    """
    for entry in offsets:
        if not isinstance(entry, Mapping):
            continue
        found = entry.get(topic)
        if isinstance(found, Mapping):
            value = found.get(str(partition))
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None


@dataclass(frozen=True)
class PartitionLag:
    """One partition of one reading topology.

    Attributes:
        partition: The partition.
        committed: The committed end offset (None before the task's first commit).
        end: The broker's end offset (None when not read).
        lag: ``end - committed`` (never negative); None when unknown.
    """

    partition: int
    committed: int | None
    end: int | None
    lag: int | None


def partition_lags(
    watch: KafkaSourceWatch, tasks: Sequence[TaskStatus], marks: Mapping[int, tuple[int, int]] | None
) -> tuple[PartitionLag, ...]:
    """Every partition's lag for one topology (pure).

    Args:
        watch: The topic and the source stage reading it.
        tasks: The topology's tasks (those of ``watch.stage_name`` are used, by queue).
        marks: Partition -> (low, high) offsets on the broker; None: not read.

    Example:
        >>> w = KafkaSourceWatch(dg.AssetKey("t"), "wc", "words", "k:9092", "words", 1)
        >>> partition_lags(w, [], {0: (0, 7)})
        (PartitionLag(partition=0, committed=None, end=7, lag=None),)
    """
    by_queue = {t.queue: t for t in tasks if t.stage_name == watch.stage_name}
    found: list[PartitionLag] = []
    for partition in range(watch.partitions):
        task = by_queue.get(partition)
        committed = committed_offset(task.committed_offsets, watch.topic, partition) if task is not None else None
        low_high = marks.get(partition) if marks is not None else None
        lag: int | None = None
        if low_high is not None:
            low, high = low_high
            if committed is not None:
                lag = max(0, high - committed)
            elif task is not None and watch.from_earliest:
                lag = max(0, high - low)
        found.append(PartitionLag(partition, committed, None if low_high is None else low_high[1], lag))
    return tuple(found)


@dataclass(frozen=True)
class TopologyLag:
    """One topology's lag on one topic, as read in one tick.

    Attributes:
        watch: What it reads.
        topology_id: Its live submission.
        status: Its status (only ACTIVE topologies are judged by the check).
        partitions: Per partition, in partition order (lags None when ``error``).
        error: Why the end offsets are not known (the broker did not answer, ...), else None.
    """

    watch: KafkaSourceWatch
    topology_id: str
    status: str
    partitions: tuple[PartitionLag, ...]
    error: str | None = None

    @property
    def total(self) -> int | None:
        """Records behind over all partitions whose lag is known; None when none is."""
        known = [p.lag for p in self.partitions if p.lag is not None]
        return sum(known) if known else None

    def lagging(self) -> list[PartitionLag]:
        """The partitions with records to read, most behind first."""
        return sorted((p for p in self.partitions if p.lag), key=lambda p: (-(p.lag or 0), p.partition))


def consumer_lag_check_spec(asset_key: dg.AssetKey) -> dg.AssetCheckSpec:
    """The ``consumer_lag`` check spec of a Kafka source asset."""
    return dg.AssetCheckSpec(
        name=CONSUMER_LAG,
        asset=asset_key,
        description="Every ACTIVE topology reading this topic is fewer records behind (end offset minus the offset "
        "committed in ZooKeeper, over all partitions) than its threshold. Evaluated by the heartbeat sensor on every tick.",
    )


def _partitions_text(lag: TopologyLag, limit: int = 8) -> str:
    worst = lag.lagging()
    text = ", ".join(f"p{p.partition}: {p.lag:,}" for p in worst[:limit])
    return text + (f", ... {len(worst) - limit} more" if len(worst) > limit else "")


def _offsets_table(lags: Sequence[TopologyLag]) -> dg.TableMetadataValue:
    records = [
        dg.TableRecord(
            {
                "topology": lag.watch.topology_name,
                "partition": p.partition,
                "committed_offset": -1 if p.committed is None else p.committed,
                "end_offset": -1 if p.end is None else p.end,
                "lag": -1 if p.lag is None else p.lag,
            }
        )
        for lag in lags
        for p in lag.partitions
    ]
    schema = dg.TableSchema(
        columns=[
            dg.TableColumn("topology", "string"),
            dg.TableColumn("partition", "int"),
            dg.TableColumn("committed_offset", "int", description="End offset committed in ZooKeeper (-1: none yet)."),
            dg.TableColumn("end_offset", "int", description="The partition's end offset on the broker (-1: not read)."),
            dg.TableColumn("lag", "int", description="end_offset - committed_offset (-1: unknown)."),
        ]
    )
    return dg.MetadataValue.table(records, schema=schema)


def lag_observation(asset_key: dg.AssetKey, lags: Sequence[TopologyLag]) -> dg.AssetObservation:
    """The merged observation of one Kafka source asset from its readers' lags (pure).

    Metadata: ``lag_p<partition>`` (largest lag of any reader) and ``lag_records`` (their sum),
    numbers Dagster plots, present when known; the ``offsets`` table (committed and end offset
    per topology and partition), ``topology_lag`` (topology -> its total, null when unknown),
    ``topic``, ``bootstrap`` and, when a read failed, ``broker_error``.
    """
    first = lags[0].watch
    worst: dict[int, int] = {}
    for lag in lags:
        for p in lag.partitions:
            if p.lag is not None:
                worst[p.partition] = max(worst.get(p.partition, 0), p.lag)
    metadata: dict[str, Any] = {
        "topic": dg.MetadataValue.text(first.topic),
        "bootstrap": dg.MetadataValue.text(first.bootstrap),
        "topologies": dg.MetadataValue.json(sorted({lag.watch.topology_name for lag in lags})),
    }
    if worst:
        metadata["lag_records"] = dg.MetadataValue.int(sum(worst.values()))
        for partition in sorted(worst):
            metadata[f"lag_p{partition}"] = dg.MetadataValue.int(worst[partition])
    metadata["topology_lag"] = dg.MetadataValue.json({lag.watch.topology_name: lag.total for lag in lags})
    metadata["offsets"] = _offsets_table(lags)
    errors = sorted({lag.error for lag in lags if lag.error})
    if errors:
        metadata["broker_error"] = dg.MetadataValue.text("; ".join(errors))
    if worst:
        description = f"consumer lag {sum(worst.values()):,} records over {len(worst)} partitions of `{first.topic}`"
    else:
        description = f"consumer lag of `{first.topic}` unknown"
    if errors:
        description += f"; end offsets not read: {'; '.join(errors)}"
    return dg.AssetObservation(asset_key=asset_key, description=description, metadata=metadata)


def evaluate_consumer_lag(asset_key: dg.AssetKey, lags: Sequence[TopologyLag]) -> CheckOutcome:
    """The ``consumer_lag`` check of one Kafka source asset from its readers' lags (pure).

    Passes when every ACTIVE reader's total lag is below its threshold (topologies not ACTIVE
    are not judged: nothing is expected to read). Fails with severity WARN when one is at or
    over it (naming it and its most lagging partitions) or its end offsets could not be read.

    Example:
        >>> w = KafkaSourceWatch(dg.AssetKey("t"), "wc", "words", "k:9092", "words", 1, threshold=5)
        >>> lag = TopologyLag(w, "wc-1", "ACTIVE", (PartitionLag(0, 3, 10, 7),))
        >>> evaluate_consumer_lag(w.asset_key, [lag]).passed
        False
    """
    warn = dg.AssetCheckSeverity.WARN
    judged = [lag for lag in lags if lag.status == "ACTIVE"]
    totals = {lag.watch.topology_name: lag.total for lag in lags}
    metadata: dict[str, Any] = {
        "lag_records": dg.MetadataValue.int(max((t for t in totals.values() if t is not None), default=0)),
        "topology_lag": dg.MetadataValue.json(totals),
        "thresholds": dg.MetadataValue.json({lag.watch.topology_name: lag.watch.threshold for lag in lags}),
        "lagging_partitions": dg.MetadataValue.json(
            {lag.watch.topology_name: {str(p.partition): p.lag for p in lag.lagging()} for lag in lags}
        ),
    }
    topic = lags[0].watch.topic if lags else asset_key.to_user_string()
    if not judged:
        states = ", ".join(f"{lag.watch.topology_name} is {lag.status}" for lag in lags) or "no live reader"
        return CheckOutcome(asset_key, CONSUMER_LAG, True, warn, f"no ACTIVE topology reads `{topic}` ({states})", metadata)
    problems: list[str] = []
    behind = False
    for lag in judged:
        name = lag.watch.topology_name
        if lag.error:
            problems.append(f"{name}: end offsets of `{topic}` not read ({lag.error})")
        elif lag.total is not None and lag.total >= lag.watch.threshold:
            behind = True
            problems.append(
                f"{name} is {lag.total:,} records behind on `{topic}` (threshold {lag.watch.threshold:,}); "
                f"most behind: {_partitions_text(lag)}"
            )
    if problems:
        advice = "; add workers or partitions, or look for stalled tasks (txid_progress check, stream-ops status)"
        return CheckOutcome(asset_key, CONSUMER_LAG, False, warn, "; ".join(problems) + (advice if behind else ""), metadata)
    summary = ", ".join(
        f"{lag.watch.topology_name} {'?' if lag.total is None else f'{lag.total:,}'} (threshold {lag.watch.threshold:,})"
        for lag in judged
    )
    return CheckOutcome(asset_key, CONSUMER_LAG, True, warn, f"records behind on `{topic}`: {summary}", metadata)


def consumer_lag_events(lags: Sequence[TopologyLag]) -> tuple[list[dg.AssetObservation], list[CheckOutcome]]:
    """One merged observation and one ``consumer_lag`` outcome per source asset, in first-seen order."""
    by_key: dict[dg.AssetKey, list[TopologyLag]] = {}
    for lag in lags:
        by_key.setdefault(lag.watch.asset_key, []).append(lag)
    observations = [lag_observation(key, found) for key, found in by_key.items()]
    outcomes = [evaluate_consumer_lag(key, found) for key, found in by_key.items()]
    return observations, outcomes
