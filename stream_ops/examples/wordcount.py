"""Trident's word count: sentences -> split -> group by word -> persistent count.

The split is written three ways (``split_with``): ``"sql"``, Spark SQL run in the JVM
(``select_expr("explode(split(sentence, ' ')) AS word")``, the fastest), ``"arrow"``, a
``map_batches`` function over whole Arrow batches (:func:`split_batch`), or ``"row"``,
Trident's ``each(Split)`` with a Python function per record. The example the CLI and the
Dagster code location run uses SQL.

Where the input lives comes from ``STREAM_OPS_HOME`` (default ``var/stream_ops`` under the
current directory), so the same module serves the local stack, tests and the cluster.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from stream_ops import Count, FileTopic, OpaqueMapState, Topology

SAMPLE_SENTENCES = (
    "the cow jumped over the moon",
    "the man went to the store and bought some candy",
    "four score and seven years ago",
    "how many apples can you eat",
    "to be or not to be the person",
    "how are you",
    "nice to meet you",
    "what a good day",
)


def split(sentence: str) -> Iterator[str]:
    """Trident's ``Split``: one output per space-separated word."""
    yield from sentence.split(" ")


def split_batch(batch: pa.RecordBatch) -> pa.Table:
    """:func:`split` for a whole Arrow batch of sentences: one row per word."""
    words = pc.list_flatten(pc.split_pattern(batch.column("sentence"), " "))
    return pa.table({"word": words})


def build_wordcount(
    input_path: str | os.PathLike[str],
    *,
    name: str = "wordcount",
    queues: int = 2,
    state: Any = OpaqueMapState,
    split_with: Literal["row", "arrow", "sql"] = "row",
) -> Topology:
    """The word-count topology reading sentences from ``input_path``."""
    topology = Topology(name)
    sentences = topology.source("sentences", FileTopic(input_path, queues=queues), schema={"sentence": "string"})
    if split_with == "sql":
        words = sentences.select_expr("explode(split(sentence, ' ')) AS word")
    elif split_with == "arrow":
        words = sentences.map_batches(split_batch, schema={"word": "string"})
    else:
        words = sentences.each(split, out="word", fields=["sentence"])
    counts = words.group_by("word").persistent_aggregate(Count(), out="count", state=state)
    topology.query("words", counts)
    return topology


def input_path() -> Path:
    """Where the example reads its sentences."""
    return Path(os.environ.get("STREAM_OPS_HOME", "var/stream_ops")).resolve() / "input" / "sentences"


def topology() -> Topology:
    """The example word count on the configured input path, split by Spark SQL."""
    return build_wordcount(input_path(), split_with="sql")
