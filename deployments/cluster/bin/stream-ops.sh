#!/usr/bin/env bash
# Any stream-ops verb against this cluster, e.g.
#   stream-ops.sh submit stream_ops.examples.wordcount:topology --workers 4
#   stream-ops.sh status wordcount
#   stream-ops.sh query wordcount words the cow
source "$(dirname "$0")/_common.sh"
load_secrets "${STREAM_OPS_SECRETS[@]}"
stream_ops_cli "$@"
