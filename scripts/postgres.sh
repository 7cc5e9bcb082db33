#!/usr/bin/env bash
# A throwaway PostgreSQL server on loopback for the tests of the store's
# PostgreSQL dialect and of two sandboxd sharing one database (make test-go
# starts it). Debian's postgresql-15 (scripts/deps.sh installs it); its own
# data directory and port, so a PostgreSQL the machine already runs is not
# touched.
#
#   scripts/postgres.sh up     start it (initdb on first use) and print its DSN
#   scripts/postgres.sh dsn    print the DSN (whether or not it runs)
#   scripts/postgres.sh down   stop it and remove its data
#
# PGPORT (55432) and SANDBOXD_PG_DIR (/var/lib/sandboxd-postgres) move it.
# The role and database are both "sandboxd", password "sandboxd": it listens
# on 127.0.0.1 only and holds nothing but test data.
set -euo pipefail

port=${PGPORT:-55432}
dir=${SANDBOXD_PG_DIR:-/var/lib/sandboxd-postgres}
bin=/usr/lib/postgresql/15/bin
dsn="postgres://sandboxd:sandboxd@127.0.0.1:$port/sandboxd?sslmode=disable"

log() { echo "postgres.sh: $*" >&2; }
# PostgreSQL refuses to run as root; Debian's package made this user.
as_pg() { if [[ $(id -u) == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }
running() { as_pg "$bin/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; }

up() {
  [[ -x $bin/postgres ]] || { log "missing $bin/postgres: apt-get install postgresql-15 (scripts/deps.sh)"; exit 1; }
  if [[ ! -e $dir/data/PG_VERSION ]]; then
    mkdir -p "$dir"
    chown postgres: "$dir" 2>/dev/null || true
    local pw
    pw=$(mktemp)
    echo sandboxd >"$pw"
    chown postgres: "$pw" 2>/dev/null || true
    as_pg "$bin/initdb" -D "$dir/data" -U sandboxd --pwfile="$pw" -A scram-sha-256 -E UTF8 --locale=C.UTF-8 >/dev/null
    rm -f "$pw"
    {
      echo "listen_addresses = '127.0.0.1'"
      echo "port = $port"
      echo "unix_socket_directories = '$dir'"
      # Test data only: durability is not worth the fsyncs.
      echo "fsync = off"
      echo "synchronous_commit = off"
      echo "full_page_writes = off"
      echo "max_connections = 300"
    } >>"$dir/data/postgresql.conf"
  fi
  if ! running; then
    as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w -t 60 start >/dev/null
  fi
  if ! PGPASSWORD=sandboxd "$bin/psql" -h 127.0.0.1 -p "$port" -U sandboxd -d sandboxd -Atqc 'select 1' >/dev/null 2>&1; then
    PGPASSWORD=sandboxd "$bin/psql" -h 127.0.0.1 -p "$port" -U sandboxd -d postgres -Atqc 'create database sandboxd' >/dev/null
  fi
  echo "$dsn"
}

case ${1:-} in
up) up ;;
dsn) echo "$dsn" ;;
down)
  if [[ -e $dir/data/PG_VERSION ]] && running; then as_pg "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null; fi
  rm -rf "$dir"
  ;;
*) log "usage: $0 up|dsn|down"; exit 2 ;;
esac
