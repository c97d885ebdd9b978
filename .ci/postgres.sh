#!/usr/bin/env bash
# A throwaway PostgreSQL for the tests: initdb and pg_ctl in a temporary directory, on
# a free 127.0.0.1 port with the socket in that directory; stopped and removed on exit.
#   bash .ci/postgres.sh COMMAND ARGS...   runs COMMAND with STATEMACHINE_TEST_POSTGRES
#                                          set to the server's URL (no database part)
# initdb refuses to run as root: as root, the server runs as `nobody`.
set -euo pipefail
find_bin() {
  local found
  found="$(command -v pg_ctl || ls -d /usr/lib/postgresql/*/bin/pg_ctl 2>/dev/null | sort -V | tail -1 || true)"
  [ -n "$found" ] && dirname "$found"
}
BIN="${PG_BIN:-$(find_bin || true)}"
if [ -z "$BIN" ]; then
  # Not installed: Debian's package (the package registries are reachable from CI).
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null \
      || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null; }
  fi
  BIN="$(find_bin || true)"
  [ -n "$BIN" ] || { echo "postgres.sh: PostgreSQL (pg_ctl) not found and could not be installed" >&2; exit 1; }
fi
DIR="$(mktemp -d /tmp/statemachine-pg.XXXXXX)"
PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')"
AS=()
if [ "$(id -u)" = 0 ]; then
  chown nobody "$DIR"
  AS=("$(command -v runuser || echo /usr/sbin/runuser)" -u nobody --)
fi
stop() {
  "${AS[@]}" "$BIN/pg_ctl" -D "$DIR/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$DIR"
}
trap stop EXIT
"${AS[@]}" "$BIN/initdb" -D "$DIR/data" -U postgres -A trust --no-sync -E UTF8 >"$DIR/initdb.log" 2>&1 \
  || { cat "$DIR/initdb.log" >&2; exit 1; }
"${AS[@]}" "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w -t 60 \
  -o "-h 127.0.0.1 -p $PORT -k $DIR -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" \
  start >/dev/null || { cat "$DIR/server.log" >&2; exit 1; }
export STATEMACHINE_TEST_POSTGRES="postgresql+psycopg://postgres@127.0.0.1:$PORT"
"$@"
