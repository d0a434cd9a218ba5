#!/usr/bin/env bash
# One member of the ZooKeeper ensemble, in the foreground: zookeeper.sh <server id>
# Writes $ZK_DATA_DIR/server-<id>/{zoo.cfg,myid} from ZK_SERVERS and execs the JVM
# (org.apache.zookeeper.server.quorum.QuorumPeerMain from pyspark's jars); logs go to stdout.
source "$(dirname "$0")/_common.sh"

MYID="${1:-}"
[[ "$MYID" =~ ^[0-9]+$ ]] || die "usage: $0 <server id>   (the id of this host's entry in ZK_SERVERS)"
need ZK_SERVERS "the ZooKeeper ensemble, id=host:quorumPort:electionPort:clientPort ..."
need ZK_DATA_DIR "where this server keeps snapshots and logs"

args=(run --myid "$MYID" --servers "$ZK_SERVERS" --data-dir "$ZK_DATA_DIR/server-$MYID"
      --tick-time "${ZK_TICK_TIME_MS:-1000}")
[[ -n "${ZK_CLIENT_BIND:-}" ]] && args+=(--client-bind "$ZK_CLIENT_BIND")
[[ -n "${ZK_HEAP:-}" ]] && args+=(--heap "$ZK_HEAP")
[[ -n "${ZK_SUPER_DIGEST:-}" ]] && args+=(--super-digest "$ZK_SUPER_DIGEST")
exec "$PY" -m stream_ops.coordination.ensemble "${args[@]}"
