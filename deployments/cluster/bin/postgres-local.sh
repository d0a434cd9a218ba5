#!/usr/bin/env bash
# A PostgreSQL for the Dagster instance on this host, from Debian's `postgresql` package
# (apt-get install -y postgresql): postgres-local.sh start | stop | status
#   start: initdb into $POSTGRES_LOCAL_DIR/data the first time (superuser $DAGSTER_PG_USERNAME,
#          password $DAGSTER_PG_PASSWORD, scram-sha-256 over TCP), start it listening on
#          $DAGSTER_PG_HOST:$DAGSTER_PG_PORT, create database $DAGSTER_PG_DB if missing.
# For a production cluster use your managed PostgreSQL instead and set DAGSTER_PG_* to it.
source "$(dirname "$0")/_common.sh"
load_secrets DAGSTER_PG_PASSWORD

need POSTGRES_LOCAL_DIR "the directory of the local PostgreSQL (data, socket, log)"
need DAGSTER_PG_HOST "the address PostgreSQL listens on"
need DAGSTER_PG_PORT "the port PostgreSQL listens on"
need DAGSTER_PG_USERNAME "the Dagster database user"
need DAGSTER_PG_PASSWORD "the Dagster database password (in secrets.env)"
need DAGSTER_PG_DB "the Dagster database"

PG_BIN="${POSTGRES_BIN_DIR:-}"
if [[ -z "$PG_BIN" ]]; then
    PG_BIN="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
fi
[[ -x "$PG_BIN/initdb" ]] || die "no PostgreSQL server binaries (looked in ${PG_BIN:-/usr/lib/postgresql/*/bin}): apt-get install -y postgresql, or set POSTGRES_BIN_DIR"

DATA="$POSTGRES_LOCAL_DIR/data"
SOCKETS="$POSTGRES_LOCAL_DIR/run"
LOG="$POSTGRES_LOCAL_DIR/postgres.log"

# PostgreSQL refuses to run as root: as root, run its programs as the `postgres` system user.
as_pg() {
    if [[ "$(id -u)" == 0 ]]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

case "${1:-}" in
    start)
        mkdir -p "$POSTGRES_LOCAL_DIR" "$SOCKETS"
        if [[ "$(id -u)" == 0 ]]; then
            chown postgres: "$POSTGRES_LOCAL_DIR" "$SOCKETS"
        fi
        if [[ ! -f "$DATA/PG_VERSION" ]]; then
            pwfile="$POSTGRES_LOCAL_DIR/.pwfile"
            (umask 077; printf '%s\n' "$DAGSTER_PG_PASSWORD" > "$pwfile")
            [[ "$(id -u)" == 0 ]] && chown postgres: "$pwfile"
            as_pg "$PG_BIN/initdb" -D "$DATA" -U "$DAGSTER_PG_USERNAME" --pwfile="$pwfile" \
                --auth-host=scram-sha-256 --auth-local=scram-sha-256 -E UTF8 --no-instructions >/dev/null
            rm -f "$pwfile"
        fi
        as_pg "$PG_BIN/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 \
            -o "-c listen_addresses=$DAGSTER_PG_HOST -p $DAGSTER_PG_PORT -k $SOCKETS" start >/dev/null
        export PGPASSWORD="$DAGSTER_PG_PASSWORD"
        exists="$("$PG_BIN/psql" -h "$DAGSTER_PG_HOST" -p "$DAGSTER_PG_PORT" -U "$DAGSTER_PG_USERNAME" -d postgres \
            -tAc "SELECT 1 FROM pg_database WHERE datname = '$DAGSTER_PG_DB'")"
        if [[ "$exists" != 1 ]]; then
            "$PG_BIN/createdb" -h "$DAGSTER_PG_HOST" -p "$DAGSTER_PG_PORT" -U "$DAGSTER_PG_USERNAME" "$DAGSTER_PG_DB"
        fi
        echo "PostgreSQL serving $DAGSTER_PG_DB on $DAGSTER_PG_HOST:$DAGSTER_PG_PORT (data $DATA, log $LOG)"
        ;;
    stop)
        if [[ -f "$DATA/postmaster.pid" ]]; then
            as_pg "$PG_BIN/pg_ctl" -D "$DATA" -m fast -w -t 60 stop >/dev/null
        fi
        echo "PostgreSQL in $DATA stopped"
        ;;
    status)
        exec "$PG_BIN/pg_isready" -h "$DAGSTER_PG_HOST" -p "$DAGSTER_PG_PORT"
        ;;
    *)
        die "usage: $0 start|stop|status"
        ;;
esac
