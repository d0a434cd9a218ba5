#!/usr/bin/env bash
# One stream_ops worker slot, in the foreground: stream-ops-worker.sh <port> [stream-ops worker options]
# It registers as $STREAM_OPS_HOST:<port>, serves state queries on that port, and runs its tasks
# as one Spark application on the standalone cluster (SPARK_EXECUTOR_*, SPARK_APP_CORES_MAX).
# Queries need the bearer token derived from STREAM_OPS_ZK_AUTH (or STREAM_OPS_QUERY_TOKEN, both
# from secrets.env); with STREAM_OPS_QUERY_TLS_CERT/_KEY/_CA (cluster.env) the port serves https.
source "$(dirname "$0")/_common.sh"
load_secrets "${STREAM_OPS_SECRETS[@]}"

PORT="${1:-}"
[[ "$PORT" =~ ^[0-9]+$ ]] || die "usage: $0 <slot port> [stream-ops worker options]"
shift
need STREAM_OPS_HOST "this host's address, reachable by other stream_ops processes and Spark executors"
need SPARK_MASTER_URL "the Spark master, spark://host:port (or set SPARK_MASTER_HOST)"

tls_args=()
if [[ -n "${STREAM_OPS_QUERY_TLS_CERT:-}${STREAM_OPS_QUERY_TLS_KEY:-}${STREAM_OPS_QUERY_TLS_CA:-}" ]]; then
    for name in STREAM_OPS_QUERY_TLS_CERT STREAM_OPS_QUERY_TLS_KEY STREAM_OPS_QUERY_TLS_CA; do
        need "$name" "TLS of the query port needs the certificate, its key and the CA"
        [[ -r "${!name}" ]] || die "$name=${!name} is not a readable file"
    done
    tls_args=(--query-tls-cert "$STREAM_OPS_QUERY_TLS_CERT" --query-tls-key "$STREAM_OPS_QUERY_TLS_KEY")
fi

stream_ops_cli worker \
    --host "$STREAM_OPS_HOST" \
    --port "$PORT" \
    --bind-host "${STREAM_OPS_QUERY_BIND:-$STREAM_OPS_HOST}" \
    --spark-master "$SPARK_MASTER_URL" \
    --spark-conf "spark.driver.host=$STREAM_OPS_HOST" \
    --spark-conf "spark.driver.bindAddress=$STREAM_OPS_HOST" \
    --spark-conf "spark.executor.memory=${SPARK_EXECUTOR_MEMORY:-512m}" \
    --spark-conf "spark.executor.cores=${SPARK_EXECUTOR_CORES:-1}" \
    --spark-conf "spark.cores.max=${SPARK_APP_CORES_MAX:-1}" \
    --trigger-seconds "${STREAM_OPS_TRIGGER_SECONDS:-1.0}" \
    ${STREAM_OPS_SHUFFLE_TRIGGER_SECONDS:+--shuffle-trigger-seconds "$STREAM_OPS_SHUFFLE_TRIGGER_SECONDS"} \
    ${tls_args[@]+"${tls_args[@]}"} \
    "$@"
