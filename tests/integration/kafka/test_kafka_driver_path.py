"""A small Kafka source batch read and computed on the driver gives exactly Spark's result for
the same batch, on a real broker and real Spark with its Kafka connector.

Each test's run is a source stage's streaming query (they all run in one process of their own,
``driver_parity_main.py``) computing every batch on the path
:func:`~stream_ops.compute.decision.choose_path` picks and with Spark, and comparing the rows the
driver read for the batch's offset range with the rows of Spark's batch. The input mixes plain
records, committed and aborted transactions (so control markers), null keys and values, an
empty key, headers, and keys and values that are not UTF-8; batches split anywhere in it
(``maxOffsetsPerTrigger``), with both isolation levels; a batch above
``spark.stream_ops.kafkaDriverRecords`` (the source set its own, larger ``maxOffsetsPerTrigger``)
goes to Spark, and a source that sets none is planned in batches of at most that many offsets.
Spark plans each batch over its Kafka relation alone: the source's projection (values parsed,
metadata columns) is applied only to the batches Spark computes; a task's checkpoint begun by a
query with that projection in its plan (stream_ops before the bare relation) continues on it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka_input import MIXED, NOT_UTF8, Sent, produce, stable_end

from stream_ops.kafka.embedded import EmbeddedKafka

SCRIPT = Path(__file__).with_name("driver_parity_main.py")
TIMEOUT_S = 180.0
REPO = Path(__file__).resolve().parents[3]

RUNS: dict[str, dict[str, Any]] = {
    "uncommitted": {},
    "committed_split": {"isolation": "read_committed", "max_offsets": 2},
    "raw_base64": {"format": "raw", "encoding": "base64", "driver_records": 10, "max_offsets": 1000},
    "bounded": {"format": "raw", "encoding": "utf8", "driver_records": 10},
    "upgraded": {"upgraded": True},
}
"""The queries of the one ``driver_parity_main.py`` process: a test's name -> its source's options."""

FIRST: dict[str, Sent] = {
    "uncommitted": Sent(b"k0", b'{"sentence":"first"}'),
    "committed_split": Sent(b"k0", b'{"sentence":"first"}'),
    "raw_base64": Sent(b"k0", b"first"),
    "bounded": Sent(b"k0", b"first"),
    "upgraded": Sent(b"k0", b'{"sentence":"first"}'),
}
"""The record each topic holds before the queries start (so batch 0 has input)."""


class ParityRun:
    """One query of ``driver_parity_main.py``: its topic and per-batch lines."""

    def __init__(self, kafka: EmbeddedKafka, topic: str, out: Path, process: ParityProcess) -> None:
        self.kafka, self.topic, self.out, self.process = kafka, topic, out, process

    def lines(self) -> list[dict[str, Any]]:
        if not self.out.exists():
            return []
        return [json.loads(line) for line in self.out.read_text(encoding="utf-8").splitlines() if line.strip()]

    def wait_for_end(self) -> list[dict[str, Any]]:
        """The lines once a batch has read up to the partition's end offset now."""
        end = stable_end(self.kafka.bootstrap_servers, self.topic)
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            lines = self.lines()
            if any(line["ranges"] and line["ranges"][0][3] >= end for line in lines) or (end <= 1 and lines):
                return lines
            self.process.assert_running()
            assert time.monotonic() < deadline, f"no batch up to offset {end}: {lines}"
            time.sleep(0.2)


class ParityProcess:
    """``driver_parity_main.py`` running every query of :data:`RUNS` in one Spark JVM."""

    def __init__(self, root: Path, kafka: EmbeddedKafka) -> None:
        self.stop_file, self.log = root / "stop", root / "parity.log"
        self.runs: dict[str, ParityRun] = {}
        specs = []
        for name, options in RUNS.items():
            topic = f"parity-{name.replace('_', '-')}-{uuid.uuid4().hex[:8]}"
            kafka.ensure_topic(topic, partitions=1)
            produce(kafka.bootstrap_servers, topic, [("plain", [FIRST[name]])])
            out = root / f"{name}.jsonl"
            specs.append(
                {"name": name, "topic": topic, "checkpoint": str(root / f"checkpoint-{name}"), "out": str(out), **options}
            )
            self.runs[name] = ParityRun(kafka, topic, out, self)
        runs_file = root / "runs.json"
        runs_file.write_text(json.dumps(specs), encoding="utf-8")
        command = [sys.executable, str(SCRIPT), "--bootstrap", kafka.bootstrap_servers, "--runs", str(runs_file)]
        command += ["--stop", str(self.stop_file)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)

    def assert_running(self) -> None:
        assert self.proc.poll() is None, f"the query process exited: {self.log.read_text(errors='replace')[-4000:]}"

    def stop(self) -> None:
        self.stop_file.touch()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        assert self.proc.returncode == 0, self.log.read_text(errors="replace")[-4000:]


@pytest.fixture(scope="module")
def parity(tmp_path_factory, kafka, connector_jars) -> Iterator[ParityProcess]:
    """One process for the module's tests (a Spark JVM with the connector starts in ~15 s on 2
    cores); each test produces to its own topic and reads its own query's lines."""
    process = ParityProcess(tmp_path_factory.mktemp("parity"), kafka)
    try:
        yield process
    finally:
        process.stop()


