#!/usr/bin/env bash
# One entry point for people and CI: sets up .venv on first use, then runs a job.
#   bash run.sh demo [DIR]   the seed's checkpoint script on DIR, with the embedded model
#   bash run.sh test         ruff, mypy --strict, then the test suite
#   bash run.sh <anything>   python -m statemachine <anything> (spec, check, diagram, ...)
set -euo pipefail
cd "$(dirname "$0")"
PY="${PYTHON:-python3}"
VENV=.venv
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
# Reinstall when pyproject.toml changes (the stamp holds its hash).
stamp="$VENV/.installed-$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  "$VENV/bin/python" -m pip install --quiet --upgrade pip >/dev/null
  "$VENV/bin/python" -m pip install --quiet -e '.[dev]'
  rm -f "$VENV"/.installed-*
  touch "$stamp"
fi
job="${1:-test}"
shift || true
case "$job" in
  test)
    "$VENV/bin/ruff" check .
    "$VENV/bin/ruff" format --check .
    "$VENV/bin/mypy"
    exec "$VENV/bin/python" -m pytest "$@"
    ;;
  *)
    exec "$VENV/bin/python" -m statemachine "$job" "$@"
    ;;
esac
