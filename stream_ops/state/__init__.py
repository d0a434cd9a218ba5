"""Keyed state with Trident's txid rules, stored in RocksDB and rebuilt from a state topic."""

from stream_ops.state.backing import BackingMap, MemoryBackingMap
from stream_ops.state.changelog import ChangelogEntry, StateTopicQueue, rebuild_store, replay_changelog
from stream_ops.state.keys import Key, as_key
from stream_ops.state.map_states import MapState, OpaqueMapState, TransactionalMapState, UpdateFn
from stream_ops.state.rocksdb_backing import RocksDBBackingMap
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
    "ChangelogEntry",
    "Key",
    "MapState",
    "MemoryBackingMap",
    "OpaqueMapState",
    "OpaqueValue",
    "RocksDBBackingMap",
    "StateTopicQueue",
    "TransactionalMapState",
    "TransactionalValue",
    "UpdateFn",
    "as_key",
    "decode_stored",
    "encode_stored",
    "from_json_obj",
    "rebuild_store",
    "replay_changelog",
    "to_json_obj",
]
