"""Keyed state with Trident's txid rules, stored in RocksDB and rebuilt from a state topic."""

from stream_ops.state.backing import BackingMap, MemoryBackingMap
from stream_ops.state.kafka_state_topic import KafkaStateLog, KafkaStateTopic
from stream_ops.state.keys import Key, as_key
from stream_ops.state.map_states import MapState, OpaqueMapState, TransactionalMapState, UpdateFn
from stream_ops.state.restore import rebuild_store
from stream_ops.state.rocksdb_backing import RocksDBBackingMap
from stream_ops.state.snapshot import (
    CompactionResult,
    SnapshotInfo,
    compact_queue,
    latest_snapshot,
    read_snapshot,
    write_snapshot,
)
from stream_ops.state.state_log import FileStateLog, StateLog, open_state_log
from stream_ops.state.state_topic import (
    ReplayedChanges,
    StateTopicEntry,
    StateTopicQueue,
    replay_changes,
    replay_state_topic,
)
from stream_ops.state.values import (
    OpaqueValue,
    TransactionalValue,
    decode_stored,
    encode_stored,
    from_json_obj,
    to_json_obj,
)

__all__ = [
    "BackingMap",
    "StateTopicEntry",
    "CompactionResult",
    "FileStateLog",
    "KafkaStateLog",
    "KafkaStateTopic",
    "Key",
    "MapState",
    "MemoryBackingMap",
    "OpaqueMapState",
    "OpaqueValue",
    "ReplayedChanges",
    "RocksDBBackingMap",
    "SnapshotInfo",
    "StateLog",
    "StateTopicQueue",
    "TransactionalMapState",
    "TransactionalValue",
    "UpdateFn",
    "as_key",
    "compact_queue",
    "decode_stored",
    "encode_stored",
    "from_json_obj",
    "latest_snapshot",
    "open_state_log",
    "read_snapshot",
    "rebuild_store",
    "replay_state_topic",
    "replay_changes",
    "to_json_obj",
    "write_snapshot",
]