def _assert_same_as_spark(lines: list[dict[str, Any]]) -> None:
    for line in lines:
        assert line["chosen"] == line["spark"], line
        assert line["spark_plan"] is not None and "kafka_offset" not in line["spark_plan"], line["spark_plan"]
        if line["path"] == "ARROW_ON_DRIVER":
            assert line["rows_equal"] is True, line
            assert not line["spark_corrupt"], line
        if line["rows_equal"] is not None:
            assert line["rows_equal"], line


def _driver_batches(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in lines if line["path"] == "ARROW_ON_DRIVER" and line["spark_rows"] > 0]


def test_driver_batches_equal_sparks_read_uncommitted_with_aborted_records_and_bad_utf8(parity, kafka):
    run = parity.runs["uncommitted"]
    first = run.wait_for_end()
    assert (first[0]["batch"], first[0]["path"]) == (0, "ARROW_ON_DRIVER"), "batch 0 from the starting offsets Spark noted"
    assert first[0]["ranges"][0][2:] == [0, 1] and first[0]["rows_equal"], first[0]
    produce(kafka.bootstrap_servers, run.topic, MIXED)
    lines = run.wait_for_end()
    driver = _driver_batches(lines)
    assert driver, f"no batch of the mixed input took the driver: {lines}"
    assert any("never" in json.dumps(line["chosen"]) for line in driver), "read_uncommitted reads the aborted records"
    produce(kafka.bootstrap_servers, run.topic, NOT_UTF8)
    lines = run.wait_for_end()
    refused = [line for line in lines if line["reason"] == "DRIVER_READ_REFUSED"]
    assert refused and all(line["not_arrow"] == "RECORDS_NEED_SPARK" for line in refused), lines
    assert any(line["spark_corrupt"] for line in refused), "the value that is no JSON: a dead letter, from Spark"
    _assert_same_as_spark(lines)


def test_driver_batches_equal_sparks_read_committed_split_anywhere(parity, kafka):
    run = parity.runs["committed_split"]
    run.wait_for_end()
    produce(kafka.bootstrap_servers, run.topic, MIXED)
    lines = run.wait_for_end()
    _assert_same_as_spark(lines)
    later = [line for line in lines if line["batch"] > 0]
    assert later and all(line["path"] == "ARROW_ON_DRIVER" for line in later), lines
    assert not any("never" in json.dumps(line["chosen"]) for line in lines), "read_committed skips the aborted records"
    assert any(line["spark_rows"] == 0 and line["ranges"][0][3] > line["ranges"][0][2] for line in later), (
        "a batch of markers or aborted records only (none read)"
    )


def test_raw_base64_batches_equal_sparks_and_a_batch_above_the_bound_goes_to_spark(parity, kafka):
    run = parity.runs["raw_base64"]
    run.wait_for_end()
    produce(kafka.bootstrap_servers, run.topic, [*NOT_UTF8, ("plain", [Sent(None, None), Sent(b"", b"")])])
    small = run.wait_for_end()
    assert _driver_batches(small), f"bytes that are not UTF-8 read on the driver in base64: {small}"
    produce(kafka.bootstrap_servers, run.topic, [("plain", [Sent(b"k", f"v{i % 3}".encode()) for i in range(30)])])
    lines = run.wait_for_end()
    _assert_same_as_spark(lines)
    above = [line for line in lines if line["ranges"] and line["ranges"][0][3] - line["ranges"][0][2] > 10]
    assert above, f"no batch of more than 10 offsets: {lines}"
    assert all((line["path"], line["reason"]) == ("SPARK", "ABOVE_DRIVER_RECORDS") for line in above), above


def test_a_source_without_its_own_bound_is_planned_in_batches_the_driver_reads(parity, kafka):
    run = parity.runs["bounded"]
    run.wait_for_end()
    produce(kafka.bootstrap_servers, run.topic, [("plain", [Sent(b"k", f"v{i % 3}".encode()) for i in range(35)])])
    lines = run.wait_for_end()
    _assert_same_as_spark(lines)
    later = [line for line in lines if line["batch"] > 0]
    assert sum(line["spark_rows"] for line in later) == 35, lines
    assert all(line["ranges"][0][3] - line["ranges"][0][2] <= 10 for line in later), "maxOffsetsPerTrigger = kafkaDriverRecords"
    assert all((line["path"], line["reason"]) == ("ARROW_ON_DRIVER", "WITHIN_DRIVER_RECORDS") for line in later), lines


def test_a_checkpoint_begun_with_the_projection_in_the_plan_continues_on_the_bare_relation(parity, kafka):
    run = parity.runs["upgraded"]
    produce(
        kafka.bootstrap_servers, run.topic, [("plain", [Sent(b"k", f'{{"sentence":"w{i % 3}"}}'.encode()) for i in range(12)])]
    )
    lines = run.wait_for_end()
    _assert_same_as_spark(lines)
    assert lines[0]["batch"] >= 1 and lines[0]["ranges"][0][2] == 1, f"the first record was batch 0 of the old query: {lines}"
    assert sum(line["spark_rows"] for line in lines) == 12, lines
