#!/usr/bin/env bash
# Installs pi-agent-core, pinned in pi/package.json, into examples/conformance/pi/node_modules
# (gitignored). Needs Node 20+ and npm; only the npm registry is contacted.
set -euo pipefail
cd "$(dirname "$0")/pi"
# package-lock.json pins every transitive version; `npm ci` installs exactly it.
npm ci --no-audit --no-fund --loglevel=error
node -e 'const p=require("./node_modules/@mariozechner/pi-agent-core/package.json"); console.log(`${p.name} ${p.version} installed`)'
