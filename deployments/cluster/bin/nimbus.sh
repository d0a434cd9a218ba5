#!/usr/bin/env bash
# The nimbus heartbeat monitor, in the foreground. Run it on two or three hosts: one is elected
# leader through ZooKeeper, the others wait to take over.
source "$(dirname "$0")/_common.sh"
load_secrets STREAM_OPS_ZK_AUTH  # it moves tasks, never queries state
stream_ops_cli nimbus \
    --interval "${STREAM_OPS_NIMBUS_INTERVAL:-1.0}" \
    --task-timeout "${STREAM_OPS_TASK_TIMEOUT:-10.0}" \
    "$@"
