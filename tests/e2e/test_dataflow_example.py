"""The dataflow example on worker processes: a worker is SIGKILLed mid-stream, and the Parquet
sink of the count's new values still reads back with DuckDB to exactly one row per count
reached, ending at the exact totals; the JoinBolt's pairs reach the worker logs."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from stream_ops.coordination.store import ZkStore
from stream_ops.examples.dataflow import build_dataflow
from stream_ops.examples.wordcount import SAMPLE_SENTENCES
from stream_ops.local_stack import LocalStack, expected_word_counts, wait_for_counts
from stream_ops.nimbus import submit
from stream_ops.topics.producer import produce


def _land(directory: Path, index: int, sentences: list[str]) -> None:
    """Drop a Parquet file the way another system would: written hidden, then renamed."""
    directory.mkdir(parents=True, exist_ok=True)
    hidden = directory / f".landing-{index}.parquet"
    pq.write_table(pa.table({"sentence": sentences}), hidden)
    hidden.rename(directory / f"landed-{index:04d}.parquet")


def _feed(root: Path, topic, batches: list[list[str]], sent: list[str], stop: threading.Event) -> None:
    for index, batch in enumerate(batches):
        if stop.is_set():
            return
        if index % 3 == 2:
            _land(root / "landed", index, batch)
        else:
            produce(topic, ({"sentence": s} for s in batch))
        sent.extend(batch)
        time.sleep(0.2)


def _sink_rows(root: Path) -> list[tuple[str, int, int, int]]:
    """(word, highest count, rows, distinct counts) per word in the Parquet sink."""
    query = (
        f"select word, max(count), count(*), count(distinct count) from read_parquet('{root}/counts/**/*.parquet') "
        "group by word order by word"
    )
    return duckdb.sql(query).fetchall()


def test_the_dataflow_example_survives_a_worker_sigkill_with_exact_sink_rows(tmp_path):
    home = tmp_path / "home"
    root = home / "input" / "dataflow"
    with (
        LocalStack(
            home=home, workers=2, worker_args=["--trigger-seconds", "0.2", "--heartbeat-interval", "0.5"], session_timeout_s=4.0
        ) as stack,
        ZkStore.connect(stack.zk_config) as store,
    ):
        topology = build_dataflow(root, queues=2, window_s=1.0)
        submit(store, stack.cluster, topology, workers=2)
        batches = [list(SAMPLE_SENTENCES)[i % 8 :] + [f"unique{i} how"] for i in range(30)]
        sent: list[str] = []
        stop = threading.Event()
        topic = topology.chains[0].source.topic
        feeder = threading.Thread(target=_feed, args=(root, topic, batches, sent, stop))
        feeder.start()
        time.sleep(3.0)
        victim = stack.worker_processes[0]
        stack.kill_worker(victim)
        time.sleep(1.0)
        stack.start_worker(port=victim.port)
        feeder.join()
        stack.wait_for_workers(2)
        expected = expected_word_counts(sent)
        wait_for_counts(store, "dataflow", "words", expected, timeout_s=150)

        deadline = time.monotonic() + 60
        rows = _sink_rows(root)
        while time.monotonic() < deadline and {w: top for w, top, _, _ in rows} != expected:
            time.sleep(1.0)  # the last batches' files are published right after their commits
            rows = _sink_rows(root)
        assert {w: top for w, top, _, _ in rows} == expected
        doubled = [(w, n, distinct) for w, _, n, distinct in rows if n != distinct]
        assert doubled == [], f"a count was written twice (a batch emitted twice): {doubled}"
        logs = "".join(w.log.read_text(errors="replace") for w in stack.worker_processes if w.log.exists())
        assert "word-lengths task" in logs, "the JoinBolt's pairs are printed to the worker logs"
