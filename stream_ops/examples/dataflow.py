"""A dataflow graph: two sources merged, fanned out to a count and a JoinBolt, results in sinks.

::

    live (FileTopic) ─┐                         ┌─ each(split) ─ group_by(word) ─ count ─ new_values() ─ to_parquet
                      ├─ merge ─ sentences ─────┤                                        (queryable: "words")
    landed (Parquet) ─┘                         ├─ each(split) ────────┐
                                                └─ map(measure) ───────┴─ JoinBolt on sentence ─ print()

``live`` is a FileTopic of JSON lines fed by producers; ``landed`` is a directory other systems
drop Parquet files into. The count's ``new_values()`` (each changed word with its new count,
once per committed batch) land in Parquet files under ``<root>/counts``, readable with DuckDB
or Spark while the topology runs. The JoinBolt pairs every word with the length of its
sentence, within tumbling windows of 2 seconds, and logs the pairs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from stream_ops import Count, FileTopic, OpaqueMapState, Topology
from stream_ops.operators import JoinBolt
from stream_ops.sources import ParquetFiles

SCHEMA = {"sentence": "string"}


def split(sentence: str) -> Iterator[str]:
    """The words of a sentence."""
    yield from sentence.split()


def measure(record: dict) -> dict:
    """A sentence and its length in characters."""
    return {"sentence": record["sentence"], "length": len(record["sentence"])}


def build_dataflow(root: str | os.PathLike[str], *, name: str = "dataflow", queues: int = 2, window_s: float = 2.0) -> Topology:
    """The graph of the module doc, on ``root/sentences`` (FileTopic) and ``root/landed``
    (Parquet files), writing ``root/counts``."""
    root = Path(root)
    topology = Topology(name)
    live = topology.source("live", FileTopic(root / "sentences", queues), schema=SCHEMA)
    landed = topology.source("landed", ParquetFiles(root / "landed"), schema=SCHEMA)
    sentences = topology.merge(live, landed)

    words = sentences.each(split, out="word", fields=["sentence"])
    counts = words.group_by("word", queues=queues).persistent_aggregate(Count(), out="count", state=OpaqueMapState)
    topology.query("words", counts)
    counts.new_values().to_parquet(root / "counts", name="counts")

    lengths = sentences.map(measure, out={"sentence": "string", "length": "long"})
    bolt = (
        JoinBolt("words", "sentence")
        .join("lengths", "sentence", "words")
        .select("word, lengths:length")
        .with_tumbling_window(seconds=window_s)
    )
    topology.join(bolt, words=words, lengths=lengths, name="word-lengths").print(name="word-lengths")
    return topology


def topology() -> Topology:
    """The example on ``$STREAM_OPS_HOME/input/dataflow``."""
    return build_dataflow(Path(os.environ.get("STREAM_OPS_HOME", "var/stream_ops")).resolve() / "input" / "dataflow")
