"""ZooKeeper coordination: znode paths, typed JSON access over kazoo, an embedded server.

Only this package talks to kazoo. Build paths with :class:`ZkPaths`, read and write through
:class:`ZkStore`, and run a local server with :class:`EmbeddedZooKeeper`.
"""

from stream_ops.coordination.embedded import EmbeddedZooKeeper, find_java, serve_forever
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore, decode_json, encode_json

__all__ = [
    "EmbeddedZooKeeper",
    "ZkPaths",
    "ZkStore",
    "decode_json",
    "encode_json",
    "find_java",
    "serve_forever",
]
