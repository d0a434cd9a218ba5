#!/usr/bin/env bash
# Mode of every ensemble member as JSON ({"1": "follower", "2": "leader", "3": null}); exit 0 when
# there is a leader. `zookeeper-status.sh --wait [seconds]` waits for a leader and all followers.
source "$(dirname "$0")/_common.sh"
need ZK_SERVERS "the ZooKeeper ensemble, id=host:quorumPort:electionPort:clientPort ..."
if [[ "${1:-}" == "--wait" ]]; then
    exec "$PY" -m stream_ops.coordination.ensemble wait --servers "$ZK_SERVERS" --timeout "${2:-60}"
fi
exec "$PY" -m stream_ops.coordination.ensemble status --servers "$ZK_SERVERS"
