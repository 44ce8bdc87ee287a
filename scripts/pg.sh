#!/usr/bin/env bash
# Throwaway PostgreSQL cluster for the Dagster Postgres storage test.
#   eval "$(bash scripts/pg.sh start)"   -> exports AUTORESEARCH_PG_DIR, DAGSTER_PG_HOST/PORT/USERNAME/DB
#   bash scripts/pg.sh stop "$AUTORESEARCH_PG_DIR"   -> stops that cluster by its own pid, removes its dir
# Runs the server as the `postgres` user (it refuses root), trust auth, loopback only, a free port.
set -euo pipefail

die() { echo "pg.sh: $*" >&2; exit 1; }

pg_bin() {
  local bin
  bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -z "$bin" ]; then
    command -v apt-get >/dev/null || die "PostgreSQL is not installed and apt-get is unavailable"
    echo "pg.sh: installing postgresql with apt-get" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >&2 \
      || { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >&2; } \
      || die "apt-get install postgresql failed"
    bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
  fi
  echo "$bin"
}

as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

start() {
  local bin dir port user=postgres
  bin=$(pg_bin)
  dir=$(mktemp -d /tmp/autoresearch-pg.XXXXXX)
  [ "$(id -u)" = 0 ] && chown postgres: "$dir" || user=$(id -un)
  as_pg "$bin/initdb" -D "$dir/data" -A trust -U "$user" --no-sync >"$dir/initdb.log" 2>&1 \
    || { cat "$dir/initdb.log" >&2; die "initdb failed"; }
  for _ in 1 2 3 4 5; do
    port=$(free_port)
    if as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 30 \
         -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off" start >&2; then
      as_pg "$bin/createdb" -h 127.0.0.1 -p "$port" -U "$user" dagster >&2 || die "createdb failed"
      echo "export AUTORESEARCH_PG_DIR=$dir"
      echo "export DAGSTER_PG_HOST=127.0.0.1"
      echo "export DAGSTER_PG_PORT=$port"
      echo "export DAGSTER_PG_USERNAME=$user"
      echo "export DAGSTER_PG_DB=dagster"
      return 0
    fi
    tail -n 5 "$dir/server.log" >&2 || true  # most likely the port was taken between pick and bind
  done
  rm -rf "$dir"
  die "PostgreSQL did not start"
}

stop() {
  local dir=${1:-} pid
  [ -n "$dir" ] && [ -d "$dir" ] || die "stop needs the cluster dir printed by start (AUTORESEARCH_PG_DIR)"
  case "$dir" in /tmp/autoresearch-pg.*) ;; *) die "refusing to remove $dir: not a pg.sh cluster";; esac
  if [ -f "$dir/data/postmaster.pid" ]; then
    pid=$(head -n 1 "$dir/data/postmaster.pid")
    kill -TERM "$pid" 2>/dev/null || true  # SIGTERM = PostgreSQL's smart shutdown
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -QUIT "$pid" 2>/dev/null || true  # immediate shutdown
  fi
  rm -rf "$dir"
}

case "${1:-}" in
  start) start ;;
  stop) stop "${2:-}" ;;
  *) die "usage: pg.sh start | pg.sh stop DIR" ;;
esac
