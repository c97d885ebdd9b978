#!/usr/bin/env bash
# Runs the conformance kit against the four peers and writes examples/conformance/results.md.
#   bash examples/conformance/run.sh [--examples N] [--seed S] [--peer NAME ...]
# Python peers (PydanticAI, OpenAI Agents SDK, LangGraph) run in-process, in the peers'
# venv bench/.venv (built by bench/run.sh from bench/requirements.txt, which pins them);
# pi-agent-core runs in Node.js through the bridge, installed here by install-pi.sh.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PY="$ROOT/bench/.venv/bin/python"
if [ ! -x "$PY" ]; then
  echo "bench/.venv is missing: build it with 'bash bench/run.sh' (it installs the pinned peers)" >&2
  exit 1
fi
if [ ! -d "$HERE/pi/node_modules/@mariozechner/pi-agent-core" ]; then
  bash "$HERE/install-pi.sh"
fi
exec "$PY" "$HERE/conformance.py" "$@"
