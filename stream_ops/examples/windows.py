"""Event-time windows: clicks counted per user in 10-second windows, a late stream, and a
sliding JoinBolt of page views with clicks.

::

    clicks (FileTopic) ─┬─ window(Tumbling(10), event time "ts", lag 2) ─ group_by(user) ─ count ─ to_parquet(clicks_per_user)
                        │        └─ late_stream "late_clicks" ─ to_parquet(late_clicks)
    views (FileTopic) ──┴─ JoinBolt on page, sliding 10 s every 5 s, event time ─ to_parquet(view_clicks)

Records carry their event time ``ts`` in seconds since the epoch. A window closes once the
watermark (the ``ts`` every source task has reached, minus the lag) passes its end, and each closed
window is written once, as ``user, clicks, window_start, window_end``; clicks that arrive
after their window closed go to ``late_clicks`` instead of being counted. The join pairs
every view with the clicks on the same page in the same sliding window.
"""

from __future__ import annotations

import os
from pathlib import Path

from stream_ops import Count, FileTopic, Topology, Tumbling
from stream_ops.operators import JoinBolt

CLICKS = {"user": "string", "page": "string", "ts": "double"}
VIEWS = {"page": "string", "ts": "double"}


def build_windows(root: str | os.PathLike[str], *, name: str = "windows", queues: int = 2, lag_s: float = 2.0) -> Topology:
    """The graph of the module doc on ``root/clicks`` and ``root/views`` (FileTopics),
    writing ``root/clicks_per_user``, ``root/late_clicks`` and ``root/view_clicks``."""
    root = Path(root)
    topology = Topology(name)
    clicks = topology.source("clicks", FileTopic(root / "clicks", queues), schema=CLICKS)
    views = topology.source("views", FileTopic(root / "views", queues), schema=VIEWS)

    per_user = clicks.window(Tumbling(10), time="event", timestamp_field="ts", lag=lag_s, late_stream="late_clicks")
    per_user.group_by("user").aggregate(Count(), out="clicks", name="clicks-per-user").to_parquet(
        root / "clicks_per_user", name="clicks_per_user"
    )
    topology.stream("late_clicks").to_parquet(root / "late_clicks", name="late_clicks")

    bolt = (
        JoinBolt("views", "page")
        .join("clicks", "page", "views")
        .select("page, views:ts, clicks:user, clicks:ts")
        .with_window(10, 5)
        .with_timestamp_field("ts")
        .with_lag(lag_s)
    )
    topology.join(bolt, views=views, clicks=clicks, name="view-clicks").to_parquet(root / "view_clicks", name="view_clicks")
    return topology


def topology() -> Topology:
    """The example on ``$STREAM_OPS_HOME/input/windows``."""
    return build_windows(Path(os.environ.get("STREAM_OPS_HOME", "var/stream_ops")).resolve() / "input" / "windows")
