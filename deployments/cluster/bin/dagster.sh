#!/usr/bin/env bash
# Dagster for the cluster, in the foreground: dagster.sh webserver | daemon
# Storage is PostgreSQL (dagster/dagster.yaml, copied into $DAGSTER_HOME); the code location is
# the project's `definitions` package, pointed at this cluster's ZooKeeper and shared path. The
# workers it launches read the state-query token (derived from STREAM_OPS_ZK_AUTH, or
# STREAM_OPS_QUERY_TOKEN) and TLS files (STREAM_OPS_QUERY_TLS_*) from this environment.
source "$(dirname "$0")/_common.sh"
load_secrets "${DAGSTER_SECRETS[@]}"

MODE="${1:-}"
need DAGSTER_HOME "the Dagster instance directory (dagster.yaml goes there)"
need DAGSTER_PG_HOST "the PostgreSQL server of the Dagster instance"
need DAGSTER_PG_PASSWORD "the password of DAGSTER_PG_USERNAME (in secrets.env)"
mkdir -p "$DAGSTER_HOME"
cp "$DEPLOY_DIR/dagster/dagster.yaml" "$DAGSTER_HOME/dagster.yaml"

export STREAM_OPS_ZOOKEEPER STREAM_OPS_CHROOT STREAM_OPS_HOME
STREAM_OPS_ZOOKEEPER="$(zk_connect)"
STREAM_OPS_CHROOT="${STREAM_OPS_CHROOT:-/stream_ops}"
WORKSPACE="$DEPLOY_DIR/dagster/workspace.yaml"
# The directory holding the `definitions` package (default: this checkout's root).
CODE_DIR="${STREAM_OPS_CODE_DIR:-$(cd "$DEPLOY_DIR/../.." && pwd)}"
[[ -d "$CODE_DIR/definitions" ]] || die "no definitions package in $CODE_DIR: set STREAM_OPS_CODE_DIR to the directory holding it"
cd "$CODE_DIR"
case "$MODE" in
    webserver)
        # Dagster OSS has no login: whoever reaches the webserver can launch and terminate runs.
        # It listens on loopback unless told otherwise; reach it through the authenticating
        # reverse proxy (dagster/nginx.conf.example), which may run on this host or on a private
        # interface given as DAGSTER_WEBSERVER_HOST.
        bind="${DAGSTER_WEBSERVER_HOST:-127.0.0.1}"
        case "$bind" in
            127.*|localhost|::1) ;;
            *) echo "warning: the Dagster webserver listens on $bind, not loopback: only an authenticating" \
                    "reverse proxy may reach it (see deployments/cluster/README.md, 'Dagster access')" >&2 ;;
        esac
        exec "$PY_BIN_DIR/dagster-webserver" -w "$WORKSPACE" -h "$bind" -p "${DAGSTER_WEBSERVER_PORT:-3000}" ;;
    daemon)
        exec "$PY_BIN_DIR/dagster-daemon" run -w "$WORKSPACE" ;;
    *)
        die "usage: $0 webserver|daemon" ;;
esac
