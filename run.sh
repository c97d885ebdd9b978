#!/usr/bin/env bash
# One entry point for people and CI: sets up .venv on first use, then runs a job.
#   bash run.sh demo [DIR]   the demo agent on DIR (default: the current directory),
#                            with the embedded scripted model
#   bash run.sh test         ruff, mypy --strict, the docs site (strict), the test suite
#   bash run.sh <anything>   python -m statemachine <anything> (spec, check, diagram, ...)
# Paths given to a job are read from the directory you call it from.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")" && pwd)"
PY="${PYTHON:-python3}"
VENV="$ROOT/.venv"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
job="${1:-test}"
# The demo needs only the core (a quick first run); every other job gets the [dev] extra
# (linters, SDKs, Hypothesis, pygraphviz). Reinstall when pyproject.toml changes (each
# stamp holds its hash; a dev install serves the demo too).
extra=dev
spec="$ROOT[dev]"
if [ "$job" = demo ]; then
  extra=core
  spec="$ROOT"
fi
hash="$(sha256sum "$ROOT/pyproject.toml" | cut -c1-16)"
if [ ! -f "$VENV/.installed-dev-$hash" ] && [ ! -f "$VENV/.installed-$extra-$hash" ]; then
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e "$spec"
  rm -f "$VENV"/.installed-*
  touch "$VENV/.installed-$extra-$hash"
fi
shift || true
case "$job" in
  test)
    cd "$ROOT"
    "$VENV/bin/ruff" check .
    "$VENV/bin/ruff" format --check .
    "$VENV/bin/mypy"
    STATEMACHINE_SITE_DIR="$VENV/site" "$VENV/bin/zensical" build --strict -f mkdocs.yml
    exec "$VENV/bin/python" -m pytest "$@"
    ;;
  *)
    exec "$VENV/bin/python" -m statemachine "$job" "$@"
    ;;
esac
