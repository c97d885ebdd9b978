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
say() { echo "run.sh: $*" >&2; }
if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV ($("$PY" --version 2>&1))"
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
STRANDS="$ROOT/examples/conformance/strands-requirements.txt"
AUTOGEN="$ROOT/examples/conformance/autogen-requirements.txt"
hash="$(cat "$ROOT/pyproject.toml" "$STRANDS" "$AUTOGEN" | sha256sum | cut -c1-16)"
# The editable install is strict (pyproject.toml says why): it links each file of the
# package, so once a file is added or removed the package alone is installed again.
files="$( (cd "$ROOT" && find statemachine specs -type f ! -path '*/__pycache__/*' \
  | LC_ALL=C sort) | sha256sum | cut -c1-16)"
if [ ! -f "$VENV/.installed-dev-$hash" ] && [ ! -f "$VENV/.installed-$extra-$hash" ]; then
  # pip names each package as it fetches and installs it, so a first run is never silent.
  if [ "$extra" = dev ]; then
    say "installing agent-statemachine[dev] into .venv: linters, SDKs, Hypothesis, pygraphviz,"
    say "DBOS, the docs generator (first run or pyproject.toml changed; a few minutes)"
  else
    say "installing agent-statemachine (the core) into .venv (first run; about a minute)"
  fi
  "$VENV/bin/python" -m pip install --progress-bar off --disable-pip-version-check -e "$spec"
  if [ "$extra" = dev ]; then
    # The conformance kit's tests run strands-agents, a peer whose own pins conflict with
    # this package's mcp; its loop does not import mcp, so it is installed without its
    # resolution, at the versions that file pins (see the file).
    say "installing strands-agents for the conformance kit's tests ($STRANDS)"
    "$VENV/bin/python" -m pip install --progress-bar off --disable-pip-version-check \
      --no-deps -r "$STRANDS"
    # autogen-agentchat, the same way: autogen-core pins protobuf 5, the [dev] extra has 7.
    say "installing autogen-agentchat for the conformance kit's tests ($AUTOGEN)"
    "$VENV/bin/python" -m pip install --progress-bar off --disable-pip-version-check \
      --no-deps -r "$AUTOGEN"
  fi
  say "installed"
  rm -f "$VENV"/.installed-* "$VENV"/.files-*
  touch "$VENV/.installed-$extra-$hash" "$VENV/.files-$files"
fi
if [ ! -f "$VENV/.files-$files" ]; then
  say "the package's files changed since it was installed: installing it again"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -e "$ROOT"
  rm -f "$VENV"/.files-*
  touch "$VENV/.files-$files"
fi
shift || true
case "$job" in
  test)
    cd "$ROOT"
    say "ruff check"
    "$VENV/bin/ruff" check .
    say "ruff format --check"
    "$VENV/bin/ruff" format --check .
    say "mypy --strict (a minute or two the first time, then cached)"
    "$VENV/bin/mypy"
    say "the docs site: zensical build --strict"
    STATEMACHINE_SITE_DIR="$VENV/site" "$VENV/bin/zensical" build --strict -f mkdocs.yml
    say "the test suite: pytest"
    exec "$VENV/bin/python" -m pytest "$@"
    ;;
  *)
    exec "$VENV/bin/python" -m statemachine "$job" "$@"
    ;;
esac
