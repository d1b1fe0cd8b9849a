#!/usr/bin/env bash
# Install the pinned Pyodide runtime for tests/test_pyodide.py.
#
# The pin lives in tests/pyodide/package.json + package-lock.json (pyodide
# 314.0.8: CPython 3.14, core runtime only). `npm ci` installs exactly the
# locked versions into tests/pyodide/node_modules (git-ignored); npm's own
# cache (~/.npm) makes reinstalls offline and fast. Nothing is done when the
# locked version is already there. Needs node >= 18 and npm.
set -euo pipefail
cd "$(dirname "$0")/../tests/pyodide"

for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "pyodide_setup: $tool not found (apt-get install -y nodejs npm)" >&2; exit 1; }
done
node -e 'const major = +process.versions.node.split(".")[0]; if (major < 18) { console.error(`pyodide_setup: node ${process.versions.node} is too old: Pyodide needs >= 18`); process.exit(1); }'

locked=$(node -p 'require("./package-lock.json").packages["node_modules/pyodide"].version')
installed=$(node -p 'try { require("./node_modules/pyodide/package.json").version } catch { "" }')
if [ "$installed" = "$locked" ]; then
  echo "pyodide_setup: pyodide $installed already in $(pwd)/node_modules"
  exit 0
fi
npm ci --no-audit --no-fund --prefer-offline
echo "pyodide_setup: installed pyodide $locked in $(pwd)/node_modules"
