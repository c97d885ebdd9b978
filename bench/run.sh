#!/usr/bin/env bash
# The benchmark, one command: builds bench/.venv (the peers pinned in
# bench/requirements.txt, plus this package, editable) on first use, then runs the
# harness and writes bench/results.md.
#   bash bench/run.sh            the full run (about 5-10 minutes on 2 cores)
#   bash bench/run.sh --smoke    N=10, one run per contender (seconds)
#   bash bench/run.sh --help     the harness's other options (--ns, --only, --json ...)
#   bash bench/run.sh scale      many runs at once in one process: writes bench/scale.md
#   bash bench/run.sh durable-scale   durable runs at once over two worker processes, on
#                                SQLite and (under bash .ci/postgres.sh) PostgreSQL:
#                                writes bench/durable_scale.md
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
VENV=bench/.venv
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
# Reinstall when the pins or the package's own dependencies change.
stamp="$VENV/.installed-$(cat bench/requirements.txt pyproject.toml | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  "$VENV/bin/python" -m pip install --quiet --upgrade pip >/dev/null
  "$VENV/bin/python" -m pip install --quiet -r bench/requirements.txt
  "$VENV/bin/python" -m pip install --quiet -e '.[test,dbos]'
  rm -f "$VENV"/.installed-*
  touch "$stamp"
fi
if [ "${1:-}" = scale ]; then
  shift
  if [ "$#" -eq 0 ]; then
    set -- --out bench/scale.md
  fi
  exec "$VENV/bin/python" bench/scale.py "$@"
fi
if [ "${1:-}" = durable-scale ]; then
  shift
  if [ "$#" -eq 0 ]; then
    set -- --out bench/durable_scale.md
  fi
  exec "$VENV/bin/python" bench/durable_scale.py "$@"
fi
args=("$@")
if [ "${#args[@]}" -eq 0 ]; then
  args=(--out bench/results.md)
fi
exec "$VENV/bin/python" bench/harness.py "${args[@]}"
