"""Storm's JoinBolt example: join ``spout1`` (uuid, word) with ``spout2`` (uuid, timestamp).

``JoinBolt("spout1", "uuid").join("spout2", "uuid", "spout1").select("uuid, word,
spout2:timestamp")`` over tumbling count windows; the joined rows are counted per word.
"""

from __future__ import annotations

import os
from pathlib import Path

from stream_ops import Count, FileTopic, OpaqueMapState, Topology
from stream_ops.operators import JoinBolt


def build_uuid_join(root: str | os.PathLike[str], *, name: str = "uuid-join", queues: int = 1, window: int = 10) -> Topology:
    """The join topology reading ``root/spout1`` and ``root/spout2``."""
    root = Path(root)
    topology = Topology(name)
    words = topology.source("spout1", FileTopic(root / "spout1", queues), schema={"uuid": "string", "word": "string"})
    stamps = topology.source("spout2", FileTopic(root / "spout2", queues), schema={"uuid": "string", "timestamp": "long"})
    bolt = (
        JoinBolt("spout1", "uuid")
        .join("spout2", "uuid", "spout1")
        .select("uuid, word, spout2:timestamp")
        .with_tumbling_window(count=window)
    )
    joined = topology.join(bolt, spout1=words, spout2=stamps)
    counts = joined.group_by("word").persistent_aggregate(Count(), out="count", state=OpaqueMapState, name="joined")
    topology.query("joined_words", counts)
    return topology


def topology() -> Topology:
    """The example on ``$STREAM_OPS_HOME/input/uuid-join``."""
    return build_uuid_join(Path(os.environ.get("STREAM_OPS_HOME", "var/stream_ops")).resolve() / "input" / "uuid-join")
