#!/usr/bin/env bash
# The Spark standalone master, in the foreground (bin/spark-class from the pyspark wheel).
source "$(dirname "$0")/_common.sh"
need SPARK_MASTER_HOST "the master's address, reachable from workers and stream_ops workers"

export SPARK_HOME
SPARK_HOME="$(pyspark_home)"
# Daemons and their web UI bind to this address only, not to every interface.
export SPARK_LOCAL_IP="$SPARK_MASTER_HOST"
export SPARK_DAEMON_MEMORY="${SPARK_DAEMON_MEMORY:-512m}"
# No REST submission server: it would run any jar posted to it, without authentication.
export SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false ${SPARK_MASTER_OPTS:-}"
exec "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.master.Master \
    --host "$SPARK_MASTER_HOST" \
    --port "${SPARK_MASTER_PORT:-7077}" \
    --webui-port "${SPARK_MASTER_WEBUI_PORT:-8080}"
