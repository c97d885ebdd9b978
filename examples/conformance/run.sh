#!/usr/bin/env bash
# Runs the conformance kit against the seven peers and writes examples/conformance/results.md.
#   bash examples/conformance/run.sh [--examples N] [--seed S] [--peer NAME ...]
# Python peers (PydanticAI, OpenAI Agents SDK, LangGraph, smolagents, strands-agents,
# autogen-agentchat) run in-process, in a venv of their own, examples/conformance/.venv,
# built here on first use from bench/requirements.txt, requirements.txt,
# strands-requirements.txt and autogen-requirements.txt beside this script (all pin every
# version; strands-agents and autogen-agentchat without their own resolution, see those
# files), plus this package, editable; pi-agent-core runs in Node.js through the
# bridge, installed here by install-pi.sh. Only PyPI and the npm registry are contacted.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="$HERE/.venv"
if [ ! -x "$VENV/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$VENV"
fi
# Reinstall when the pins or the package's own dependencies change.
stamp="$VENV/.installed-$(cat "$ROOT/bench/requirements.txt" "$HERE/requirements.txt" \
  "$HERE/strands-requirements.txt" "$HERE/autogen-requirements.txt" "$ROOT/pyproject.toml" \
  | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  "$VENV/bin/python" -m pip install --quiet -r "$ROOT/bench/requirements.txt" \
    -r "$HERE/requirements.txt"
  "$VENV/bin/python" -m pip install --quiet --no-deps -r "$HERE/strands-requirements.txt"
  "$VENV/bin/python" -m pip install --quiet --no-deps -r "$HERE/autogen-requirements.txt"
  "$VENV/bin/python" -m pip install --quiet -e "$ROOT[test]"
  rm -f "$VENV"/.installed-*
  touch "$stamp"
fi
if [ ! -d "$HERE/pi/node_modules/@mariozechner/pi-agent-core" ]; then
  bash "$HERE/install-pi.sh"
fi
exec "$VENV/bin/python" "$HERE/conformance.py" "$@"
