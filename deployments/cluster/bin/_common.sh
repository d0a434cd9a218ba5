# Sourced by the scripts in this directory: loads the cluster environment, defines helpers.
# Settings come from $STREAM_OPS_CLUSTER_ENV (default ../cluster.env); secrets, for the scripts
# that need them, from $STREAM_OPS_SECRETS_FILE (default ../secrets.env).
set -euo pipefail

BIN_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DEPLOY_DIR="$(dirname "$BIN_DIR")"
CLUSTER_ENV="${STREAM_OPS_CLUSTER_ENV:-$DEPLOY_DIR/cluster.env}"

die() { echo "error: $*" >&2; exit 1; }

[[ -f "$CLUSTER_ENV" ]] || die "no cluster environment file $CLUSTER_ENV: copy $DEPLOY_DIR/cluster.env.example to it and edit the addresses (or set STREAM_OPS_CLUSTER_ENV)"
set -a
# shellcheck disable=SC1090
source "$CLUSTER_ENV"
set +a

# need VAR "what it is": fail with a clear message when a setting is missing or empty.
need() {
    local name="$1"
    [[ -n "${!name:-}" ]] || die "$name is not set: $2 (set it in $CLUSTER_ENV or the environment)"
}

# load_secrets NAME...: export only the named secrets from the secrets file into this script's
# process (and so into the one it execs), never the whole file: a stream_ops worker gets the
# ZooKeeper credentials and the query token, not the PostgreSQL password, which any topology's
# code could otherwise read from its environment. The file is sourced in a subshell that prints
# only the requested values; the rest of it never reaches this process.
load_secrets() {
    local file="${STREAM_OPS_SECRETS_FILE:-$DEPLOY_DIR/secrets.env}" name value
    if [[ ! -f "$file" ]]; then
        echo "warning: no secrets file $file: without STREAM_OPS_ZK_AUTH, stream_ops workers, the nimbus and the" \
             "supervisor refuse to start (copy $DEPLOY_DIR/secrets.env.example to it and chmod 600)" >&2
        return 0
    fi
    if [[ -n "$(find "$file" -perm /077 2>/dev/null)" ]]; then
        die "$file is readable by other users: chmod 600 $file"
    fi
    for name in "$@"; do
        [[ "$name" =~ ^[A-Z_][A-Z0-9_]*$ ]] || die "load_secrets: bad variable name $name"
        # shellcheck disable=SC1090
        value="$(set +u; source "$file" >/dev/null 2>&1; printf '%s' "${!name-}")" || die "cannot read $file"
        if [[ -n "$value" ]]; then
            export "$name=$value"
        fi
    done
}

# The secrets each kind of process needs (see secrets.env.example): stream_ops workers and the CLI
# the ZooKeeper credentials and the query token; Dagster those and the PostgreSQL password.
STREAM_OPS_SECRETS=(STREAM_OPS_ZK_AUTH STREAM_OPS_QUERY_TOKEN)
DAGSTER_SECRETS=(STREAM_OPS_ZK_AUTH STREAM_OPS_QUERY_TOKEN DAGSTER_PG_PASSWORD)

PY="${STREAM_OPS_PYTHON:-python3}"
command -v "$PY" >/dev/null 2>&1 || die "STREAM_OPS_PYTHON=$PY is not an executable Python; install stream-ops and point it at that interpreter"
PY_BIN_DIR="$(dirname "$(command -v "$PY")")"

SPARK_MASTER_URL="${SPARK_MASTER_URL:-}"
if [[ -z "$SPARK_MASTER_URL" && -n "${SPARK_MASTER_HOST:-}" ]]; then
    SPARK_MASTER_URL="spark://${SPARK_MASTER_HOST}:${SPARK_MASTER_PORT:-7077}"
fi
export SPARK_MASTER_URL

# The pyspark wheel is the Spark distribution: bin/spark-class and jars/ (ZooKeeper included).
pyspark_home() {
    "$PY" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))'
}

# The ZooKeeper clients' host:port list, from ZK_SERVERS.
zk_connect() {
    need ZK_SERVERS "the ZooKeeper ensemble, id=host:quorumPort:electionPort:clientPort ..."
    "$PY" -m stream_ops.coordination.ensemble connect-string --servers "$ZK_SERVERS"
}

# stream_ops CLI with this cluster's global options (credentials come from the environment:
# STREAM_OPS_ZK_AUTH, STREAM_OPS_ZK_OPEN_READS, the state-query token derived from STREAM_OPS_ZK_AUTH
# or STREAM_OPS_QUERY_TOKEN, and the query CA STREAM_OPS_QUERY_TLS_CA).
stream_ops_cli() {
    need STREAM_OPS_HOME "the shared path (dist store, topics, checkpoints)"
    local zk
    zk="$(zk_connect)"
    exec "$PY" -m stream_ops.cli \
        --zookeeper "$zk" \
        --chroot "${STREAM_OPS_CHROOT:-/stream_ops}" \
        --home "$STREAM_OPS_HOME" \
        --session-timeout "${STREAM_OPS_SESSION_TIMEOUT:-10}" \
        "$@"
}
