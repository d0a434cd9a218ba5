#!/usr/bin/env bash
# A Spark standalone worker, in the foreground: spark-worker.sh [port [web UI port]]
# (defaults SPARK_WORKER_PORT / SPARK_WORKER_WEBUI_PORT; give others to run two on one host).
# Executors it launches are its children, in its process group.
source "$(dirname "$0")/_common.sh"
need STREAM_OPS_HOST "this host's address, reachable from the master and the drivers"
need SPARK_MASTER_URL "the master, spark://host:port (or set SPARK_MASTER_HOST)"
need SPARK_WORKER_DIR "local scratch space for executors"

PORT="${1:-${SPARK_WORKER_PORT:-0}}"
WEBUI_PORT="${2:-${SPARK_WORKER_WEBUI_PORT:-8081}}"
export SPARK_HOME
SPARK_HOME="$(pyspark_home)"
export SPARK_LOCAL_IP="$STREAM_OPS_HOST"
export SPARK_DAEMON_MEMORY="${SPARK_DAEMON_MEMORY:-512m}"
export SPARK_WORKER_OPTS="-Dspark.worker.cleanup.enabled=true ${SPARK_WORKER_OPTS:-}"
WORK_DIR="$SPARK_WORKER_DIR/worker-$WEBUI_PORT"
mkdir -p "$WORK_DIR"
exec "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.worker.Worker "$SPARK_MASTER_URL" \
    --host "$STREAM_OPS_HOST" \
    --port "$PORT" \
    --webui-port "$WEBUI_PORT" \
    --cores "${SPARK_WORKER_CORES:-2}" \
    --memory "${SPARK_WORKER_MEMORY:-2g}" \
    --work-dir "$WORK_DIR"
