#!/usr/bin/env bash
# One entry point for people and CI: sets up .venv on first use, then runs a job.
#   bash run.sh demo [DIR]   the seed's checkpoint script on DIR (default: the current
#                            directory), with the embedded scripted model
#   bash run.sh test         ruff, mypy --strict, then the test suite
#   bash run.sh <anything>   python -m statemachine <anything> (spec, check, diagram, ...)
# Paths given to a job are read from the directory you call it from.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")" && pwd)"
PY="${PYTHON:-python3}"
VENV="$ROOT/.venv"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
# Reinstall when pyproject.toml changes (the stamp holds its hash).
stamp="$VENV/.installed-$(sha256sum "$ROOT/pyproject.toml" | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  "$VENV/bin/python" -m pip install --quiet --upgrade pip >/dev/null
  "$VENV/bin/python" -m pip install --quiet -e "$ROOT[dev]"
  rm -f "$VENV"/.installed-*
  touch "$stamp"
fi
job="${1:-test}"
shift || true
case "$job" in
  test)
    cd "$ROOT"
    "$VENV/bin/ruff" check .
    "$VENV/bin/ruff" format --check .
    "$VENV/bin/mypy"
    exec "$VENV/bin/python" -m pytest "$@"
    ;;
  *)
    exec "$VENV/bin/python" -m statemachine "$job" "$@"
    ;;
esac
