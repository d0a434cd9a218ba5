"""The path a source batch takes (``compute/decision.py:choose_path``), and why, for real stages.

Settings are plain numbers here (each read counted, so that a rule reads one only when it needs
it); no Spark session is started.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from stream_ops import Count, FileTopic, OpaqueMapState, Sum, Topology
from stream_ops.compute.arrow_read import ArrowRefusal
from stream_ops.compute.decision import BatchFacts, ComputePath, PathChoice, Reason, choose_path
from stream_ops.dsl.build_plan import build_plan
from stream_ops.examples.wordcount import build_wordcount, split
from stream_ops.sources.definitions import KafkaTopic, RateSource
from stream_ops.topology.plan import StageSpec

KB = 1 << 10


@dataclass
class Limits:
    """The three path settings, with the names of those read, in order."""

    arrow: int = 128 * KB
    driver: int = 1 * KB
    processes: int = 2
    records: int = 50_000
    read: list[str] = field(default_factory=list)

    def arrow_batch_bytes(self) -> int:
        self.read.append("arrow")
        return self.arrow

    def driver_batch_bytes(self) -> int:
        self.read.append("driver")
        return self.driver

    def row_processes(self) -> int:
        self.read.append("processes")
        return self.processes

    def driver_records(self) -> int:
        self.read.append("records")
        return self.records


def _wordcount(split_with: str) -> StageSpec:
    return build_plan(build_wordcount("/nonexistent/in", queues=1, split_with=split_with)).stage(0)  # type: ignore[arg-type]


def _rate_count() -> StageSpec:
    topology = Topology("rate")
    values = topology.source("ticks", RateSource(rows_per_second=10))
    values.group_by("value").persistent_aggregate(Count(), out="n", state=OpaqueMapState)
    return build_plan(topology).stage(0)


def _float_field() -> StageSpec:
    topology = Topology("weights")
    lines = topology.source("lines", FileTopic("/nonexistent/in", 1), schema={"sentence": "string", "w": "float"})
    lines.each(split, out="word", fields=["sentence"]).group_by("word").persistent_aggregate(
        Sum("w"), out="t", state=OpaqueMapState
    )
    return build_plan(topology).stage(0)


def _decide(stage: StageSpec, size: int | None, limits: Limits, **facts: object) -> PathChoice:
    return choose_path(BatchFacts(stage, size, limits, **facts))  # type: ignore[arg-type]


def test_a_small_file_topic_batch_is_read_in_arrow_on_the_driver() -> None:
    limits = Limits()
    choice = _decide(_wordcount("row"), 500, limits)
    assert (choice.path, choice.reason, choice.not_arrow, choice.processes) == (
        ComputePath.ARROW_ON_DRIVER,
        Reason.WITHIN_ARROW_LIMIT,
        None,
        0,
    )
    assert limits.read == ["arrow", "driver"]
    assert "500 bytes" in str(choice) and Reason.WITHIN_ARROW_LIMIT.value in str(choice)


def test_a_batch_function_stage_reads_in_arrow_up_to_the_arrow_limit_without_processes() -> None:
    limits = Limits()
    choice = _decide(_wordcount("arrow"), 100 * KB, limits)
    assert (choice.path, choice.processes) == (ComputePath.ARROW_ON_DRIVER, 0)
    assert limits.read == ["arrow"], "no per-record operation: the driver limit does not matter"


def test_per_record_operations_above_the_driver_limit_run_in_local_processes() -> None:
    limits = Limits(processes=3)
    choice = _decide(_wordcount("row"), 100 * KB, limits)
    assert (choice.path, choice.reason, choice.processes) == (ComputePath.ROW_PROCESSES, Reason.PER_RECORD_IN_PROCESSES, 3)
    assert limits.read == ["arrow", "driver", "processes"]


def test_without_local_processes_a_large_per_record_batch_goes_to_spark() -> None:
    choice = _decide(_wordcount("row"), 100 * KB, Limits(processes=0))
    assert (choice.path, choice.reason, choice.not_arrow) == (
        ComputePath.SPARK,
        Reason.ABOVE_DRIVER_LIMIT,
        Reason.NO_ROW_PROCESSES,
    )
    assert choice.group_partials_on_driver, "a typed count without SQL, within the Arrow limit: grouped on the driver"


@pytest.mark.parametrize(
    ("stage", "size", "limits", "path", "reason", "not_arrow"),
    [
        (_wordcount("row"), 200 * KB, Limits(), ComputePath.SPARK, Reason.ABOVE_DRIVER_LIMIT, Reason.ABOVE_ARROW_LIMIT),
        (
            _wordcount("row"),
            500,
            Limits(arrow=0),
            ComputePath.COLLECT_ON_DRIVER,
            Reason.WITHIN_DRIVER_LIMIT,
            Reason.ABOVE_ARROW_LIMIT,
        ),
        (_wordcount("row"), None, Limits(), ComputePath.SPARK, Reason.INPUT_UNKNOWN, Reason.INPUT_UNKNOWN),
        (
            _rate_count(),
            500,
            Limits(),
            ComputePath.COLLECT_ON_DRIVER,
            Reason.WITHIN_DRIVER_LIMIT,
            Reason.SOURCE_NOT_ARROW_READABLE,
        ),
        (_float_field(), 500, Limits(), ComputePath.COLLECT_ON_DRIVER, Reason.WITHIN_DRIVER_LIMIT, Reason.FIELDS_NOT_NATIVE),
        (_float_field(), 5 * KB, Limits(), ComputePath.SPARK, Reason.ABOVE_DRIVER_LIMIT, Reason.FIELDS_NOT_NATIVE),
    ],
    ids=["above the Arrow limit", "Arrow off", "input unknown", "rate source", "float field, small", "float field, large"],
)
def test_a_batch_not_read_in_arrow_is_collected_when_small_else_computed_by_spark(
    stage: StageSpec, size: int | None, limits: Limits, path: ComputePath, reason: Reason, not_arrow: Reason
) -> None:
    choice = _decide(stage, size, limits)
    assert (choice.path, choice.reason, choice.not_arrow) == (path, reason, not_arrow)
    assert not_arrow.value in str(choice)


def test_a_batch_the_arrow_read_gives_back_is_decided_again_without_arrow() -> None:
    small = _decide(_wordcount("row"), 500, Limits(), arrow_refusal=ArrowRefusal.LINES_NEED_SPARK)
    assert (small.path, small.reason, small.not_arrow) == (
        ComputePath.COLLECT_ON_DRIVER,
        Reason.WITHIN_DRIVER_LIMIT,
        ArrowRefusal.LINES_NEED_SPARK,
    )
    large = _decide(_wordcount("row"), 100 * KB, Limits(), arrow_refusal=ArrowRefusal.VALUES_NEED_SPARK)
    assert (large.path, large.not_arrow) == (ComputePath.SPARK, ArrowRefusal.VALUES_NEED_SPARK)


def test_the_callers_choice_decides_alone_and_reads_no_setting_for_the_driver() -> None:
    limits = Limits()
    on_driver = _decide(_wordcount("row"), 500, limits, asked_on_driver=True)
    assert (on_driver.path, on_driver.reason, on_driver.not_arrow) == (ComputePath.COLLECT_ON_DRIVER, Reason.ASKED, None)
    assert limits.read == []
    in_spark = _decide(_wordcount("row"), 500, limits, asked_on_driver=False)
    assert (in_spark.path, in_spark.reason, in_spark.group_partials_on_driver) == (ComputePath.SPARK, Reason.ASKED, True)
    assert limits.read == ["arrow"]


def test_spark_groups_typed_partials_on_the_driver_only_when_the_input_is_known_to_fit() -> None:
    assert not _decide(_wordcount("row"), None, Limits(), asked_on_driver=False).group_partials_on_driver
    assert not _decide(_wordcount("row"), 200 * KB, Limits(), asked_on_driver=False).group_partials_on_driver
    assert _decide(_wordcount("row"), 128 * KB, Limits(), asked_on_driver=False).group_partials_on_driver
    assert not _decide(_wordcount("row"), 500, Limits(), asked_on_driver=True).group_partials_on_driver


def test_limits_are_inclusive() -> None:
    assert _decide(_wordcount("arrow"), 128 * KB, Limits()).path is ComputePath.ARROW_ON_DRIVER
    assert _decide(_wordcount("row"), 1 * KB, Limits()).path is ComputePath.ARROW_ON_DRIVER
    assert _decide(_wordcount("row"), 1 * KB + 1, Limits()).path is ComputePath.ROW_PROCESSES
    refused = ArrowRefusal.LINES_NEED_SPARK
    assert _decide(_wordcount("row"), 1 * KB, Limits(), arrow_refusal=refused).path is ComputePath.COLLECT_ON_DRIVER


# --- batches known by their offset ranges (a Kafka topic's) ----------------------------------


def _kafka_count() -> StageSpec:
    topology = Topology("kafka_words")
    sentences = topology.source("sentences", KafkaTopic("127.0.0.1:9", "sentences", partitions=2), schema={"sentence": "string"})
    words = sentences.select_expr("explode(split(sentence, ' ')) AS word")
    words.group_by("word").persistent_aggregate(Count(), out="n", state=OpaqueMapState)
    return build_plan(topology).stage(0)


def test_a_small_kafka_batch_is_read_and_computed_on_the_driver() -> None:
    limits = Limits(records=1_000)
    choice = _decide(_kafka_count(), None, limits, input_offsets=1_000)
    assert (choice.path, choice.reason, choice.not_arrow, choice.input_offsets) == (
        ComputePath.ARROW_ON_DRIVER,
        Reason.WITHIN_DRIVER_RECORDS,
        None,
        1_000,
    )
    assert limits.read == ["records"], "only the record bound is read: bytes do not apply"
    assert "1000 offsets" in str(choice)


def test_a_kafka_batch_above_the_record_bound_goes_to_spark() -> None:
    choice = _decide(_kafka_count(), None, Limits(records=1_000), input_offsets=1_001)
    assert (choice.path, choice.reason, choice.not_arrow) == (
        ComputePath.SPARK,
        Reason.ABOVE_DRIVER_RECORDS,
        Reason.ABOVE_DRIVER_RECORDS,
    )
    assert not choice.group_partials_on_driver


def test_a_record_bound_of_zero_sends_every_kafka_batch_to_spark() -> None:
    for offsets in (0, 1):
        choice = _decide(_kafka_count(), None, Limits(records=0), input_offsets=offsets)
        assert (choice.path, choice.reason) == (ComputePath.SPARK, Reason.ABOVE_DRIVER_RECORDS)


def test_an_empty_kafka_batch_within_the_bound_takes_the_driver() -> None:
    assert _decide(_kafka_count(), None, Limits(), input_offsets=0).path is ComputePath.ARROW_ON_DRIVER


def test_a_kafka_batch_the_driver_read_gives_back_goes_to_spark_saying_why() -> None:
    refused = ArrowRefusal.RECORDS_NEED_SPARK
    limits = Limits()
    choice = _decide(_kafka_count(), None, limits, input_offsets=10, arrow_refusal=refused)
    assert (choice.path, choice.reason, choice.not_arrow) == (ComputePath.SPARK, Reason.DRIVER_READ_REFUSED, refused)
    assert refused.value in str(choice)


def test_offsets_of_a_source_kind_that_cannot_read_them_go_to_spark() -> None:
    choice = _decide(_rate_count(), None, Limits(), input_offsets=10)
    assert (choice.path, choice.reason) == (ComputePath.SPARK, Reason.SOURCE_NOT_OFFSETS_READABLE)


def test_a_kafka_batch_without_logged_offsets_is_input_unknown_and_the_callers_choice_still_decides() -> None:
    unknown = _decide(_kafka_count(), None, Limits())
    assert (unknown.path, unknown.reason) == (ComputePath.SPARK, Reason.INPUT_UNKNOWN)
    asked = _decide(_kafka_count(), None, Limits(), input_offsets=10, asked_on_driver=False)
    assert (asked.path, asked.reason) == (ComputePath.SPARK, Reason.ASKED)


def _kafka_per_record() -> StageSpec:
    topology = Topology("kafka_rows")
    sentences = topology.source("sentences", KafkaTopic("127.0.0.1:9", "sentences", partitions=2), schema={"sentence": "string"})
    words = sentences.each(split, out="word", fields=["sentence"])
    words.group_by("word").persistent_aggregate(Count(), out="n", state=OpaqueMapState)
    return build_plan(topology).stage(0)


def test_a_kafka_batch_with_per_record_operations_is_read_first_then_sized() -> None:
    limits = Limits(processes=3)
    before = _decide(_kafka_per_record(), None, limits, input_offsets=10_000)
    assert (before.path, limits.read) == (ComputePath.ARROW_ON_DRIVER, ["records"]), "its size is not known before the read"
    small = _decide(_kafka_per_record(), None, Limits(processes=3), input_offsets=10_000, read_bytes=1 * KB)
    assert (small.path, small.reason) == (ComputePath.ARROW_ON_DRIVER, Reason.WITHIN_DRIVER_RECORDS), "limits are inclusive"
    large = _decide(_kafka_per_record(), None, Limits(processes=3), input_offsets=10_000, read_bytes=1 * KB + 1)
    assert (large.path, large.reason, large.processes) == (ComputePath.ROW_PROCESSES, Reason.PER_RECORD_IN_PROCESSES, 3)
    none = _decide(_kafka_per_record(), None, Limits(processes=0), input_offsets=10_000, read_bytes=1 * KB + 1)
    assert (none.path, none.reason) == (ComputePath.SPARK, Reason.NO_ROW_PROCESSES)


def test_a_large_kafka_batch_without_per_record_operations_stays_on_the_driver() -> None:
    limits = Limits(processes=3)
    choice = _decide(_kafka_count(), None, limits, input_offsets=10_000, read_bytes=100 * KB)
    assert (choice.path, choice.reason) == (ComputePath.ARROW_ON_DRIVER, Reason.WITHIN_DRIVER_RECORDS)
    assert "processes" not in limits.read
