"""ZooKeeper coordination: znode paths, typed JSON access over kazoo, an embedded server.

Only this package talks to kazoo. Build paths with :class:`ZkPaths`, read and write through
:class:`ZkStore`, watch with :func:`watch_children` / :func:`watch_data`, lock with
:func:`hold_lock`, elect a leader with :class:`LeaderElection`, read the shared cluster records
with :mod:`~stream_ops.coordination.cluster_state`, and run a local server with
:class:`EmbeddedZooKeeper`.
"""

from stream_ops.coordination.election import LeaderElection, election_contenders
from stream_ops.coordination.embedded import EmbeddedZooKeeper
from stream_ops.coordination.lock import hold_lock
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.session import ConnectionState
from stream_ops.coordination.store import ZkStore, decode_json, encode_json
from stream_ops.coordination.watches import watch_children, watch_data
from stream_ops.jvm_server import serve_forever

__all__ = [
    "ConnectionState",
    "EmbeddedZooKeeper",
    "LeaderElection",
    "ZkPaths",
    "ZkStore",
    "decode_json",
    "election_contenders",
    "encode_json",
    "hold_lock",
    "serve_forever",
    "watch_children",
    "watch_data",
]
