"""Task heartbeats: ``/taskheartbeats/{id}/{task}``, rewritten every beat (ephemeral)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import HeartbeatRecord
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import CoordinationError
from stream_ops.runtime.task_runner import TaskRunner

logger = logging.getLogger(__name__)


def heartbeat_record(runner: TaskRunner, now: float) -> HeartbeatRecord:
    """What one task reports."""
    stats = runner.stats
    ownership = runner.ownership
    lag = runner.lag()
    return HeartbeatRecord(
        worker_id=runner.worker_id,
        time=now,
        epoch=ownership.epoch if ownership else 0,
        txid_in_flight=stats.txid_in_flight,
        committed_txid=ownership.committed_txid if ownership else -1,
        rows_per_s=round(stats.rows_per_s, 3),
        rows_out_per_s=round(stats.rows_out_per_s, 3),
        lag_files=lag.files or 0,
        lag_records=lag.records,
        state_keys=runner.state_keys(),
        dead_letters=stats.dead_letters,
        batches=stats.batches,
    )


def beat(store: ZkStore, runners: Iterable[TaskRunner], *, clock: Callable[[], float] = time.time) -> int:
    """Write one heartbeat per running task; returns how many were written."""
    written = 0
    for runner in runners:
        topology_id, task_id = runner.key
        path = ZkPaths.heartbeat(topology_id, task_id)
        data = heartbeat_record(runner, clock()).to_json_obj()
        try:
            if store.exists(path):
                store.set_json(path, data)
            else:
                store.create_json(path, data, ephemeral=True)
            written += 1
        except CoordinationError as e:
            logger.warning("heartbeat of %s/%d not written: %s", topology_id, task_id, e)
    return written
