"""Open a keyed task's local state: reuse the RocksDB store, catch it up, or rebuild it.

The local store is reused as it is when its applied marker is exactly the committed (txid,
epoch) recorded in ZooKeeper. A store that holds an earlier *committed* state (a standby
replica's, or one left from an earlier stay of the task on this worker) catches up by applying
only the state-topic tail above its marker (:func:`~stream_ops.state.restore.catch_up_store`).
Anything else (a batch applied but never committed, a tail compacted away, no store at all)
means rebuilding it from the snapshot and the state topic up to the committed txid (DESIGN
invariant 5).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from stream_ops.state.map_states import MapState, OpaqueMapState, TransactionalMapState
from stream_ops.state.restore import catch_up_store, rebuild_store
from stream_ops.state.rocksdb_backing import RocksDBBackingMap
from stream_ops.state.state_topic import StateTopicQueue
from stream_ops.topics.file_topic import FileTopic

logger = logging.getLogger(__name__)

MAP_STATES: dict[str, type[TransactionalMapState | OpaqueMapState | MapState]] = {
    "transactional": TransactionalMapState,
    "opaque": OpaqueMapState,
    "non-transactional": MapState,
}


@dataclass
class TaskState:
    """The keyed state of one task: local store, map-state rules and state-topic queue."""

    store: RocksDBBackingMap
    map_state: TransactionalMapState | OpaqueMapState | MapState | None
    state_topic: StateTopicQueue
    restored_keys: int
    rebuilt: bool
    tail_keys: int | None = None
    """Changed keys applied from the state-topic tail when the store caught up (None: it did not)."""

    def close(self) -> None:
        self.store.close()


def open_task_state(
    *,
    store_dir: Path,
    state_topic: FileTopic,
    queue: int,
    kind: str | None,
    committed_txid: int,
    committed_epoch: int,
    snapshot_dir: Path | None = None,
) -> TaskState:
    """Open (or rebuild) the local store of a stateful task.

    ``kind`` is the map-state kind of a keyed stage, or None for a stage whose processor
    keeps its own state in the store (join windows, processing elements).
    """
    queue_log = StateTopicQueue(state_topic, queue)
    expected = None if committed_txid < 0 else (committed_txid, committed_epoch)
    rebuilt = True
    tail: int | None = None
    if store_dir.exists():
        store = RocksDBBackingMap(store_dir)
        marker = store.applied_marker()
        if marker != expected and expected is not None:
            tail = catch_up_store(store, queue_log, *expected)
        if marker == expected or tail is not None:
            rebuilt = False
        else:
            logger.info("local store %s is at %s, committed is %s: rebuilding from the state topic", store_dir, marker, expected)
            store.close()
            RocksDBBackingMap.destroy(store_dir)
    restored = 0
    if rebuilt:
        store_dir.parent.mkdir(parents=True, exist_ok=True)
        store = RocksDBBackingMap(store_dir)
        if committed_txid >= 0:
            restored = rebuild_store(
                store, queue_log, committed_txid, committed_epoch, snapshot_dir=snapshot_dir, require_complete=True
            )
    map_state = MAP_STATES[kind](store) if kind is not None else None
    return TaskState(
        store=store, map_state=map_state, state_topic=queue_log, restored_keys=restored, rebuilt=rebuilt, tail_keys=tail
    )
