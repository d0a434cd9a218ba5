"""A TaskRunner for one task of a submitted topology, driven by hand in the runtime tests."""

from __future__ import annotations

import threading
from typing import Any

from stream_ops.config import ClusterConfig
from stream_ops.coordination.store import ZkStore
from stream_ops.layout import TopologyLayout
from stream_ops.nimbus.dist_store import load_submission
from stream_ops.nimbus.submission import read_storm
from stream_ops.runtime.task_runner import RunnerSettings, TaskRunner


def make_runner(
    store: ZkStore, spark: Any, cluster: ClusterConfig, topology_id: str, worker_id: str, *, stage: int | str, **settings: Any
) -> TaskRunner:
    """The runner of queue 0 of ``stage`` (an index or a stage name), always connected."""
    plan = load_submission(cluster.resolved_dist_dir(), read_storm(store, topology_id)).plan
    index = stage if isinstance(stage, int) else next(s.index for s in plan.stages if s.name == stage)
    connected = threading.Event()
    connected.set()
    return TaskRunner(
        zk=store,
        spark=spark,
        layout=TopologyLayout(cluster, topology_id),
        plan=plan,
        task=plan.task_for(index, 0),
        worker_id=worker_id,
        settings=RunnerSettings(commit_wait_s=2, **settings),
        connected=connected,
    )
